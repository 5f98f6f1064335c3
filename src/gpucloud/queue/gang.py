"""Gangs: a job of N nodes runs each attempt on N agents at once, one per slot (slot = node rank).

The decisions live here once, for every backend; the backend only stores slot claims atomically
(``GangStore``). The life of attempt k of an N-node job:

1. **Forming.** The job is QUEUED at k. Agents ``claim_slot``: each takes a slot the queue offers
   (on SQS the slot's own message — one per slot of every attempt; embedded, the oldest job's free
   slots) if it is free (never taken, or its holder's lease ran out). Members renew their slot
   leases while they wait, which keeps their messages hidden; one that waits too long
   ``release_slot``s (the slot and its message are free again, no attempt is lost).
2. **Starting.** When all N slots are held by live leases the gang is formed; every member calls
   ``start_gang``, which claims the *job* for the gang's shared worker id (``gang_worker``): exactly
   one such claim applies (the queue's atomic claim), the others find the job RUNNING for the same
   gang and join. The runner on every member then renews that one job lease.
3. **Losing a member.** A formed gang whose member stopped renewing its slot (killed, node gone)
   cannot go on: its slot comes back as a ``lost`` offer (the message reappears when the lease
   runs out; embedded, the table shows it), and ``fail_over`` ends attempt k as REQUEUED through
   ``end_attempt``, so however many agents notice at once exactly one attempt k+1 exists, and the
   survivors claim its slots.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Collection
from typing import Protocol

from gpucloud.lifecycle.model import AttemptEnd, AttemptState, Job, JobState, SlotClaim, SlotOffer
from gpucloud.lifecycle.transitions import lease_expired
from gpucloud.queue.protocol import GangStore, JobQueue, Transition, UnknownJob, clock_of

TAKE_RETRIES = 4
# Receives one claim makes past other groups' offers: on SQS every group's slot messages share the
# job queue and one receive brings one, so an agent must look past the messages it hands back.
FOREIGN_RECEIVES = 8
GANG_WORKER_PREFIX = "gang:"  # a job lease held by a gang, not by one worker  # another agent took the slot we picked: re-read and pick again


class GangQueue(JobQueue, GangStore, Protocol):
    """A queue backend that also stores gang slots (both shipped backends are)."""


# Whether a worker may take ``job`` at ``now`` (its node group's rule, ``JobSpec.runs_on``).
Accepts = Callable[[Job, float], bool]


def _at(queue: object, now: float | None) -> float:
    """``now``, or the time on the queue's clock (so a queue on a test's clock judges leases by it)."""
    return clock_of(queue)() if now is None else now


def queued_for(job: Job, now: float) -> float:
    """Seconds the QUEUED ``job``'s current attempt has waited: a queued job's ``updated_at`` is
    when that attempt was queued (submit or requeue; nothing else writes a queued job's row)."""
    return max(0.0, now - job.updated_at)


@dataclasses.dataclass(frozen=True)
class GangView:
    """What the stored claims of one attempt say, at one moment (pure)."""

    size: int
    live: tuple[SlotClaim, ...]  # claims whose lease has not run out, by slot
    expired: tuple[SlotClaim, ...]

    @property
    def free_slots(self) -> tuple[int, ...]:
        held = {c.slot for c in self.live}
        return tuple(s for s in range(self.size) if s not in held)

    @property
    def formed(self) -> bool:
        return not self.free_slots

    def held_by(self, worker: str) -> SlotClaim | None:
        return next((c for c in self.live if c.worker == worker), None)

    def rendezvous_address(self) -> str | None:
        """Rank 0's private address: torchrun's rendezvous endpoint."""
        return next((c.address for c in self.live if c.slot == 0), None)


def view(claims: list[SlotClaim], size: int, now: float) -> GangView:
    in_range = [c for c in claims if c.slot < size]
    return GangView(
        size=size,
        live=tuple(sorted((c for c in in_range if c.lease_until >= now), key=lambda c: c.slot)),
        expired=tuple(sorted((c for c in in_range if c.lease_until < now), key=lambda c: c.slot)),
    )


def gang_worker(job_id: str, attempt: int) -> str:
    """The worker id the whole gang holds the job lease under (every member renews it)."""
    return f"{GANG_WORKER_PREFIX}{job_id}:{attempt}"


def claim_slot(
    queue: GangQueue,
    worker: str,
    address: str,
    *,
    lease_seconds: float,
    job_id: str | None = None,
    now: float | None = None,
    skip: Collection[tuple[str, int]] = (),
    skip_delay: float = 0.0,
    accepts: Accepts | None = None,
) -> SlotClaim | None:
    """Take one slot the queue offers (``slot_offers``: an SQS slot message, or the table's free
    slots), or a free slot of exactly ``job_id``.

    Offers of attempts whose holder stopped renewing are failed over on the way (exactly once,
    through ``end_attempt``). A worker that already holds a live slot of the offered attempt gets
    that one back (renewed): an agent that restarts between claiming and starting does not hold
    two slots of one gang. ``skip`` names (job, attempt) pairs not to take now (gangs this worker
    just gave up waiting for); their offers go back for others, shown again after ``skip_delay``.
    ``accepts`` (default: every job) says which jobs this worker's node group may take; offers of
    other jobs go back for the agents of their group, hidden from this one for ``skip_delay``,
    and the worker receives again (a bounded number of times) so its own group's offers behind
    them are reached.
    """
    if job_id is not None:
        job = queue.get(job_id)
        if accepts is not None and not accepts(job, _at(queue, now)):
            return None
        return _claim_in(queue, job, worker, address, lease_seconds, now)
    claimed: SlotClaim | None = None
    for _ in range(FOREIGN_RECEIVES):
        offers = queue.slot_offers(hide_seconds=lease_seconds, now=now)
        foreign = False
        for offer in offers:
            if claimed is not None:
                queue.offer_back(offer)
            elif (offer.job_id, offer.attempt) in skip:
                queue.offer_back(offer, delay_seconds=skip_delay)
            elif offer.lost:
                _fail_over_offer(queue, offer, now)
            else:
                claimed, handed_back = _take_offer(
                    queue, offer, worker, address, lease_seconds, now, accepts, skip_delay
                )
                foreign = foreign or handed_back
        # A table read (embedded) showed every offer at once; a message receive showed one.
        if claimed is not None or not foreign or all(o.ref is None for o in offers):
            return claimed
    return claimed


def _take_offer(
    queue: GangQueue,
    offer: SlotOffer,
    worker: str,
    address: str,
    lease_seconds: float,
    now: float | None,
    accepts: Accepts | None = None,
    foreign_delay: float = 0.0,
) -> tuple[SlotClaim | None, bool]:
    """(the claim, or None; whether the offer was another group's and went back)."""
    try:
        job = queue.get(offer.job_id)
    except UnknownJob:
        queue.offer_done(offer)
        return None, False
    if job.state is not JobState.QUEUED or job.attempt != offer.attempt:
        # Moved on since the offer was read: started (then its members hold their own messages)
        # or superseded. Either way this copy is not needed.
        queue.offer_done(offer)
        return None, False
    at = _at(queue, now)
    if accepts is not None and not accepts(job, at):
        queue.offer_back(offer, delay_seconds=foreign_delay)  # another group's job: for its agents
        return None, True
    current = view(queue.slot_claims(job.id, job.attempt), job.spec.nodes, at)
    mine = current.held_by(worker)
    if mine is not None and mine.slot != offer.slot:
        queue.offer_back(offer)
        renewed = mine.model_copy(update={"lease_until": at + lease_seconds})
        kept = queue.renew_slot(job.id, job.attempt, mine.slot, worker, lease_until=renewed.lease_until)
        return (renewed if kept else None), False
    claim = SlotClaim(
        job_id=job.id,
        attempt=job.attempt,
        slot=offer.slot,
        worker=worker,
        address=address,
        lease_until=at + lease_seconds,
    )
    if queue.take_slot(claim, now=at, offer=offer):
        return claim, False
    queue.offer_back(offer)  # a live holder has it: the next receiver sees that and decides
    return None, False


def _fail_over_offer(queue: GangQueue, offer: SlotOffer, now: float | None) -> None:
    try:
        job = queue.get(offer.job_id)
    except UnknownJob:
        queue.offer_done(offer)
        return
    if job.state is JobState.RUNNING and job.attempt == offer.attempt and fail_over(queue, job, now=now) is None:
        queue.offer_back(offer)  # the holder renewed after all: its message goes back to it
        return
    queue.offer_done(offer)


def _claim_in(
    queue: GangQueue, job: Job, worker: str, address: str, lease_seconds: float, now: float | None
) -> SlotClaim | None:
    """The lowest free slot of ``job``'s queued attempt, read from the table (or this worker's own)."""
    if job.state is not JobState.QUEUED:
        return None
    for _ in range(TAKE_RETRIES):
        at = _at(queue, now)
        current = view(queue.slot_claims(job.id, job.attempt), job.spec.nodes, at)
        mine = current.held_by(worker)
        slot = mine.slot if mine is not None else (current.free_slots[0] if current.free_slots else None)
        if slot is None:
            return None  # gang full
        claim = SlotClaim(
            job_id=job.id,
            attempt=job.attempt,
            slot=slot,
            worker=worker,
            address=address,
            lease_until=at + lease_seconds,
        )
        if queue.take_slot(claim, now=at):
            return claim
    return None


def members(queue: GangQueue, job: Job, attempt: int, *, now: float | None = None) -> list[SlotClaim] | None:
    """The members of attempt ``attempt`` by slot once all ``job.spec.nodes`` slots are held; else None."""
    current = view(queue.slot_claims(job.id, attempt), job.spec.nodes, _at(queue, now))
    return list(current.live) if current.formed else None


def start_gang(queue: GangQueue, claim: SlotClaim, *, lease_seconds: float) -> Job | None:
    """Move the job to RUNNING for the gang of ``claim`` (exactly one member's call applies; the
    others join). None: the attempt is no longer this gang's (ended, or taken over)."""
    worker = gang_worker(claim.job_id, claim.attempt)
    started = queue.claim(
        worker, lease_seconds=lease_seconds, job_id=claim.job_id, node=claim.address, attempt=claim.attempt
    )
    if started is not None:
        return started if started.attempt == claim.attempt else None
    job = queue.get(claim.job_id)
    if job.state is JobState.RUNNING and job.attempt == claim.attempt and job.worker == worker:
        return job
    return None


def renew(queue: GangQueue, claim: SlotClaim, *, lease_seconds: float) -> bool:
    return queue.renew_slot(
        claim.job_id, claim.attempt, claim.slot, claim.worker, lease_until=clock_of(queue)() + lease_seconds
    )


def release(queue: GangQueue, claim: SlotClaim) -> bool:
    """Give the slot up while the gang has not started (False: it started; join it instead)."""
    return queue.release_slot(claim.job_id, claim.attempt, claim.slot, claim.worker)


def lost_member(queue: GangQueue, job: Job, *, now: float | None = None) -> int | None:
    """The first slot of ``job``'s running attempt that has no live holder (None: all alive).

    A gang attempt (every agent-run one) is judged by its slot leases; an attempt a single
    ``gpucloud worker`` holds, by its job lease (slot 0)."""
    if job.state is not JobState.RUNNING:
        return None
    at = _at(queue, now)
    if job.worker != gang_worker(job.id, job.attempt):
        return 0 if lease_expired(job, at) else None
    current = view(queue.slot_claims(job.id, job.attempt), job.spec.nodes, at)
    return current.free_slots[0] if current.free_slots else None


def fail_over(queue: GangQueue, job: Job, *, now: float | None = None) -> Transition | None:
    """Requeue ``job``'s running attempt as k+1 when a member (or its single worker) is lost
    (exactly once, through ``end_attempt``); None when every member is alive."""
    slot = lost_member(queue, job, now=now)
    if slot is None:
        return None
    who = f"gang member of slot {slot}" if job.worker == gang_worker(job.id, job.attempt) else f"worker {job.worker}"
    end = AttemptEnd(state=AttemptState.REQUEUED, reason=f"{who} stopped renewing its lease")
    transition = queue.end_attempt(job.id, job.attempt, end)
    if transition.applied:
        queue.record(job.id, job.attempt, "lease-expired", data={"slot": slot})
    return transition
