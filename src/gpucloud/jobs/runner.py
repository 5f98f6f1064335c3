"""Carry out the supervisor's decisions: run one attempt, and a job's attempts until it settles.

This is the I/O half of the supervisor (``supervisor.py`` is the pure half). ``gpucloud
spot-train``, ``gpucloud worker`` and ``gpucloud demo`` all call ``supervise_job``; none of them
runs the supervisor as a subprocess.

Retries: an attempt stopped by a notice is requeued (attempt k+1, exactly once) and
``supervise_job`` returns 75 — the node is going away, another node runs k+1. An attempt that
crashed is requeued too, and ``supervise_job`` claims it back at once and runs it here, until
``max_attempts`` attempts have crashed and the job is FAILED with the exit code and the last
output lines as the reason.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import signal
import socket
import time
from pathlib import Path
from typing import IO, Any, Callable, Protocol

from gpucloud import control, jobenv
from gpucloud.errors import UserError
from gpucloud.jobs.locations import default_checkpoint_uri, run_dir
from gpucloud.jobs.model import AttemptEnd, AttemptState, Job, JobState
from gpucloud.jobs.process_group import CommandNotFound, ProcessGroup
from gpucloud.jobs.queue import JobQueue, Transition
from gpucloud.jobs.supervisor import (
    StopPlan,
    SupervisorConfig,
    classify_exit,
    decide_stop,
    phase_of,
    plan_stop,
    spot_train_exit_code,
    tighten,
)
from gpucloud.signals.events import Notice

log = logging.getLogger("gpucloud.jobs")

EventHook = Callable[[str, dict[str, Any]], None]


class NoticeSource(Protocol):
    """Where notices come from (``gpucloud.signals.hub.SignalHub`` on a node)."""

    def get(self, timeout: float) -> Notice | None: ...


@dataclasses.dataclass(frozen=True)
class AttemptResult:
    attempt: int
    end: AttemptEnd
    transition: Transition
    command_exit: int | None
    stop_notice: Notice | None  # the notice that stopped it, if one did
    output_tail: list[str]

    @property
    def exit_code(self) -> int:
        return spot_train_exit_code(self.end.state, self.command_exit)


@dataclasses.dataclass(frozen=True)
class JobResult:
    job: Job
    attempts: list[AttemptResult]
    exit_code: int  # spot-train's: 0 finished, 75 requeued, other non-zero failed
    node_stopping: bool  # a stop notice arrived: this node should take no more work


@dataclasses.dataclass
class _Observed:
    """What the control files and the process group have told us so far in this attempt."""

    resumed: dict[str, Any] | None = None
    acked: dict[str, Any] | None = None
    committed: dict[str, Any] | None = None
    finished: dict[str, Any] | None = None
    last_step: int | None = None

    def see_step(self, payload: dict[str, Any] | None) -> None:
        step = _step_of(payload)
        if step is not None and (self.last_step is None or step > self.last_step):
            self.last_step = step


def attempt_environment(job: Job, *, control_dir: Path, local_dir: str | None) -> dict[str, str]:
    """The job environment contract (ARCHITECTURE.md) on top of ours and the job's own variables."""
    env = dict(os.environ)
    env.update(job.spec.env)
    env[jobenv.JOB_ID] = job.id
    env[jobenv.ATTEMPT] = str(job.attempt)
    env[jobenv.CHECKPOINT_URI] = job.spec.checkpoint_uri or default_checkpoint_uri()
    env[jobenv.CONTROL_DIR] = str(control_dir)
    if local_dir:
        env[jobenv.LOCAL_CHECKPOINT_DIR] = str(local_dir)
    else:
        env.pop(jobenv.LOCAL_CHECKPOINT_DIR, None)
    return env


def run_attempt(
    queue: JobQueue,
    job: Job,
    *,
    worker: str,
    notices: NoticeSource,
    config: SupervisorConfig,
    local_checkpoint_dir: str | None = None,
    sink: IO[str] | None = None,
    on_event: EventHook | None = None,
    run_root: Path | None = None,
) -> AttemptResult:
    """Run the claimed attempt ``job.attempt`` to its end and record that end exactly once.

    ``run_root`` holds this node's per-attempt scratch (the control directory); default
    ``$GPUCLOUD_HOME/run``.
    """
    number = job.attempt
    control_dir = (run_root / job.id / f"attempt-{number}" if run_root else run_dir(job.id, number)) / "control"
    control_dir.mkdir(parents=True, exist_ok=True)
    control.clear(control_dir)

    def record(kind: str, /, at: float | None = None, **data: Any) -> None:
        queue.record(job.id, number, kind, at=at, data=data)
        if on_event is not None:
            on_event(kind, {"attempt": number, "at": time.time() if at is None else at, **data})

    env = attempt_environment(job, control_dir=control_dir, local_dir=local_checkpoint_dir)
    try:
        group = ProcessGroup(job.spec.command, env=env, cwd=job.spec.workdir, sink=sink)
    except (CommandNotFound, NotADirectoryError, FileNotFoundError) as err:
        end = AttemptEnd(state=AttemptState.FAILED, exit_code=127, reason=str(err))
        record("exit", exit_code=127, reason=str(err))
        return AttemptResult(number, end, queue.end_attempt(job.id, number, end), 127, None, [])
    started = time.time()
    queue.update_attempt(job.id, number, started_at=started)
    record("started", at=started, pid=group.pid, command=job.spec.command)

    seen = _Observed()
    plan: StopPlan | None = None
    stop_notice: Notice | None = None
    handled: set[str] = set()
    terminated_at: float | None = None
    killed = False
    lease_lost = False
    next_heartbeat = started + config.lease_seconds / 4
    next_scan = started

    while True:
        now = time.time()
        notice = notices.get(timeout=config.tick)
        now = time.time()
        if notice is not None and notice.event_id not in handled:
            handled.add(notice.event_id)
            record(
                "notice", at=notice.received_at, kind=notice.kind, source=notice.source,
                deadline=notice.deadline, action=notice.action, event_id=notice.event_id,
            )
            if notice.is_stop:
                if plan is None:
                    stop_notice = notice
                    plan = plan_stop(notice, now, config)
                    control.write(control_dir, control.PREEMPT, notice.to_json())
                    record("flag", deadline=plan.deadline, ack_by=plan.ack_by, commit_by=plan.commit_by)
                else:
                    plan = tighten(plan, notice, now, config)
            elif plan is None:
                control.write(control_dir, control.SAVE, notice.to_json())
                record("save", kind=notice.kind)

        _observe(control_dir, seen, record, queue, job.id, number)

        if now >= next_scan:  # torchrun's ranks live in sessions of their own: keep track of them
            group.refresh_descendants()
            next_scan = now + 0.5
        if now >= next_heartbeat and not lease_lost:
            next_heartbeat = now + config.lease_seconds / 4
            if not queue.heartbeat(job.id, number, worker, lease_seconds=config.lease_seconds):
                lease_lost = True  # another worker took the job over; this attempt must not go on
                if terminated_at is None:
                    group.send(signal.SIGTERM)
                    terminated_at = now
                    record("stop", signal="SIGTERM", reason="lease lost to another worker")

        exit_code = group.poll()
        if exit_code is not None and not group.alive():
            break
        decision = decide_stop(
            plan=plan, now=now, acked=seen.acked is not None,
            committed_at=_written_at(seen.committed), terminated_at=terminated_at, killed=killed, config=config,
        )
        if decision.action in ("terminate", "kill"):
            # The phase says how far the session got: flagged (no ack), acked (no commit), committed.
            phase = phase_of(plan=plan, acked=seen.acked is not None, committed=seen.committed is not None,
                             terminated=terminated_at is not None, killed=killed)
            if decision.action == "terminate":
                group.send(signal.SIGTERM)
                terminated_at = now
            else:
                group.send(signal.SIGKILL)
                killed = True
            record("stop", signal="SIGTERM" if decision.action == "terminate" else "SIGKILL",
                   reason=decision.reason, phase=phase.value)
        if exit_code is not None and group.alive() and plan is None and terminated_at is None:
            # The leader is gone but ranks it started linger (torchrun killed hard): clean them up.
            group.send(signal.SIGTERM)
            terminated_at = now
            record("stop", signal="SIGTERM", reason="the command exited but processes it started are still running")

    command_exit = group.wait()
    group.close()
    _observe(control_dir, seen, record, queue, job.id, number)
    record("exit", exit_code=command_exit)

    outcome = classify_exit(
        exit_code=command_exit, stop_requested=plan is not None or lease_lost,
        finished=seen.finished is not None, committed=seen.committed is not None,
    )
    reason = outcome.reason
    if outcome.state is AttemptState.CRASHED:
        tail = [line for line in group.tail() if line.strip()][-3:]
        if tail:
            reason = f"{reason}; last output: {' | '.join(tail)}"
    if lease_lost:
        outcome_state, reason = AttemptState.LOST, "lease lost to another worker"
    else:
        outcome_state = outcome.state
    committed_step = _step_of(seen.committed)
    end = AttemptEnd(
        state=outcome_state,
        exit_code=command_exit,
        last_step=seen.last_step,
        committed_step=committed_step,
        resumed_step=_step_of(seen.resumed),
        resume_from=committed_step if committed_step is not None else _latest_committed(job),
        reason=reason,
    )
    transition = queue.end_attempt(job.id, number, end)
    if on_event is not None and transition.applied:
        kind = {JobState.QUEUED: "requeue", JobState.FINISHED: "finish", JobState.FAILED: "failed"}.get(
            transition.job.state
        )
        if kind:
            on_event(kind, {"attempt": number, "at": time.time(), "reason": reason, "step": end.committed_step})
    return AttemptResult(number, end, transition, command_exit, stop_notice, group.tail())


def _observe(control_dir: Path, seen: _Observed, record: Callable[..., None], queue: JobQueue, job_id: str, number: int) -> None:
    """Read the session's control files; record each milestone once, at the time it happened."""
    if seen.resumed is None and (payload := control.read(control_dir, control.RESUMED)) is not None:
        seen.resumed = payload
        queue.update_attempt(job_id, number, resumed_step=_step_of(payload))
        details = {k: v for k, v in payload.items() if k not in ("step", "written_at")}
        record("resume", at=_written_at(payload), step=_step_of(payload), **details)
    seen.see_step(control.read(control_dir, control.PROGRESS))
    if seen.acked is None and (payload := control.read(control_dir, control.ACK)) is not None:
        seen.acked = payload
        seen.see_step(payload)
        record("ack", at=_written_at(payload), step=_step_of(payload))
    if seen.committed is None and (payload := control.read(control_dir, control.COMMITTED)) is not None:
        seen.committed = payload
        seen.see_step(payload)
        record("commit", at=_written_at(payload), step=_step_of(payload))
    if seen.finished is None and (payload := control.read(control_dir, control.FINISHED)) is not None:
        seen.finished = payload
        seen.see_step(payload)


def supervise_job(
    queue: JobQueue,
    job_id: str | None,
    *,
    worker: str | None = None,
    notices: NoticeSource,
    config: SupervisorConfig,
    local_checkpoint_dir: str | None = None,
    sink: IO[str] | None = None,
    on_event: EventHook | None = None,
    claimed: Job | None = None,
    run_root: Path | None = None,
) -> JobResult:
    """Claim ``job_id`` (or run the already ``claimed`` job) and run attempts until it is requeued
    by a notice (75), finished (0) or failed (the command's non-zero exit code)."""
    worker = worker or default_worker_id()
    job = claimed or _claim(queue, job_id, worker, config)
    results: list[AttemptResult] = []
    while True:
        result = run_attempt(
            queue, job, worker=worker, notices=notices, config=config,
            local_checkpoint_dir=local_checkpoint_dir, sink=sink, on_event=on_event, run_root=run_root,
        )
        results.append(result)
        after = result.transition.job
        if result.end.state is AttemptState.CRASHED and after.state is JobState.QUEUED:
            retry = queue.claim(worker, lease_seconds=config.lease_seconds, job_id=after.id, node=socket.gethostname())
            if retry is not None:
                job = retry
                continue
        if result.end.state is AttemptState.FAILED or after.state is JobState.FAILED:
            code = spot_train_exit_code(AttemptState.FAILED, result.command_exit)
        else:
            code = result.exit_code
        return JobResult(
            job=queue.get(after.id), attempts=results, exit_code=code,
            node_stopping=result.stop_notice is not None,
        )


def _claim(queue: JobQueue, job_id: str | None, worker: str, config: SupervisorConfig) -> Job:
    job = queue.claim(worker, lease_seconds=config.lease_seconds, job_id=job_id, node=socket.gethostname())
    if job is not None:
        return job
    if job_id is None:
        raise UserError(f"no queued job in {queue.uri}")
    current = queue.get(job_id)  # raises UnknownJob with its own message
    if current.state.terminal:
        raise UserError(f"job {job_id} is already {current.state.value}; submit a new job to run it again")
    raise UserError(
        f"job {job_id} is running on worker {current.worker} (lease until "
        f"{time.strftime('%H:%M:%S', time.localtime(current.lease_until or 0))}); it becomes claimable when that lease expires"
    )


def _latest_committed(job: Job) -> int | None:
    """The step the next attempt will restore, for the timeline; unknown when the store cannot be read."""
    from gpucloud.checkpoint.store import latest_committed

    try:
        return latest_committed(job.spec.checkpoint_uri or default_checkpoint_uri(), job.id)
    except Exception as err:  # noqa: BLE001 - informational only; the next attempt's restore decides
        log.warning("could not read the latest committed checkpoint of job %s: %s", job.id, err)
        return None


def default_worker_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


def _step_of(payload: dict[str, Any] | None) -> int | None:
    if not payload:
        return None
    step = payload.get("step")
    return step if isinstance(step, int) and not isinstance(step, bool) else None


def _written_at(payload: dict[str, Any] | None) -> float | None:
    if not payload:
        return None
    value = payload.get("written_at")
    return float(value) if isinstance(value, (int, float)) else None
