"""Jobs, attempts and timeline events: the records every queue backend stores.

A *job* is one training run the user asked for. It runs as a sequence of *attempts*: attempt 1
starts from scratch (or the newest committed checkpoint), each later attempt resumes from the
checkpoint its predecessor committed. The *timeline* is the append-only list of events with
timestamps from which ``gpucloud job show`` derives latencies, steps lost and GPU-hours.
"""

from __future__ import annotations

import dataclasses
import enum
import re
from typing import Any, cast

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from gpucloud.errors import UserError
from gpucloud.signals.events import STOP_KINDS, Notice, NoticeKind

# Node group names, as the stack spec allows them (``spec/rules.py`` NAME_RE).
GROUP_NAME_RE = re.compile(r"[a-z][a-z0-9-]{0,19}")
GROUP_NAME_RULE = "a lower-case letter, then up to 19 of lower-case letters, digits and '-'"
# Spot co-interruptions in one instance type and AZ came within 3 minutes in over 92% of 2,635
# interruptions (arXiv 2604.16457): waiting this long means the pool is not coming back soon.
DEFAULT_FALLBACK_AFTER_MINUTES = 10.0


class JobState(str, enum.Enum):
    QUEUED = "queued"  # waiting for a worker (new, requeued after a notice, or retried after a crash)
    RUNNING = "running"  # claimed by a worker that holds a live lease
    FINISHED = "finished"  # the training loop finished; terminal
    FAILED = "failed"  # out of retries (or unrecoverable); terminal, ``reason`` says why
    CANCELLED = "cancelled"  # `gpucloud job cancel`: never runs again unless resumed; terminal

    @property
    def terminal(self) -> bool:
        return self in (JobState.FINISHED, JobState.FAILED, JobState.CANCELLED)


class AttemptState(str, enum.Enum):
    QUEUED = "queued"  # created by submit or requeue, not claimed yet
    RUNNING = "running"
    REQUEUED = "requeued"  # stopped by a notice; attempt k+1 resumes from its checkpoint
    CRASHED = "crashed"  # non-zero exit without a notice; retried while attempts remain
    LOST = "lost"  # its worker stopped renewing the lease; another worker took the job over
    FINISHED = "finished"
    FAILED = "failed"  # the attempt that made the job FAILED
    CANCELLED = "cancelled"  # the attempt that a cancel ended (queued: never ran; running: stopped, saved)


# The timeline vocabulary. One place, so the report and every backend agree on the spelling.
EVENT_KINDS = (
    "submitted",  # job recorded
    "claimed",  # a worker took the attempt
    "started",  # the command's process group is running
    "resume",  # the session restored a checkpoint (or started fresh); data.step
    "notice",  # an interruption notice was observed; data.kind, data.deadline, data.source
    "stop-request",  # a stop was requested for the whole gang attempt; data.kind, data.deadline, data.instance_id
    "flag",  # the preempt control file was written
    "save",  # an early checkpoint was requested (rebalance recommendation)
    "ack",  # every rank agreed on the stop step; data.step
    "commit",  # the emergency checkpoint is committed; data.step
    "saved",  # a checkpoint was committed, as measured by the session; data.step, data.bytes, data.seconds
    "save-fit",  # at a stop notice: does the last measured save fit before commit_by; data.fits, left_s, needed_s
    "stop",  # the supervisor signalled the process group; data.signal, data.reason
    "exit",  # the process group is gone; data.exit_code
    "requeue",  # attempt k+1 was created; data.reason
    "crash",  # the attempt failed without a notice; data.exit_code
    "lease-expired",  # a worker died holding the job; another worker takes it over
    "finish",  # the job finished; data.step
    "failed",  # the job is FAILED; data.reason
    "cancel",  # `gpucloud job cancel` asked for it; data.state (what the job was), data.grace_s
    "cancelled",  # the job is CANCELLED; data.step (the last step of a running attempt)
    "resubmit",  # `gpucloud job resume` queued attempt k+1 of a failed or cancelled job; data.was, data.from_step
)

# How long a cancelled running attempt has to save its step before the supervisor stops it (the
# deadline of the stop request a cancel records, as a spot notice's deadline is the reclaim time).
CANCEL_GRACE_S = 120.0
CANCEL_SOURCE = "cancel"  # the ``source`` of the stop notice a cancel records


class CodeRef(BaseModel):
    """The snapshot of the submitter's working directory a job runs in (``submit --workdir``;
    ``jobs/code/``): where it is stored, and the tree's hash the node verifies it against."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    uri: str = Field(min_length=1, description="s3://BUCKET/code/<sha256>.tar.gz or a path on the queue's host")
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$", description="hash of the tree (paths, modes, contents)")
    size_bytes: int = Field(ge=0, description="uncompressed content; a node refuses an archive that unpacks to more")
    files: int = Field(ge=0)


class JobSpec(BaseModel):
    """What to run and how: everything a worker on another node needs to run an attempt."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    command: list[str] = Field(min_length=1, description="argv of the training command")
    name: str | None = None
    checkpoint_uri: str | None = Field(default=None, description="durable checkpoint location")
    workdir: str | None = Field(default=None, description="working directory of the command")
    # Code shipping (docs/code-shipping.md). Both absent from jobs stored before they existed.
    code: CodeRef | None = Field(default=None, description="snapshot the command runs in (instead of workdir)")
    setup: str | None = Field(default=None, min_length=1, description="shell command run once per node and hash")
    env: dict[str, str] = Field(default_factory=dict, description="extra environment variables")
    nodes: int = Field(default=1, ge=1)
    # GPUs per node for GPU-hour accounting. 0 on CPU; torch.cuda.device_count() is not asked,
    # because the submitting machine is rarely the node the job runs on.
    gpus_per_node: int = Field(default=0, ge=0)
    max_attempts: int = Field(default=3, ge=1, description="attempts that may crash before FAILED")
    # The node group whose agents run it (None: the stack's first group, the default), and the
    # group that may also take it once an attempt has waited ``fallback_after_minutes`` in the
    # queue: spot interruptions cluster in one pool, so a gang noticed at once must not wait for
    # that pool forever (``runs_on``).
    group: str | None = Field(default=None, description="node group that runs it (None: the first group)")
    fallback_group: str | None = Field(default=None, description="group that takes it after fallback_after_minutes")
    fallback_after_minutes: float | None = Field(default=None, description="minutes queued before the fallback")

    @field_validator("command")
    @classmethod
    def _command_not_blank(cls, value: list[str]) -> list[str]:
        if not value[0].strip():
            raise ValueError("the command's program name is empty")
        return value

    @field_validator("group", "fallback_group")
    @classmethod
    def _a_group_name(cls, value: str | None) -> str | None:
        if value is not None and not GROUP_NAME_RE.fullmatch(value):
            raise ValueError(f"{value[:40]!r} is not a node group name ({GROUP_NAME_RULE})")
        return value

    @model_validator(mode="after")
    def _fallback_is_another_group_after_a_wait(self) -> JobSpec:
        after = self.fallback_after_minutes
        if after is not None and (after != after or after < 0 or after == float("inf")):
            raise ValueError(f"fallback_after_minutes {after} must be a number of minutes >= 0")
        if self.fallback_group is None:
            if after is not None:
                raise ValueError("fallback_after_minutes needs a fallback_group to fall back to")
            return self
        if self.fallback_group == self.group:
            raise ValueError(f"fallback_group {self.fallback_group!r} is the job's own group; name another group")
        return self

    def runs_on(self, group: str | None, *, queued_for: float, default_group: str | None = None) -> bool:
        """May an agent of node group ``group`` take this job, queued ``queued_for`` seconds ago?

        An agent with no group (a laptop, the fleet simulation) takes every job. A job with no
        group belongs to ``default_group`` (the stack's first; unknown: any group's). The
        fallback group may take it too once the attempt has waited ``fallback_after_minutes``.
        """
        own = self.group or default_group
        if group is None or own is None or own == group:
            return True
        if self.fallback_group != group:
            return False
        return queued_for >= self.fallback_after_seconds()

    def fallback_after_seconds(self) -> float:
        """How long an attempt waits before ``fallback_group`` may take it too."""
        after = DEFAULT_FALLBACK_AFTER_MINUTES if self.fallback_after_minutes is None else self.fallback_after_minutes
        return after * 60

    def backlog_group(self, *, queued_for: float, default_group: str | None = None) -> str | None:
        """The one group whose scale-out this waiting job asks for: its fallback group once the
        wait is over (its own group could not supply it for that long, and counting it for both
        would buy the gang twice), else its own. Its own group's nodes may still take it."""
        if self.fallback_group is not None and queued_for >= self.fallback_after_seconds():
            return self.fallback_group
        return self.group or default_group


def spec_from_flags(**fields: Any) -> JobSpec:
    """A ``JobSpec`` from command-line values, or a one-line ``UserError`` naming the bad one."""
    try:
        return JobSpec(**fields)
    except ValidationError as err:
        first = err.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "job"
        raise UserError(f"cannot queue this job: {where}: {first['msg'].removeprefix('Value error, ')}") from None


# A job id as ``checkpoint.layout.validate_job_id`` allows it where it is written. Checked again on
# every read: the id names directories (run/, logs/, the checkpoint prefix), and a row written by
# something other than gpucloud (``../../x``) must not lead a worker outside $GPUCLOUD_HOME.
# (pydantic's regex engine reads ``$`` as the end of the text: a trailing newline does not pass.)
JOB_ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$"
MAX_ATTEMPT = 2**53  # attempts are counters; a larger one was not written by gpucloud (nor fits a float)


class Job(BaseModel):
    id: str = Field(pattern=JOB_ID_PATTERN)
    spec: JobSpec
    state: JobState
    attempt: int = Field(ge=1, le=MAX_ATTEMPT)  # the current attempt number (the one queued or running)
    crashes: int = 0  # attempts that crashed; compared with spec.max_attempts
    created_at: float
    updated_at: float
    worker: str | None = None
    lease_until: float | None = None
    reason: str | None = None  # why the job FAILED (or was CANCELLED)
    exit_code: int | None = None
    # Set by `gpucloud job cancel` on a RUNNING job: whatever ends its attempt (the supervisor, a
    # takeover of an expired lease, a gang's fail-over) ends the job CANCELLED instead of requeuing.
    cancel_requested_at: float | None = None
    # Live progress (``Progress``), stored with each lease renewal of the running attempt; when an
    # attempt ends, ``last_step`` keeps its last step and ``step_rate`` is gone (only while RUNNING).
    last_step: int | None = None
    step_rate: float | None = None  # steps per second over the last minute
    progress_at: float | None = None  # when the session wrote ``last_step``

    @model_validator(mode="after")
    def _a_rate_only_while_running(self) -> Job:
        # A rate describes a running attempt; a stored one outlives it only where its end could
        # not clear it (a holder that died), and must never be shown for a queued or ended job.
        if self.state is not JobState.RUNNING:
            self.step_rate = None
        return self


class Attempt(BaseModel):
    job_id: str = Field(pattern=JOB_ID_PATTERN)
    number: int = Field(ge=1, le=MAX_ATTEMPT)
    state: AttemptState
    worker: str | None = None
    node: str | None = None
    created_at: float
    started_at: float | None = None
    ended_at: float | None = None
    exit_code: int | None = None
    resumed_step: int | None = None  # the step this attempt restored (None: started fresh)
    last_step: int | None = None  # the furthest step it completed
    committed_step: int | None = None  # the emergency checkpoint it committed, if any
    reason: str | None = None


@dataclasses.dataclass(frozen=True)
class Progress:
    """A running attempt's progress as its supervisor last saw it (``JobQueue.heartbeat``)."""

    last_step: int
    step_rate: float | None  # steps per second over the last minute (None: one sample so far)
    progress_at: float  # when the session wrote ``last_step``


class Event(BaseModel):
    job_id: str = Field(pattern=JOB_ID_PATTERN)
    attempt: int = Field(ge=0, le=MAX_ATTEMPT)
    kind: str
    at: float
    data: dict[str, Any] = Field(default_factory=dict)


class AttemptEnd(BaseModel):
    """How an attempt ended, as the supervisor saw it; stored on the attempt row."""

    state: AttemptState
    exit_code: int | None = None
    last_step: int | None = None
    committed_step: int | None = None
    resumed_step: int | None = None
    resume_from: int | None = None  # the committed step the next attempt will restore (None: fresh)
    reason: str | None = None


class SlotClaim(BaseModel):
    """One node's claim on one slot of a gang attempt (a job of N nodes has N slots per attempt).

    The holder renews ``lease_until``; a slot whose lease ran out before its gang formed is free
    again, and one that runs out after is a lost member (the attempt fails over to k+1).
    """

    model_config = ConfigDict(frozen=True)

    job_id: str
    attempt: int = Field(ge=1)
    slot: int = Field(ge=0)  # the node rank this member runs as
    worker: str
    address: str  # the private address the other members reach this node on (rank 0: rendezvous)
    lease_until: float


@dataclasses.dataclass(frozen=True)
class SlotOffer:
    """A slot that may need a worker now, as a backend found it (``GangStore.slot_offers``).

    ``lost``: the slot belongs to a running attempt whose holder stopped renewing — the attempt is
    to be failed over, not the slot taken. ``ref`` is the backend's handle on what brought the
    offer (the SQS slot message on AWS; None when it was read from the table); the taker passes
    the offer back to ``take_slot``, ``offer_done`` or ``offer_back`` so the backend can keep,
    delete or return that message.
    """

    job_id: str
    attempt: int
    slot: int
    lost: bool = False
    ref: Any = None


class NodeState(str, enum.Enum):
    IDLE = "idle"  # nothing to claim
    WAITING = "waiting"  # holds a slot, waiting for the rest of its gang
    RUNNING = "running"  # runs an attempt
    STOPPING = "stopping"  # an interruption notice arrived: takes no more work
    STOPPED = "stopped"  # the agent exited


class NodeRecord(BaseModel):
    """What an agent last reported about its node (``gpucloud nodes``)."""

    model_config = ConfigDict(frozen=True)

    id: str  # the agent's worker id
    address: str
    state: NodeState
    instance_type: str | None = None
    lifecycle: str | None = None  # spot | on-demand (IMDS instance-life-cycle)
    instance_id: str | None = None
    group: str | None = None  # the node group the agent serves (GPUCLOUD_NODE_GROUP); None off a cluster
    job_id: str | None = None
    attempt: int | None = None
    slot: int | None = None
    updated_at: float
    reason: str | None = None  # why the record was closed by someone else (e.g. the agent was found dead)


class StopRequest(BaseModel):
    """A stop notice recorded on a running attempt (``JobQueue.request_stop``).

    How a notice seen by one gang member, or by the events-queue handler of any agent, reaches the
    supervisor of every member: each polls the attempt's request and flags its ranks exactly as
    for a notice of its own. The notice's own fields travel unchanged, so every member plans
    against the real deadline, and ``event_id`` lets a member that saw the notice itself ignore
    the copy.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    kind: str
    source: str
    deadline: float | None
    received_at: float
    event_id: str = Field(min_length=1)
    action: str | None = None
    payload: dict[str, Any] = Field(default_factory=dict)
    instance_id: str | None = None  # the instance the notice is about, when known
    requested_at: float

    @field_validator("kind")
    @classmethod
    def _a_stop_kind(cls, value: str) -> str:
        if value not in STOP_KINDS:
            raise ValueError(f"{value!r} is not a stop notice (one of {', '.join(sorted(STOP_KINDS))})")
        return value

    @classmethod
    def of(cls, notice: Notice, *, requested_at: float, instance_id: str | None = None) -> StopRequest:
        """The request for ``notice``; ``instance_id`` defaults to the one the payload names."""
        if not notice.is_stop:
            raise ValueError(
                f"a {notice.kind} notice cannot stop a gang (stop notices: {', '.join(sorted(STOP_KINDS))})"
            )
        named = notice.payload.get("instance-id")
        return cls(
            kind=notice.kind,
            source=notice.source,
            deadline=notice.deadline,
            received_at=notice.received_at,
            event_id=notice.event_id,
            action=notice.action,
            payload=dict(notice.payload),
            instance_id=instance_id or (named if isinstance(named, str) else None),
            requested_at=requested_at,
        )

    def notice(self) -> Notice:
        payload = dict(self.payload)
        if self.instance_id is not None:
            payload.setdefault("instance-id", self.instance_id)
        return Notice(
            kind=cast(NoticeKind, self.kind),  # written from a Notice, so one of its kinds
            source=self.source,
            deadline=self.deadline,
            received_at=self.received_at,
            event_id=self.event_id,
            action=self.action,
            payload=payload,
        )

    def timeline_data(self) -> dict[str, Any]:
        """What the ``stop-request`` timeline event carries."""
        return {
            "kind": self.kind,
            "source": self.source,
            "deadline": self.deadline,
            "action": self.action,
            "instance_id": self.instance_id,
            "event_id": self.event_id,
        }


# ------------------------------------------------------------------------------------ cancelling


def requested_stop_notice(
    source: str, *, event_id: str, now: float, grace_seconds: float, payload: dict[str, Any] | None = None
) -> Notice:
    """A stop notice recorded on a running attempt from our side (``JobQueue.request_stop``: a cancel,
    a teardown): every member's supervisor flags its ranks exactly as for a spot notice, so they agree
    on a step and save it, with ``grace_seconds`` as the deadline. Kind ``sigterm``: no instance goes
    away (no instance id, so no agent takes it as its own); ``source`` (also the action) says who asked."""
    return Notice(
        kind="sigterm",
        source=source,
        deadline=now + grace_seconds,
        received_at=now,
        event_id=event_id,
        action=source,
        payload=payload or {},
    )


def cancel_notice(job_id: str, attempt: int, *, now: float, grace_seconds: float = CANCEL_GRACE_S) -> Notice:
    """The stop notice a cancel records on a running attempt."""
    return requested_stop_notice(
        CANCEL_SOURCE, event_id=f"cancel-{job_id}-{attempt}", now=now, grace_seconds=grace_seconds
    )


def is_cancel(notice: Notice | None) -> bool:
    return notice is not None and notice.source == CANCEL_SOURCE


def cancelled_end(end: AttemptEnd) -> bool:
    """Whether the end of an attempt of a job with a cancel request ends the job CANCELLED: every
    end but FINISHED (a command that finished before the stop took effect did finish)."""
    return end.state is not AttemptState.FINISHED


RESUMABLE = (JobState.FAILED, JobState.CANCELLED)


def resume_refusal(job: Job) -> str | None:
    """Why ``gpucloud job resume`` refuses ``job`` (one line), or None when it may resume.

    Queued or running: it is already going to run (cancel it first to restart it). Finished: its
    training loop ended, so a new attempt would restore the final step and have nothing to do;
    training further is a new job (with a new id, so its history stays apart from this one's)."""
    if job.state in RESUMABLE:
        if job.attempt >= MAX_ATTEMPT:
            return f"job {job.id} has had {job.attempt} attempts, the most a job can have; submit a new job"
        return None
    if job.state is JobState.FINISHED:
        return (
            f"job {job.id} finished; there is nothing to resume (resume takes failed or cancelled jobs; "
            "to train further, submit a new job)"
        )
    doing = "cancelling" if job.cancel_requested_at is not None else job.state.value
    return (
        f"job {job.id} is {doing} (attempt {job.attempt}); resume takes failed or cancelled jobs "
        f"(wait for it to end, or `gpucloud job cancel {job.id}` first)"
    )


def cancel_reason(job: Job) -> str:
    if job.state is JobState.QUEUED:
        return f"cancelled while queued (attempt {job.attempt} never ran)"
    return f"cancelled while running attempt {job.attempt}"


# The session counts completed steps (``step_done(n)`` after the n-th step; a fresh start restores
# step 0), so "steps lost" is a plain difference.
FRESH_START_STEP = 0


def steps_lost(last_step: int | None, resumed_step: int | None) -> int | None:
    """Steps an interrupted attempt trained that the next one trains again: from the step it resumed
    (or 0) to the last it reported; None when it reported none."""
    if last_step is None:
        return None
    start = FRESH_START_STEP if resumed_step is None else resumed_step
    return max(0, last_step - start)
