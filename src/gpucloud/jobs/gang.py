"""Gangs: a job of N nodes runs each attempt on N agents at once, one per slot (slot = node rank).

The decisions live here once, for every backend; the backend only stores slot claims atomically
(``GangStore``). The life of attempt k of an N-node job:

1. **Forming.** The job is QUEUED at k. Agents ``claim_slot``: each takes the lowest free slot of
   the oldest job with one (free: never taken, or its holder's lease ran out). Members renew their
   slot leases while they wait; one that waits too long ``release_slot``s (the slot is free again,
   no attempt is lost).
2. **Starting.** When all N slots are held by live leases the gang is formed; every member calls
   ``start_gang``, which claims the *job* for the gang's shared worker id (``gang_worker``): exactly
   one such claim applies (the queue's atomic claim), the others find the job RUNNING for the same
   gang and join. The runner on every member then renews that one job lease.
3. **Losing a member.** A formed gang whose member stopped renewing its slot (killed, node gone)
   cannot go on: ``fail_over`` ends attempt k as REQUEUED through ``end_attempt``, so however many
   members notice at once exactly one attempt k+1 exists, and the survivors claim its slots.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Collection, Protocol

from gpucloud.jobs.model import AttemptEnd, AttemptState, Job, JobState, SlotClaim
from gpucloud.jobs.queue import GangStore, JobQueue, Transition

TAKE_RETRIES = 4  # another agent took the slot we picked: re-read and pick again


class GangQueue(JobQueue, GangStore, Protocol):
    """A queue backend that also stores gang slots (both shipped backends are)."""


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
    return f"gang:{job_id}:{attempt}"


def claim_slot(
    queue: GangQueue, worker: str, address: str, *, lease_seconds: float, job_id: str | None = None,
    now: float | None = None, skip: Collection[tuple[str, int]] = (),
) -> SlotClaim | None:
    """Take one free slot of the oldest QUEUED job that has one (or of exactly ``job_id``).

    A worker that already holds a live slot of that attempt gets it back (renewed): an agent that
    restarts between claiming and starting does not hold two slots of one gang. ``skip`` names
    (job, attempt) pairs not to take now (gangs this worker just gave up waiting for).
    """
    candidates = [queue.get(job_id)] if job_id is not None else queue.list_jobs([JobState.QUEUED])
    for job in candidates:
        if job.state is not JobState.QUEUED or (job.id, job.attempt) in skip:
            continue
        for _ in range(TAKE_RETRIES):
            at = time.time() if now is None else now
            current = view(queue.slot_claims(job.id, job.attempt), job.spec.nodes, at)
            mine = current.held_by(worker)
            slot = mine.slot if mine is not None else (current.free_slots[0] if current.free_slots else None)
            if slot is None:
                break  # gang full: the next job
            claim = SlotClaim(job_id=job.id, attempt=job.attempt, slot=slot, worker=worker, address=address,
                              lease_until=at + lease_seconds)
            if queue.take_slot(claim, now=at):
                return claim
    return None


def members(queue: GangQueue, job: Job, attempt: int, *, now: float | None = None) -> list[SlotClaim] | None:
    """The members of attempt ``attempt`` by slot once all ``job.spec.nodes`` slots are held; else None."""
    current = view(queue.slot_claims(job.id, attempt), job.spec.nodes, time.time() if now is None else now)
    return list(current.live) if current.formed else None


def start_gang(queue: GangQueue, claim: SlotClaim, *, lease_seconds: float) -> Job | None:
    """Move the job to RUNNING for the gang of ``claim`` (exactly one member's call applies; the
    others join). None: the attempt is no longer this gang's (ended, or taken over)."""
    worker = gang_worker(claim.job_id, claim.attempt)
    started = queue.claim(worker, lease_seconds=lease_seconds, job_id=claim.job_id, node=claim.address,
                          attempt=claim.attempt)
    if started is not None:
        return started if started.attempt == claim.attempt else None
    job = queue.get(claim.job_id)
    if job.state is JobState.RUNNING and job.attempt == claim.attempt and job.worker == worker:
        return job
    return None


def renew(queue: GangQueue, claim: SlotClaim, *, lease_seconds: float) -> bool:
    return queue.renew_slot(claim.job_id, claim.attempt, claim.slot, claim.worker,
                            lease_until=time.time() + lease_seconds)


def release(queue: GangQueue, claim: SlotClaim) -> bool:
    """Give the slot up while the gang has not started (False: it started; join it instead)."""
    return queue.release_slot(claim.job_id, claim.attempt, claim.slot, claim.worker)


def lost_member(queue: GangQueue, job: Job, *, now: float | None = None) -> int | None:
    """The first slot of ``job``'s running gang attempt that has no live holder (None: all alive)."""
    if job.state is not JobState.RUNNING or job.worker != gang_worker(job.id, job.attempt):
        return None
    current = view(queue.slot_claims(job.id, job.attempt), job.spec.nodes, time.time() if now is None else now)
    return current.free_slots[0] if current.free_slots else None


def fail_over(queue: GangQueue, job: Job, *, now: float | None = None) -> Transition | None:
    """Requeue ``job``'s running gang attempt as k+1 when a member is lost (exactly once, through
    ``end_attempt``); None when every member is alive."""
    slot = lost_member(queue, job, now=now)
    if slot is None:
        return None
    end = AttemptEnd(state=AttemptState.REQUEUED, reason=f"gang member of slot {slot} stopped renewing its lease")
    transition = queue.end_attempt(job.id, job.attempt, end)
    if transition.applied:
        queue.record(job.id, job.attempt, "lease-expired", data={"slot": slot})
    return transition


def fail_over_lost_gangs(queue: GangQueue, *, now: float | None = None) -> list[Transition]:
    """``fail_over`` every running gang with a lost member; what an idle agent sweeps."""
    applied = []
    for job in queue.list_jobs([JobState.RUNNING]):
        transition = fail_over(queue, job, now=now)
        if transition is not None and transition.applied:
            applied.append(transition)
    return applied
