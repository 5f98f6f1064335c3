"""The job state machine: what a request (claim, heartbeat, end, cancel, resume, stop) changes.

Every function here is pure: it takes the job as a store read it, the request and ``now``, and
returns either the ``Change`` to store or a ``Refusal`` saying why the request does not apply. It
reads no clock and writes nothing. A store (the SQLite file, the DynamoDB table) writes the change
in one atomic step, conditional on ``Change.guard`` (the job still as it was read) and on
``AttemptChange.was`` (the attempt row still in the state the change leaves): of any number of
racing or repeated requests exactly one commits, and at most one attempt k+1 is ever created.

Field names are the model's (``Job``, ``Attempt``); a value of None clears the field. A store maps
them to its own columns or attributes and adds only what is its own (SQS message handles).
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Mapping
from typing import Any

from gpucloud.lifecycle.model import (
    EVENT_KINDS,
    AttemptEnd,
    AttemptState,
    Job,
    JobSpec,
    JobState,
    Progress,
    StopRequest,
    cancel_notice,
    cancel_reason,
    cancelled_end,
    resume_refusal,
)
from gpucloud.signals.events import Notice


class Outcome(str, enum.Enum):
    """What a change does, in one word (tests and stores branch on it, never on field values)."""

    SUBMITTED = "submitted"
    CLAIMED = "claimed"  # a queued attempt goes to a worker
    TAKEN_OVER = "taken-over"  # a dead holder's attempt is lost; the claimer runs attempt k+1
    LOST_CANCELLED = "lost-cancelled"  # a cancelled job's holder died: the job ends CANCELLED, nobody runs it
    RENEWED = "renewed"
    REQUEUED = "requeued"  # attempt k+1 is queued (a notice, or a crash with attempts left)
    FINISHED = "finished"
    FAILED = "failed"
    CANCELLED = "cancelled"
    CANCEL_REQUESTED = "cancel-requested"  # a running attempt is asked to save and stop
    RESUMED = "resumed"
    STOP_REQUESTED = "stop-requested"

    @property
    def claims(self) -> bool:
        """Whether the requester now holds the job."""
        return self in (Outcome.CLAIMED, Outcome.TAKEN_OVER)


@dataclasses.dataclass(frozen=True)
class Guard:
    """What the store must still find on the job, atomically with the write, for the change to apply."""

    state: JobState
    attempt: int
    worker: str | None = None  # the holder must be this worker
    lease_expired_at: float | None = None  # the stored lease must have ended before this time


@dataclasses.dataclass(frozen=True)
class AttemptChange:
    """Fields set on attempt ``number``, conditional on the attempt being ``was`` (the exactly-once gate)."""

    number: int
    was: AttemptState
    fields: Mapping[str, Any]


@dataclasses.dataclass(frozen=True)
class NewAttempt:
    """An attempt row created by the change, conditional on no attempt ``number`` existing yet."""

    number: int
    state: AttemptState
    created_at: float
    worker: str | None = None
    node: str | None = None


@dataclasses.dataclass(frozen=True)
class NewEvent:
    attempt: int
    kind: str
    at: float
    data: Mapping[str, Any]

    def __post_init__(self) -> None:
        if self.kind not in EVENT_KINDS:
            raise ValueError(f"unknown timeline event {self.kind!r}; expected one of {', '.join(EVENT_KINDS)}")


@dataclasses.dataclass(frozen=True)
class StopRecord:
    """A stop request stored on ``attempt`` only if that attempt has none yet (the first one stands);
    its ``stop-request`` event is appended only when it is stored."""

    attempt: int
    request: StopRequest

    @property
    def event(self) -> NewEvent:
        return NewEvent(self.attempt, "stop-request", self.request.requested_at, self.request.timeline_data())


@dataclasses.dataclass(frozen=True)
class Change:
    outcome: Outcome
    guard: Guard
    job: Mapping[str, Any] = dataclasses.field(default_factory=dict)  # job fields to set
    attempt: AttemptChange | None = None
    new_attempt: NewAttempt | None = None
    events: tuple[NewEvent, ...] = ()
    stop: StopRecord | None = None
    releases_slots: bool = False  # the ended attempt's gang slots are given up


@dataclasses.dataclass(frozen=True)
class Refusal:
    """Why a request does not apply. ``error``: the caller asked for something the job cannot do
    (a user mistake, said in ``reason``); otherwise there is simply nothing to change (a duplicate,
    a stale attempt, a lost race)."""

    reason: str
    error: bool = False


# ------------------------------------------------------------------------------------------ leases


def lease_expired(job: Job, now: float) -> bool:
    """A running job whose holder stopped renewing: its lease ended before ``now``."""
    return job.state is JobState.RUNNING and job.lease_until is not None and job.lease_until < now


def _released(now: float) -> dict[str, Any]:
    """A job's fields once no attempt holds it: no worker, no lease, no step rate."""
    return {"worker": None, "lease_until": None, "step_rate": None, "updated_at": now}


# ------------------------------------------------------------------------------------- transitions


def submit(job_id: str, spec: JobSpec, now: float) -> tuple[Job, Change]:
    """A new job, QUEUED at attempt 1 (the store creates it only if no job ``job_id`` exists)."""
    job = Job(id=job_id, spec=spec, state=JobState.QUEUED, attempt=1, created_at=now, updated_at=now)
    return job, Change(
        Outcome.SUBMITTED,
        Guard(JobState.QUEUED, 1),
        new_attempt=NewAttempt(1, AttemptState.QUEUED, now),
        events=(NewEvent(1, "submitted", now, {"command": list(spec.command)}),),
    )


def claim(
    job: Job, worker: str, *, lease_seconds: float, node: str | None, now: float, attempt: int | None = None
) -> Change | Refusal:
    """``worker`` takes ``job``: its queued attempt, or attempt k+1 when the holder's lease ended.

    With ``attempt``, only that attempt while queued (a gang member formed for attempt k never
    starts k+1). A cancelled job whose holder died is not taken: it ends CANCELLED
    (``Outcome.LOST_CANCELLED``, which does not claim)."""
    if attempt is not None and (job.state is not JobState.QUEUED or job.attempt != attempt):
        return Refusal(f"job {job.id} is {job.state.value} at attempt {job.attempt}, not queued at attempt {attempt}")
    holder = {"worker": worker, "lease_until": now + lease_seconds, "updated_at": now, "step_rate": None}
    claimed_at = NewEvent(job.attempt, "claimed", now, {"worker": worker, "node": node})
    if job.state is JobState.QUEUED:
        return Change(
            Outcome.CLAIMED,
            Guard(JobState.QUEUED, job.attempt),
            job={"state": JobState.RUNNING, **holder},
            attempt=AttemptChange(
                job.attempt, AttemptState.QUEUED, {"state": AttemptState.RUNNING, "worker": worker, "node": node}
            ),
            events=(claimed_at,),
        )
    if not lease_expired(job, now):
        return Refusal(f"job {job.id} is {job.state.value}" + (" and its lease is live" if job.lease_until else ""))
    if job.cancel_requested_at is not None:
        return _lost_cancelled(job, now)
    number = job.attempt + 1
    return Change(
        Outcome.TAKEN_OVER,
        Guard(JobState.RUNNING, job.attempt, lease_expired_at=now),
        job={"attempt": number, **holder},
        attempt=AttemptChange(
            job.attempt,
            AttemptState.RUNNING,
            {"state": AttemptState.LOST, "ended_at": now, "reason": f"lease of worker {job.worker} expired"},
        ),
        new_attempt=NewAttempt(number, AttemptState.RUNNING, now, worker=worker, node=node),
        events=(
            NewEvent(job.attempt, "lease-expired", now, {"worker": job.worker}),
            dataclasses.replace(claimed_at, attempt=number),
        ),
    )


def heartbeat(
    attempt: int, worker: str, *, lease_seconds: float, now: float, progress: Progress | None = None
) -> Change:
    """``worker`` renews its lease on ``attempt`` (and stores its progress in the same write). The
    guard is the whole decision, so a store renews without reading the job first."""
    fields: dict[str, Any] = {"lease_until": now + lease_seconds, "updated_at": now}
    if progress is not None:
        fields.update(last_step=progress.last_step, step_rate=progress.step_rate, progress_at=progress.progress_at)
    return Change(Outcome.RENEWED, Guard(JobState.RUNNING, attempt, worker=worker), job=fields)


def crash_reason(reason: str | None, attempt: int, crashes: int, max_attempts: int) -> str:
    """Why a job whose attempts kept crashing is FAILED."""
    return f"{reason or 'failed'} (attempt {attempt}; {crashes} of {max_attempts} allowed attempts crashed)"


def end(job: Job, attempt: int, how: AttemptEnd, now: float) -> Change | Refusal:
    """End running attempt ``attempt`` as the supervisor saw it.

    REQUEUED or CRASHED with attempts left: attempt k+1 is queued. CRASHED without: the job FAILED.
    FINISHED / FAILED: the job ends so. A job with a cancel requested ends CANCELLED whatever the
    end (FINISHED aside), and never gets attempt k+1."""
    if job.state is not JobState.RUNNING or job.attempt != attempt:
        return Refusal(
            f"attempt {attempt} of job {job.id} is not running (the job is {job.state.value} at attempt {job.attempt})"
        )
    crashes = job.crashes + (1 if how.state is AttemptState.CRASHED else 0)
    ended: dict[str, Any] = {
        "state": how.state,
        "ended_at": now,
        "exit_code": how.exit_code,
        "committed_step": how.committed_step,
        "reason": how.reason,
    }
    # The attempt's last and resumed step stay as recorded (``update_attempt``) unless the end knows better.
    if how.last_step is not None:
        ended["last_step"] = how.last_step
    if how.resumed_step is not None:
        ended["resumed_step"] = how.resumed_step
    released = _released(now)
    if how.last_step is not None:
        released["last_step"] = how.last_step  # the job keeps the attempt's last step; its rate ends with it
    guard = Guard(JobState.RUNNING, attempt)
    events: tuple[NewEvent, ...]
    new_attempt = None
    if job.cancel_requested_at is not None and cancelled_end(how):
        why = cancel_reason(job)
        ended.update(state=AttemptState.CANCELLED, reason=how.reason or why)
        outcome = Outcome.CANCELLED
        fields = {"state": JobState.CANCELLED, "reason": why, "exit_code": how.exit_code}
        events = (NewEvent(attempt, "cancelled", now, {"step": how.last_step, "reason": why}),)
    elif how.state in (AttemptState.REQUEUED, AttemptState.CRASHED) and crashes < job.spec.max_attempts:
        outcome = Outcome.REQUEUED
        fields = {"state": JobState.QUEUED, "attempt": attempt + 1, "crashes": crashes}
        new_attempt = NewAttempt(attempt + 1, AttemptState.QUEUED, now)
        data = {"next_attempt": attempt + 1, "reason": how.reason, "from_step": how.resume_from}
        events = (NewEvent(attempt, "requeue", now, data),)
    elif how.state is AttemptState.FINISHED:
        outcome = Outcome.FINISHED
        fields = {"state": JobState.FINISHED, "exit_code": how.exit_code}
        events = (NewEvent(attempt, "finish", now, {"step": how.last_step}),)
    else:
        outcome = Outcome.FAILED
        why = how.reason or "failed"
        if how.state is AttemptState.CRASHED:
            why = crash_reason(how.reason, attempt, crashes, job.spec.max_attempts)
            ended["state"] = AttemptState.FAILED
        fields = {"state": JobState.FAILED, "crashes": crashes, "reason": why, "exit_code": how.exit_code}
        events = (NewEvent(attempt, "failed", now, {"reason": why, "exit_code": how.exit_code}),)
    return Change(
        outcome,
        guard,
        job={**fields, **released},
        attempt=AttemptChange(attempt, AttemptState.RUNNING, ended),
        new_attempt=new_attempt,
        events=events,
        releases_slots=outcome is Outcome.CANCELLED,
    )


def _cancelled_fields(job: Job, now: float) -> dict[str, Any]:
    return {"state": JobState.CANCELLED, "reason": cancel_reason(job), "exit_code": None, **_released(now)}


def _lost_cancelled(job: Job, now: float, *asked: NewEvent) -> Change:
    """A cancelled RUNNING job whose holder stopped renewing: the attempt ends, the job CANCELLED."""
    return Change(
        Outcome.LOST_CANCELLED,
        Guard(JobState.RUNNING, job.attempt, lease_expired_at=now),
        job=_cancelled_fields(job, now),
        attempt=AttemptChange(
            job.attempt,
            AttemptState.RUNNING,
            {
                "state": AttemptState.CANCELLED,
                "ended_at": now,
                "reason": f"lease of worker {job.worker} expired after the cancel",
            },
        ),
        events=(
            *asked,
            NewEvent(job.attempt, "lease-expired", now, {"worker": job.worker}),
            NewEvent(job.attempt, "cancelled", now, {"step": None, "reason": cancel_reason(job)}),
        ),
        releases_slots=True,
    )


def not_cancellable(job: Job) -> str:
    return f"job {job.id} is already {job.state.value}; there is nothing to cancel"


def cancel(job: Job, *, grace_seconds: float, now: float) -> Change | Refusal:
    """``gpucloud job cancel``. QUEUED: the job and its attempt end CANCELLED now. RUNNING: the
    cancel is flagged and a stop request with a ``grace_seconds`` deadline asks the ranks to save
    (a stop already requested stands); a running job nobody holds any more ends CANCELLED now.
    Already cancelled (or cancelling): nothing to change. FINISHED or FAILED: a user error."""
    if job.state is JobState.CANCELLED or job.cancel_requested_at is not None:
        return Refusal(f"job {job.id} is already {'cancelled' if job.state.terminal else 'cancelling'}")
    if job.state.terminal:
        return Refusal(not_cancellable(job), error=True)
    asked = NewEvent(job.attempt, "cancel", now, {"state": job.state.value, "grace_s": grace_seconds})
    if job.state is JobState.QUEUED:
        why = cancel_reason(job)
        return Change(
            Outcome.CANCELLED,
            Guard(JobState.QUEUED, job.attempt),
            job=_cancelled_fields(job, now),
            attempt=AttemptChange(
                job.attempt, AttemptState.QUEUED, {"state": AttemptState.CANCELLED, "ended_at": now, "reason": why}
            ),
            events=(asked, NewEvent(job.attempt, "cancelled", now, {"step": None, "reason": why})),
            releases_slots=True,
        )
    if lease_expired(job, now):
        return _lost_cancelled(job, now, asked)  # nobody holds it any more: nothing to stop
    notice = cancel_notice(job.id, job.attempt, now=now, grace_seconds=grace_seconds)
    return Change(
        Outcome.CANCEL_REQUESTED,
        Guard(JobState.RUNNING, job.attempt),
        job={"cancel_requested_at": now, "updated_at": now},
        events=(asked,),
        stop=StopRecord(job.attempt, StopRequest.of(notice, requested_at=now)),
    )


def resume(job: Job, *, from_step: int | None, now: float) -> Change | Refusal:
    """``gpucloud job resume``: attempt k+1 of a FAILED or CANCELLED job, with a fresh crash count."""
    why = resume_refusal(job)
    if why is not None:
        return Refusal(why, error=True)
    number = job.attempt + 1
    return Change(
        Outcome.RESUMED,
        Guard(job.state, job.attempt),
        job={
            "state": JobState.QUEUED,
            "attempt": number,
            "crashes": 0,
            "reason": None,
            "exit_code": None,
            "cancel_requested_at": None,
            "worker": None,
            "lease_until": None,
            "updated_at": now,
        },
        new_attempt=NewAttempt(number, AttemptState.QUEUED, now),
        events=(
            NewEvent(
                job.attempt, "resubmit", now, {"was": job.state.value, "next_attempt": number, "from_step": from_step}
            ),
        ),
    )


def request_stop(attempt: int, notice: Notice, *, now: float) -> Change:
    """Record ``notice`` on running attempt ``attempt`` (the first request per attempt stands). The
    guard is the whole decision, so a store writes it without reading the job first."""
    return Change(
        Outcome.STOP_REQUESTED,
        Guard(JobState.RUNNING, attempt),
        stop=StopRecord(attempt, StopRequest.of(notice, requested_at=now)),
    )
