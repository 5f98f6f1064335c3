"""The attempt lifecycle as a small state machine: pure decisions, no I/O.

``runner.py`` feeds observations in (a notice arrived, the ``ack``/``committed`` control files
appeared, the process group exited) and carries out what these functions decide (signal the
group, requeue). Keeping the decisions pure makes every deadline rule testable without processes.

Phases of one attempt::

    RUNNING --stop notice--> FLAGGED --ack--> ACKED --committed--> COMMITTED
       |                        |               |                     |
       |                   ack timeout     commit timeout      exit grace over
       |                        +-------> TERMINATING (SIGTERM) <-----+
       |                                        | kill_after / deadline
       +--exit-------------------------------> KILLED (SIGKILL) ... EXITED
"""

from __future__ import annotations

import dataclasses
import enum
import math
from collections.abc import Iterable
from typing import Any

from gpucloud.cluster.emergency_save import STOP_MARGIN_SECONDS
from gpucloud.jobenv import EXIT_OK, EXIT_REQUEUED
from gpucloud.lifecycle.model import AttemptState, Event
from gpucloud.signals.events import Notice


@dataclasses.dataclass(frozen=True)
class SupervisorConfig:
    tick: float = 0.05  # how often the supervisor looks at control files and the process group
    ack_timeout: float = 30.0  # longest wait for the session's ack; never past the deadline
    stop_margin: float = STOP_MARGIN_SECONDS  # the commit must land this long before the notice deadline
    exit_grace: float = 10.0  # after the commit, time for the ranks to exit 75 by themselves
    kill_after: float = 10.0  # SIGTERM -> SIGKILL escalation
    lease_seconds: float = 60.0  # worker lease on the job; renewed every lease_seconds / 4
    stop_poll: float = 2.0  # how often the attempt's stop request (a cancel, a gang peer's notice) is read

    def __post_init__(self) -> None:
        for name in ("tick", "ack_timeout", "exit_grace", "kill_after", "lease_seconds", "stop_poll"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)}")
        if self.stop_margin < 0:
            raise ValueError(f"stop_margin must be >= 0, got {self.stop_margin}")


class Phase(str, enum.Enum):
    RUNNING = "running"
    FLAGGED = "flagged"
    ACKED = "acked"
    COMMITTED = "committed"
    TERMINATING = "terminating"
    KILLED = "killed"


@dataclasses.dataclass(frozen=True)
class StopPlan:
    """Deadlines fixed when the stop flag is written (tightened if a later notice is sooner)."""

    flagged_at: float
    deadline: float  # when the node may be gone
    ack_by: float
    commit_by: float


def ack_deadline(deadline: float, now: float, ack_timeout: float, margin: float) -> float:
    """Wait for the ack at most ``ack_timeout``, and never past the commit deadline."""
    return min(deadline - margin, now + ack_timeout)


def plan_stop(notice: Notice, now: float, config: SupervisorConfig) -> StopPlan:
    # A stop notice without a deadline cannot come from our sources; treat it as "now + ack timeout"
    # rather than waiting forever.
    deadline = notice.deadline if notice.deadline is not None else now + config.ack_timeout
    commit_by = deadline - config.stop_margin
    return StopPlan(
        flagged_at=now,
        deadline=deadline,
        ack_by=ack_deadline(deadline, now, config.ack_timeout, config.stop_margin),
        commit_by=commit_by,
    )


def tighten(plan: StopPlan, notice: Notice, now: float, config: SupervisorConfig) -> StopPlan:
    """A second stop notice can only bring the deadlines forward (e.g. SIGTERM after an IMDS notice)."""
    other = plan_stop(notice, now, config)
    return StopPlan(
        flagged_at=plan.flagged_at,
        deadline=min(plan.deadline, other.deadline),
        ack_by=min(plan.ack_by, other.ack_by),
        commit_by=min(plan.commit_by, other.commit_by),
    )


@dataclasses.dataclass(frozen=True)
class Decision:
    action: str  # "wait" | "terminate" | "kill"
    reason: str = ""


WAIT = Decision("wait")


def decide_stop(
    *,
    plan: StopPlan | None,
    now: float,
    acked: bool,
    committed_at: float | None,
    terminated_at: float | None,
    killed: bool,
    config: SupervisorConfig,
) -> Decision:
    """What to do to the process group now. ``plan`` is None until a stop notice arrived (or the
    lease was lost); without a plan the supervisor never interferes with the command."""
    if killed:
        return WAIT
    if terminated_at is not None:
        # SIGKILL after kill_after, but never later than the deadline itself: past it, the node is gone.
        kill_at = terminated_at + config.kill_after
        if plan is not None:
            kill_at = min(kill_at, max(terminated_at, plan.deadline - 1.0))
        return Decision("kill", "still running after SIGTERM") if now >= kill_at else WAIT
    if plan is None:
        return WAIT
    if committed_at is not None:
        if now >= committed_at + config.exit_grace or now >= plan.commit_by:
            return Decision("terminate", "checkpoint committed but the command did not exit")
        return WAIT
    if acked:
        if now >= plan.commit_by:
            return Decision("terminate", "no commit before the deadline margin")
        return WAIT
    if now >= plan.ack_by:
        return Decision("terminate", "no ack within the ack timeout (the command ignores the spot-train API)")
    return WAIT


def phase_of(*, plan: StopPlan | None, acked: bool, committed: bool, terminated: bool, killed: bool) -> Phase:
    if killed:
        return Phase.KILLED
    if terminated:
        return Phase.TERMINATING
    if plan is None:
        return Phase.RUNNING
    if committed:
        return Phase.COMMITTED
    return Phase.ACKED if acked else Phase.FLAGGED


@dataclasses.dataclass(frozen=True)
class Outcome:
    state: AttemptState
    reason: str | None = None


def classify_exit(*, exit_code: int, stop_requested: bool, finished: bool, committed: bool) -> Outcome:
    """How an attempt ended, from the control files first and the exit code second.

    torchrun exits 1 (ChildFailedError) when its workers exit 75, so the exit code alone cannot
    tell a checkpointed stop from a crash; the ``committed``/``finished`` files can.
    """
    if finished and (exit_code == EXIT_OK or stop_requested):
        return Outcome(AttemptState.FINISHED)
    if stop_requested:
        reason = (
            "checkpointed on notice" if committed else "stopped on notice; resumes from the last committed checkpoint"
        )
        return Outcome(AttemptState.REQUEUED, reason)
    if committed or exit_code == EXIT_REQUEUED:
        return Outcome(AttemptState.REQUEUED, "the command checkpointed and asked to be requeued (exit 75)")
    if exit_code == EXIT_OK:
        return Outcome(AttemptState.FINISHED)
    return Outcome(AttemptState.CRASHED, f"command exited {describe_exit(exit_code)}")


def describe_exit(exit_code: int) -> str:
    if exit_code < 0:
        import signal

        try:
            return f"on signal {signal.Signals(-exit_code).name}"
        except ValueError:
            return f"on signal {-exit_code}"
    return f"with code {exit_code}"


# The job was cancelled (`gpucloud job cancel`): not 0, which says the job finished (a script's
# `spot-train ... && publish-model` must not publish a half-trained model), and not 75, which says
# another attempt will run. 130 is the shell's "stopped at the user's request" (128 + SIGINT).
EXIT_CANCELLED = 130


def spot_train_exit_code(state: AttemptState, command_exit: int | None) -> int:
    """The exit-code contract: 0 finished, 75 checkpointed and requeued, 130 cancelled, other
    non-zero failed."""
    if state is AttemptState.CANCELLED:
        return EXIT_CANCELLED
    if state is AttemptState.FINISHED:
        return EXIT_OK
    if state in (AttemptState.REQUEUED, AttemptState.LOST):
        return EXIT_REQUEUED
    if command_exit is None or command_exit in (EXIT_OK, EXIT_REQUEUED):
        return 1
    return command_exit if command_exit > 0 else 128 - command_exit


# ---------------------------------------------------------------------------------- save timing
# A new measured save is recorded on the job's timeline (event "saved") when it is the attempt's
# first or differs from the last recorded one by more than this share: the timeline stays short on
# a job that saves every few minutes for days, and still follows a state that grows.
SAVE_RECORD_CHANGE = 0.2
SAVE_RECORD_EVERY_S = 600.0  # ... and at most this often after the attempt's first


@dataclasses.dataclass(frozen=True)
class SaveMeasure:
    """One committed save as the session measured it: its step, bytes, and start -> durable commit."""

    step: int
    bytes: int
    seconds: float

    @classmethod
    def from_payload(cls, data: object) -> SaveMeasure | None:
        """From a control file or event payload ({"step", "bytes", "seconds"}); None if not one."""
        if not isinstance(data, dict):
            return None
        step, size, seconds = data.get("step"), data.get("bytes"), data.get("seconds")
        if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in (step, size)):
            return None
        if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not math.isfinite(seconds):
            return None
        if seconds < 0:
            return None
        assert isinstance(step, int) and isinstance(size, int)
        return cls(step=step, bytes=size, seconds=float(seconds))

    def to_json(self) -> dict[str, Any]:
        return {"step": self.step, "bytes": self.bytes, "seconds": round(self.seconds, 3)}

    def differs_from(self, other: SaveMeasure | None) -> bool:
        if other is None:
            return True
        return any(
            abs(new - old) > SAVE_RECORD_CHANGE * max(old, 1e-9)
            for new, old in ((self.bytes, other.bytes), (self.seconds, other.seconds))
        )


def should_record_save(
    measure: SaveMeasure, recorded: SaveMeasure | None, recorded_at: float | None, now: float
) -> bool:
    """Whether a newly measured save goes on the job's timeline: the attempt's first always; later
    ones when they changed noticeably and the last record is SAVE_RECORD_EVERY_S old."""
    if recorded is None or recorded_at is None:
        return True
    return measure.differs_from(recorded) and now - recorded_at >= SAVE_RECORD_EVERY_S


def last_save_from_events(events: Iterable[Event]) -> SaveMeasure | None:
    """The most recent save measured on the job's timeline (any attempt)."""
    latest: SaveMeasure | None = None
    for event in sorted((e for e in events if e.kind == "saved"), key=lambda e: e.at):
        latest = SaveMeasure.from_payload(event.data) or latest
    return latest


@dataclasses.dataclass(frozen=True)
class SaveFit:
    """At a notice: will the emergency save commit before the commit deadline?"""

    fits: bool | None  # None: no save of this job was measured yet
    left_seconds: float  # notice handling -> commit_by
    needed_seconds: float | None  # the previous save's duration (same state, same tier)
    last: SaveMeasure | None

    def describe(self) -> str:
        if self.last is None or self.needed_seconds is None:
            return f"emergency save: {self.left_seconds:.0f} s left to commit; no earlier save of this job was measured"
        verdict = "fits" if self.fits else "will NOT fit"
        return (
            f"emergency save {verdict}: the last save (step {self.last.step}, {self.last.bytes / 1e9:.2f} GB) took "
            f"{self.needed_seconds:.1f} s; {self.left_seconds:.1f} s left before the commit deadline"
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "fits": self.fits,
            "left_s": round(self.left_seconds, 1),
            "needed_s": None if self.needed_seconds is None else round(self.needed_seconds, 1),
            "bytes": None if self.last is None else self.last.bytes,
            "measured_step": None if self.last is None else self.last.step,
        }


def save_fit(last: SaveMeasure | None, plan: StopPlan, now: float) -> SaveFit:
    """Compare the previous save's measured duration with the time left before ``plan.commit_by``."""
    left = plan.commit_by - now
    if last is None:
        return SaveFit(fits=None, left_seconds=left, needed_seconds=None, last=None)
    return SaveFit(fits=last.seconds <= left, left_seconds=left, needed_seconds=last.seconds, last=last)
