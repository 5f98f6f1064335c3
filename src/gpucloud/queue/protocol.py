"""The job-queue protocol every backend implements (embedded SQLite now, SQS + DynamoDB later).

The protocol is deliberately small. Its hard guarantees, which ``tests/jobqueue/test_queue_contract.py``
checks against every backend:

* ``claim`` is atomic: one job attempt goes to exactly one worker, which holds a lease it renews
  with ``heartbeat``; when the lease runs out the job can be claimed again (the dead worker's
  attempt becomes LOST and the claimer gets attempt k+1).
* ``end_attempt`` is a conditional transition on (job, attempt): however many duplicate notices,
  repeated calls or racing processes end attempt k, exactly one call applies and at most one
  attempt k+1 exists. Requeue is ``end_attempt`` with state REQUEUED.
* the timeline is append-only; events carry the time they happened (``at``), not the time they
  were written, so latencies measured from control-file timestamps stay exact.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Iterable
from typing import Any, Protocol

from gpucloud.errors import UserError
from gpucloud.lifecycle.model import (
    CANCEL_GRACE_S,
    Attempt,
    AttemptEnd,
    Event,
    Job,
    JobSpec,
    JobState,
    NodeRecord,
    Progress,
    SlotClaim,
    SlotOffer,
)
from gpucloud.lifecycle.transitions import not_cancellable
from gpucloud.signals.events import Notice


class NotCancellable(UserError):
    def __init__(self, job: Job, why: str | None = None) -> None:
        super().__init__(why or not_cancellable(job))
        self.job = job


class NotResumable(UserError):
    def __init__(self, job: Job, why: str) -> None:
        super().__init__(why)
        self.job = job


class UnknownJob(UserError):
    def __init__(self, job_id: str, queue_uri: str) -> None:
        super().__init__(f"no job {job_id!r} in queue {queue_uri} (list them with `gpucloud jobs`)")
        self.job_id = job_id


@dataclasses.dataclass(frozen=True)
class Transition:
    """The outcome of ``end_attempt``: the job afterwards, and whether this call changed it."""

    job: Job
    applied: bool  # False: attempt k had already ended (a duplicate or a lost race)


def clock_of(queue: object) -> Callable[[], float]:
    """The clock ``queue`` judges leases by: a backend's ``clock`` (each takes one, the wall clock by
    default, so tests run leases out on a fake one), else the wall clock."""
    clock = getattr(queue, "clock", None)
    return clock if callable(clock) else time.time


class JobQueue(Protocol):
    uri: str

    def submit(self, spec: JobSpec, *, job_id: str | None = None) -> Job:
        """Record a new QUEUED job with attempt 1; ``job_id`` defaults to a fresh unique id."""
        ...

    def get(self, job_id: str) -> Job:
        """The job, or ``UnknownJob``."""
        ...

    def list_jobs(self, states: Iterable[JobState] | None = None) -> list[Job]:
        """Jobs, oldest first, optionally only those in ``states``."""
        ...

    def claim(
        self,
        worker: str,
        *,
        lease_seconds: float,
        job_id: str | None = None,
        node: str | None = None,
        attempt: int | None = None,
    ) -> Job | None:
        """Atomically take the oldest claimable job (or exactly ``job_id``) for ``worker``.

        Claimable: QUEUED, or RUNNING with an expired lease. Returns the RUNNING job, or None.
        Without ``job_id`` only jobs of one node that no gang holds are taken: a gang (and an
        agent's gang of one) is formed and failed over through slots (``jobs.gang``), and one
        worker running an N-node job would start every rank on a single node.
        With ``attempt`` (and ``job_id``) only that attempt, QUEUED, is taken — never a later one:
        a gang member that formed for attempt k must not start attempt k+1.
        """
        ...

    def heartbeat(
        self, job_id: str, attempt: int, worker: str, *, lease_seconds: float, progress: Progress | None = None
    ) -> bool:
        """Extend the lease; False when ``worker`` no longer holds attempt ``attempt``.

        With ``progress``, the same write stores it on the job (``last_step``, ``step_rate``,
        ``progress_at``): live progress costs no write of its own. ``end_attempt`` keeps the
        attempt's last step on the job and drops the rate; a claim drops the rate too.
        """
        ...

    def record(
        self, job_id: str, attempt: int, kind: str, *, at: float | None = None, data: dict[str, Any] | None = None
    ) -> None:
        """Append one timeline event (``kind`` from ``model.EVENT_KINDS``)."""
        ...

    def update_attempt(self, job_id: str, attempt: int, **fields: Any) -> None:
        """Set observed facts on a running attempt (``started_at``, ``resumed_step``, ``last_step``)."""
        ...

    def end_attempt(self, job_id: str, attempt: int, end: AttemptEnd) -> Transition:
        """End the RUNNING attempt ``attempt`` exactly once.

        REQUEUED: attempt k+1 is queued. CRASHED: attempt k+1 is queued while crashes < max_attempts,
        else the job is FAILED with ``end.reason``. FINISHED / FAILED: the job ends so. A job with a
        cancel requested ends CANCELLED whatever the end (FINISHED aside): no attempt k+1.
        """
        ...

    def attempts(self, job_id: str) -> list[Attempt]: ...

    def events(self, job_id: str) -> list[Event]:
        """The timeline in the order things happened (by ``at``; ties in recording order)."""
        ...

    def histories(self, states: Iterable[JobState] | None = None) -> list[tuple[Job, list[Attempt], list[Event]]]:
        """``list_jobs(states)``, each job with its ``attempts`` and ``events`` (in their orders),
        in a number of reads that does not grow with the number of jobs (``gpucloud jobs`` prices
        every job it lists; ``attempts`` and ``events`` per job would be reads per job)."""
        ...

    def request_stop(self, job_id: str, attempt: int, notice: Notice) -> bool:
        """Record stop notice ``notice`` on attempt ``attempt`` so every gang member's supervisor
        stops its ranks (``stop_request``), and add a ``stop-request`` timeline event.

        Applies only while the job is RUNNING at ``attempt``, and once: of any number of racing or
        repeated requests exactly one returns True; the rest (and any for an attempt that is not
        running) return False and change nothing. ``UnknownJob`` when there is no such job.
        """
        ...

    def stop_request(self, job_id: str, attempt: int) -> Notice | None:
        """The notice a stop was requested with for attempt ``attempt`` (a consistent read, cheap
        enough to poll every second); None when none was (or there is no such job)."""
        ...

    def cancel(self, job_id: str, *, grace_seconds: float = CANCEL_GRACE_S) -> Job:
        """Cancel the job (``gpucloud job cancel``); the job afterwards.

        QUEUED: the job and its attempt end CANCELLED at once (the attempt never runs; its gang
        slots are released). RUNNING: ``cancel_requested_at`` is set and a stop request with a
        deadline ``grace_seconds`` away is recorded on the attempt (``request_stop``), so its
        ranks save a step; whatever then ends the attempt (``end_attempt``, or a takeover of its
        expired lease) ends the job CANCELLED and never queues another attempt. CANCELLED (or
        RUNNING with a cancel requested): unchanged, so a repeated cancel is harmless. FINISHED
        or FAILED: ``UserError``. ``UnknownJob`` when there is no such job.
        """
        ...

    def resume(self, job_id: str, *, from_step: int | None = None) -> Job:
        """Queue attempt k+1 of a FAILED or CANCELLED job (``gpucloud job resume``), keeping its id,
        so the attempt restores the job's newest committed checkpoint; the crash count starts again
        (a fresh ``max_attempts``), reason and cancel request are cleared. ``from_step`` is only
        recorded (the ``resubmit`` event). Conditional on the job still being in the state read,
        so of racing resumes exactly one queues an attempt. Any other state: ``UserError`` with
        ``model.resume_refusal``'s line. ``UnknownJob`` when there is no such job.
        """
        ...

    def close(self) -> None: ...


class GangStore(Protocol):
    """Slot claims of gang attempts and the agents' node records: the storage half of
    ``gpucloud.queue.gang`` (which holds the decisions, once, for every backend).

    Guarantees (``tests/jobqueue/test_queue_contract.py``): ``take_slot`` and ``release_slot`` are
    atomic with the check that the job is still QUEUED at that attempt, so no slot changes hands
    once its gang has started; of racing takers of one slot exactly one succeeds.
    """

    def slot_offers(self, *, hide_seconds: float, now: float | None = None) -> list[SlotOffer]:
        """Slots that may need a worker now, oldest job first: free slots of queued attempts, and
        (``lost``) slots of running gang attempts whose holder stopped renewing. On SQS this is a
        receive of the slot messages, kept hidden for ``hide_seconds`` (the table is read only for
        strays); embedded, a read of the table. Leases are judged at ``now`` (default: the clock).
        An offer is a hint: ``take_slot`` and ``end_attempt`` decide."""
        ...

    def offer_done(self, offer: SlotOffer) -> None:
        """The offer needs nobody any more (failed over, or found stale): drop its message."""
        ...

    def offer_back(self, offer: SlotOffer, *, delay_seconds: float = 0.0) -> None:
        """Not taken by this worker: let another receive it, after ``delay_seconds``."""
        ...

    def take_slot(self, claim: SlotClaim, *, now: float, offer: SlotOffer | None = None) -> bool:
        """Store ``claim`` if the job is QUEUED at ``claim.attempt`` and the slot is free (never
        taken, or its lease ended before ``now``) or already ``claim.worker``'s. With the ``offer``
        that brought it, the holder keeps the offer's message hidden while it renews the slot."""
        ...

    def renew_slot(self, job_id: str, attempt: int, slot: int, worker: str, *, lease_until: float) -> bool:
        """Extend ``worker``'s lease on the slot; False when it no longer holds it."""
        ...

    def release_slot(self, job_id: str, attempt: int, slot: int, worker: str) -> bool:
        """Give the slot up while the job is still QUEUED at ``attempt``; False when the gang has
        started meanwhile (or ``worker`` did not hold it). Its message becomes visible again."""
        ...

    def slot_claims(self, job_id: str, attempt: int) -> list[SlotClaim]:
        """Every stored claim of the attempt, by slot (expired ones included)."""
        ...

    def register_node(self, node: NodeRecord) -> None:
        """Insert or replace the record of agent ``node.id``."""
        ...

    def nodes(self) -> list[NodeRecord]:
        """Every agent's last record, by id."""
        ...
