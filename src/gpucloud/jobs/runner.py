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

import contextlib
import dataclasses
import logging
import os
import signal
import socket
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from gpucloud import control, jobenv
from gpucloud.checkpoint.defaults import checkpoint_uri_for
from gpucloud.errors import UserError
from gpucloud.home import gpucloud_home
from gpucloud.jobs.code.attempt import CodeNotReady, lease_kept, node_cache_dir
from gpucloud.jobs.code.attempt import prepare as prepare_code
from gpucloud.jobs.logs import AttemptLog, open_attempt_log
from gpucloud.jobs.process_group import CommandNotFound, OutputSink, ProcessGroup
from gpucloud.jobs.progress import StepRate
from gpucloud.jobs.supervisor import (
    SaveMeasure,
    StopPlan,
    SupervisorConfig,
    classify_exit,
    decide_stop,
    last_save_from_events,
    phase_of,
    plan_stop,
    save_fit,
    should_record_save,
    spot_train_exit_code,
    tighten,
)
from gpucloud.lifecycle.model import RESUMABLE, AttemptEnd, AttemptState, Job, JobState, is_cancel
from gpucloud.queue.protocol import JobQueue, Transition
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
        if self.transition.job.state is JobState.CANCELLED:
            return spot_train_exit_code(AttemptState.CANCELLED, self.command_exit)
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
    rate: StepRate = dataclasses.field(default_factory=StepRate)
    reported_rate: bool = False  # the queue has been told a rate once (the early renewal below)

    def see_step(self, payload: dict[str, Any] | None) -> None:
        step = _step_of(payload)
        if step is not None and (self.last_step is None or step > self.last_step):
            self.last_step = step

    def see_progress(self, payload: dict[str, Any] | None) -> None:
        """A ``progress`` file: the furthest step, and a sample of the step rate."""
        self.see_step(payload)
        step, at = _step_of(payload), _written_at(payload)
        if step is not None and at is not None:
            self.rate.add(step, at)


def attempt_environment(job: Job, *, control_dir: Path, local_dir: str | None) -> dict[str, str]:
    """The job environment contract (docs/architecture.md, "Contracts") on top of ours and the job's own variables."""
    env = dict(os.environ)
    env.update(job.spec.env)
    env[jobenv.JOB_ID] = job.id
    env[jobenv.ATTEMPT] = str(job.attempt)
    # A job submitted without a URI to a cluster's queue gets this node's default: the cluster's bucket.
    env[jobenv.CHECKPOINT_URI] = checkpoint_uri_for(job.spec.checkpoint_uri)
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
    sink: OutputSink | None = None,
    on_event: EventHook | None = None,
    run_root: Path | None = None,
    node: dict[str, Any] | None = None,
    log_root: Path | None = None,
) -> AttemptResult:
    """Run the claimed attempt ``job.attempt`` to its end and record that end exactly once.

    ``run_root`` holds this node's per-attempt scratch (the control directory); default
    ``$GPUCLOUD_HOME/run``. ``log_root``: where the attempt's log goes; default
    ``$GPUCLOUD_HOME/logs`` (the demo keeps its own in its work directory). ``node``: where this member runs (``NodeIdentity.placement``: instance
    type, AZ, region, life cycle), recorded on its ``started`` and ``exit`` events, whose times are
    this node's wall time on the attempt (what ``cost/job_cost.py`` prices).
    """
    number = job.attempt
    control_dir = control_dir_for(job.id, number, run_root)
    try:
        control_dir.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise UserError(
            f"cannot create the control directory {control_dir}: {err.strerror} (set GPUCLOUD_HOME)"
        ) from err
    control.clear(control_dir)
    # The command's output and the supervisor's lines, kept per attempt (`gpucloud job logs`).
    output = open_attempt_log(job, echo=sink, root=log_root)
    try:
        with contextlib.ExitStack() as holds:
            return _run_logged(
                queue, job, worker, notices, config, local_checkpoint_dir, output, on_event, control_dir, holds, node
            )
    finally:
        output.close()


def control_dir_for(job_id: str, attempt: int, run_root: Path | None = None) -> Path:
    """Where attempt ``attempt`` of ``job_id`` keeps its control files on this node (the agent's
    exporter reads the session's ``progress`` there)."""
    return (run_root or gpucloud_home() / "run") / job_id / f"attempt-{attempt}" / "control"


def _run_logged(
    queue: JobQueue,
    job: Job,
    worker: str,
    notices: NoticeSource,
    config: SupervisorConfig,
    local_checkpoint_dir: str | None,
    output: AttemptLog,
    on_event: EventHook | None,
    control_dir: Path,
    holds: contextlib.ExitStack,
    node: dict[str, Any] | None = None,
) -> AttemptResult:
    number = job.attempt
    timeline = _Timeline(queue, job.id, number, on_event, output, node)
    env = attempt_environment(job, control_dir=control_dir, local_dir=local_checkpoint_dir)
    try:
        # The job's code snapshot and setup env (submit --workdir/--setup), in this attempt's
        # directory; the node's cache sits beside its run directory (control_dir's grandparent's).
        renew = lambda: queue.heartbeat(job.id, number, worker, lease_seconds=config.lease_seconds)  # noqa: E731
        with lease_kept(renew, every=config.lease_seconds / 4):
            code = prepare_code(
                job,
                attempt_dir=control_dir.parent,
                cache=node_cache_dir(control_dir.parents[2]),
                env=env,
                log=output,
                holds=holds,  # the node cache's entries stay in use until the attempt ends
            )
        # Half the lease: a supervisor that dies leaves its ranks time to save, and they are gone
        # before the lease runs out and another worker may start the next attempt.
        group = ProcessGroup(
            job.spec.command, env=code.env, cwd=code.cwd, sink=output, save_grace=config.lease_seconds / 2
        )
    except (CommandNotFound, NotADirectoryError, FileNotFoundError, CodeNotReady) as err:
        end = AttemptEnd(state=AttemptState.FAILED, exit_code=127, reason=str(err))
        timeline.record(
            "exit",
            exit_code=127,
            reason=str(err),
            log=str(output.path) if output.writable else None,
            **timeline.node_data(),
        )
        return AttemptResult(number, end, queue.end_attempt(job.id, number, end), 127, None, [])
    attempt = _AttemptLoop(queue, job, worker, group, control_dir, config, timeline)
    command_exit = attempt.run(notices)
    end = attempt.ending(command_exit)
    transition = queue.end_attempt(job.id, number, end)
    if transition.applied:
        kind = {
            JobState.QUEUED: "requeue",
            JobState.FINISHED: "finish",
            JobState.FAILED: "failed",
            JobState.CANCELLED: "cancelled",
        }.get(transition.job.state)
        if kind:  # already in the timeline (written by end_attempt); this only tells the live display
            timeline.announce(kind, reason=end.reason, step=end.committed_step)
    return AttemptResult(number, end, transition, command_exit, attempt.stop_notice, group.tail())


class _Timeline:
    """Records one attempt's events in the queue, tells the live display (``on_event``) and writes
    the supervisor's line for each into the attempt's log."""

    def __init__(
        self,
        queue: JobQueue,
        job_id: str,
        attempt: int,
        on_event: EventHook | None,
        output: AttemptLog,
        node: dict[str, Any] | None = None,
    ) -> None:
        self.queue, self.job_id, self.attempt, self.on_event = queue, job_id, attempt, on_event
        self.output, self.node = output, node

    def node_data(self) -> dict[str, Any]:
        """``node=`` for the started and exit events: the node's wall time on the attempt lies
        between them (each gang member records its own pair). Nothing when unknown."""
        return {"node": self.node} if self.node else {}

    def record(self, kind: str, /, at: float | None = None, **data: Any) -> None:
        self.queue.record(self.job_id, self.attempt, kind, at=at, data=data)
        self.announce(kind, at=at, **data)

    def announce(self, kind: str, /, at: float | None = None, **data: Any) -> None:
        payload = {"attempt": self.attempt, "at": time.time() if at is None else at, **data}
        self.output.event(kind, payload)
        if self.on_event is not None:
            self.on_event(kind, payload)


class _AttemptLoop:
    """The supervision loop of one running attempt: notices in, control files read, deadlines
    enforced through the pure decisions of ``supervisor.py``."""

    def __init__(
        self,
        queue: JobQueue,
        job: Job,
        worker: str,
        group: ProcessGroup,
        control_dir: Path,
        config: SupervisorConfig,
        timeline: _Timeline,
    ) -> None:
        self.queue, self.job, self.worker, self.group = queue, job, worker, group
        self.control_dir, self.config, self.timeline = control_dir, config, timeline
        self.seen = _Observed()
        self.plan: StopPlan | None = None
        self.stop_notice: Notice | None = None
        self.handled: set[str] = set()
        self.terminated_at: float | None = None
        self.killed = False
        self.lease_lost = False
        started = time.time()
        queue.update_attempt(job.id, job.attempt, started_at=started)
        timeline.record(
            "started",
            at=started,
            pid=group.pid,
            command=job.spec.command,
            checkpoint_uri=checkpoint_uri_for(job.spec.checkpoint_uri),  # what `job show` reports as used
            log=str(timeline.output.path) if timeline.output.writable else None,  # what `job logs` reads
            log_uri=timeline.output.uri,  # ... and its copy in the bucket, on a cluster
            **timeline.node_data(),
        )
        self.next_heartbeat = started + config.lease_seconds / 4
        self.next_scan = started
        self.next_stop_read = started  # at once: a cancel may predate this supervisor
        self.stop_read_error: str | None = None
        self.last_save = _previous_save(queue, job)  # kept with the job: the timeline's last "saved"
        self.save_recorded: tuple[SaveMeasure, float] | None = None  # this attempt's last "saved" event

    def run(self, notices: NoticeSource) -> int:
        """Supervise until the command and everything it started are gone; its exit code."""
        while True:
            notice = notices.get(timeout=self.config.tick)
            now = time.time()
            if notice is not None and notice.event_id not in self.handled:
                self._on_notice(notice, now)
            if now >= self.next_stop_read:
                self.next_stop_read = now + self.config.stop_poll
                requested = self._read_stop_request()
                if requested is not None and requested.event_id not in self.handled:
                    self._on_notice(requested, now)
            self._read_control_files()
            if now >= self.next_scan:  # torchrun's ranks live in sessions of their own: keep track of them
                self.group.refresh_descendants()
                self.next_scan = now + 0.5
            if (now >= self.next_heartbeat or self._first_rate_known(now)) and not self.lease_lost:
                self._renew_lease(now)
            exit_code = self.group.poll()
            if exit_code is not None and not self.group.alive():
                break
            self._enforce_deadlines(now)
            if exit_code is not None and self.plan is None and self.terminated_at is None:
                # The leader is gone but processes it started linger (torchrun killed hard): clean up.
                self._signal(signal.SIGTERM, now, "the command exited but processes it started are still running")
        command_exit = self.group.wait()
        self.group.close()
        self._read_control_files()
        self.timeline.record("exit", exit_code=command_exit, **self.timeline.node_data())
        return command_exit

    def _read_stop_request(self) -> Notice | None:
        """The attempt's stop request from the queue (a `gpucloud job cancel`, or a notice a gang
        peer recorded): how a stop reaches a supervisor that no local signal told. A failed read
        is logged once per distinct failure and retried at the next poll."""
        try:
            found = self.queue.stop_request(self.job.id, self.job.attempt)
        except Exception as err:  # noqa: BLE001 - a read failure must never stop the supervision
            line = " ".join(str(err).split()) or type(err).__name__
            if line != self.stop_read_error:
                log.warning("job %s: reading its stop request failed: %s; retrying", self.job.id, line)
            self.stop_read_error = line
            return None
        self.stop_read_error = None
        return found

    def _read_control_files(self) -> None:
        """Read the session's control files; record each milestone once, at the time it happened."""
        seen, control_dir, timeline = self.seen, self.control_dir, self.timeline
        if seen.resumed is None and (payload := control.read(control_dir, control.RESUMED)) is not None:
            seen.resumed = payload
            self.queue.update_attempt(self.job.id, self.job.attempt, resumed_step=_step_of(payload))
            details = {k: v for k, v in payload.items() if k not in ("step", "written_at")}
            timeline.record("resume", at=_written_at(payload), step=_step_of(payload), **details)
        progress = control.read(control_dir, control.PROGRESS)
        seen.see_progress(progress)
        self._see_save(progress)
        if seen.acked is None and (payload := control.read(control_dir, control.ACK)) is not None:
            seen.acked = payload
            seen.see_step(payload)
            timeline.record("ack", at=_written_at(payload), step=_step_of(payload))
        if seen.committed is None and (payload := control.read(control_dir, control.COMMITTED)) is not None:
            seen.committed = payload
            seen.see_step(payload)
            timeline.record("commit", at=_written_at(payload), step=_step_of(payload))
            self._see_save(payload)
        if seen.finished is None and (payload := control.read(control_dir, control.FINISHED)) is not None:
            seen.finished = payload
            seen.see_step(payload)

    def _on_notice(self, notice: Notice, now: float) -> None:
        """Act on the notice first (the control file), record it after: a queue that is slow or
        write-locked by another process must never delay the ranks' flag. The timeline is ordered
        by each event's ``at``, so the order of the writes does not show."""
        self.handled.add(notice.event_id)
        details = {
            "kind": notice.kind,
            "source": notice.source,
            "deadline": notice.deadline,
            "action": notice.action,
            "event_id": notice.event_id,
        }
        if not notice.is_stop:
            asked_at = None
            if self.plan is None:  # a rebalance recommendation: checkpoint early, keep training
                asked_at = time.time()  # before the file exists, as for the flag below
                control.write(self.control_dir, control.SAVE, notice.to_json())
            self.timeline.record("notice", at=notice.received_at, **details)
            if asked_at is not None:
                self.timeline.record("save", at=asked_at, kind=notice.kind)
            return
        if self.plan is not None:
            self.plan = tighten(self.plan, notice, now, self.config)
            self.timeline.record("notice", at=notice.received_at, **details)
            return
        self.stop_notice = notice
        self.plan = plan_stop(notice, now, self.config)
        # Stamp the flag before the file exists: a rank may see it and ack at once, and the timeline
        # (ordered by time) must never show the ack before the flag it answers.
        flagged_at = time.time()
        control.write(self.control_dir, control.PREEMPT, notice.to_json())
        self.timeline.record("notice", at=notice.received_at, **details)
        self.timeline.record(
            "flag", at=flagged_at, deadline=self.plan.deadline, ack_by=self.plan.ack_by, commit_by=self.plan.commit_by
        )
        fit = save_fit(self.last_save, self.plan, flagged_at)
        (log.warning if fit.fits is False else log.info)("job %s: %s", self.job.id, fit.describe())
        self.timeline.record("save-fit", at=flagged_at, **fit.to_json())

    def _see_save(self, payload: dict[str, Any] | None) -> None:
        """A save the session measured: keep it, and record it with the job when it is news."""
        measure = SaveMeasure.from_payload((payload or {}).get("last_save"))
        if measure is None or measure == self.last_save:
            return
        now = time.time()
        recorded, recorded_at = self.save_recorded or (None, None)
        if should_record_save(measure, recorded, recorded_at, now):
            self.timeline.record("saved", at=now, **measure.to_json())
            self.save_recorded = (measure, now)
        self.last_save = measure

    def _first_rate_known(self, now: float) -> bool:
        """Renew once early, as soon as the attempt has a step rate: `gpucloud jobs` shows the step
        and rate seconds after training starts, not a quarter lease later. Later progress rides on
        the regular renewals (every lease_seconds / 4), so it never adds a write to the queue."""
        return not self.seen.reported_rate and self.seen.rate.rate(now) is not None

    def _renew_lease(self, now: float) -> None:
        self.next_heartbeat = now + self.config.lease_seconds / 4
        progress = self.seen.rate.progress(now)
        if progress is not None and progress.step_rate is not None:
            self.seen.reported_rate = True
        if self.queue.heartbeat(
            self.job.id, self.job.attempt, self.worker, lease_seconds=self.config.lease_seconds, progress=progress
        ):
            return
        self.lease_lost = True  # another worker took the job over; this attempt must not go on
        if self.terminated_at is None:
            self._signal(signal.SIGTERM, now, "lease lost to another worker")

    def _enforce_deadlines(self, now: float) -> None:
        decision = decide_stop(
            plan=self.plan,
            now=now,
            acked=self.seen.acked is not None,
            committed_at=_written_at(self.seen.committed),
            terminated_at=self.terminated_at,
            killed=self.killed,
            config=self.config,
        )
        if decision.action == "terminate":
            self._signal(signal.SIGTERM, now, decision.reason)
        elif decision.action == "kill":
            self._signal(signal.SIGKILL, now, decision.reason)

    def _signal(self, sig: signal.Signals, now: float, reason: str) -> None:
        # The phase says how far the session got: flagged (no ack), acked (no commit), committed.
        phase = phase_of(
            plan=self.plan,
            acked=self.seen.acked is not None,
            committed=self.seen.committed is not None,
            terminated=self.terminated_at is not None,
            killed=self.killed,
        )
        self.group.send(sig)
        if sig is signal.SIGKILL:
            self.killed = True
        else:
            self.terminated_at = now
        self.timeline.record("stop", signal=sig.name, reason=reason, phase=phase.value)

    def ending(self, command_exit: int) -> AttemptEnd:
        """How the attempt ended: control files first, exit code second (see ``classify_exit``)."""
        outcome = classify_exit(
            exit_code=command_exit,
            stop_requested=self.plan is not None or self.lease_lost,
            finished=self.seen.finished is not None,
            committed=self.seen.committed is not None,
        )
        state, reason = outcome.state, outcome.reason
        if self.lease_lost:
            state, reason = AttemptState.LOST, "lease lost to another worker"
        elif state is AttemptState.CRASHED:
            tail = [line for line in self.group.tail() if line.strip()][-3:]
            if tail:
                reason = f"{reason}; last output: {' | '.join(tail)}"
            self.timeline.record("crash", exit_code=command_exit, reason=reason)
        committed_step = _step_of(self.seen.committed)
        return AttemptEnd(
            state=state,
            exit_code=command_exit,
            last_step=self.seen.last_step,
            committed_step=committed_step,
            resumed_step=_step_of(self.seen.resumed),
            resume_from=committed_step if committed_step is not None else _latest_committed(self.job),
            reason=reason,
        )


def supervise_job(
    queue: JobQueue,
    job_id: str | None,
    *,
    worker: str | None = None,
    notices: NoticeSource,
    config: SupervisorConfig,
    local_checkpoint_dir: str | None = None,
    sink: OutputSink | None = None,
    on_event: EventHook | None = None,
    claimed: Job | None = None,
    run_root: Path | None = None,
    node: dict[str, Any] | None = None,
    log_root: Path | None = None,
) -> JobResult:
    """Claim ``job_id`` (or run the already ``claimed`` job) and run attempts until it is requeued
    by a notice (75), finished (0) or failed (the command's non-zero exit code)."""
    worker = worker or default_worker_id()
    job = claimed or _claim(queue, job_id, worker, config)
    results: list[AttemptResult] = []
    while True:
        result = run_attempt(
            queue,
            job,
            worker=worker,
            notices=notices,
            config=config,
            local_checkpoint_dir=local_checkpoint_dir,
            sink=sink,
            on_event=on_event,
            run_root=run_root,
            node=node,
            log_root=log_root,
        )
        results.append(result)
        after = result.transition.job
        if result.end.state is AttemptState.CRASHED and after.state is JobState.QUEUED:
            retry = queue.claim(worker, lease_seconds=config.lease_seconds, job_id=after.id, node=socket.gethostname())
            if retry is not None:
                job = retry
                continue
        if after.state is JobState.CANCELLED:
            code = spot_train_exit_code(AttemptState.CANCELLED, result.command_exit)
        elif result.end.state is AttemptState.FAILED or after.state is JobState.FAILED:
            code = spot_train_exit_code(AttemptState.FAILED, result.command_exit)
        else:
            code = result.exit_code
        return JobResult(
            job=queue.get(after.id),
            attempts=results,
            exit_code=code,
            # A cancel stops the job, not the node: a worker goes on to the next job.
            node_stopping=result.stop_notice is not None and not is_cancel(result.stop_notice),
        )


def claim_single_node_job(
    queue: JobQueue,
    worker: str,
    *,
    lease_seconds: float,
    node: str | None = None,
    on_skip: Callable[[Job], None] | None = None,
) -> Job | None:
    """Claim the oldest claimable job of one node for ``worker``, leaving gang jobs alone.

    A job with ``nodes > 1`` needs a gang of agents (``gpucloud agent``); one worker running it
    would start every rank on a single node. Both backends' ``claim`` skip gangs themselves (on SQS
    a gang's slot messages are handed back for the agents); each gang job waiting is told to
    ``on_skip`` so the operator learns why it stays queued.
    """
    if on_skip is not None:
        now = time.time()
        for job in queue.list_jobs([JobState.QUEUED, JobState.RUNNING]):
            expired = job.state is JobState.QUEUED or (job.lease_until is not None and job.lease_until < now)
            if job.spec.nodes > 1 and expired:
                on_skip(job)
    return queue.claim(worker, lease_seconds=lease_seconds, node=node)


def _claim(queue: JobQueue, job_id: str | None, worker: str, config: SupervisorConfig) -> Job:
    job = queue.claim(worker, lease_seconds=config.lease_seconds, job_id=job_id, node=socket.gethostname())
    if job is not None:
        return job
    if job_id is None:
        raise UserError(f"no queued job in {queue.uri}")
    current = queue.get(job_id)  # raises UnknownJob with its own message
    if current.state.terminal:
        again = (
            f"`gpucloud job resume {job_id}` gives it a new attempt"
            if current.state in RESUMABLE
            else "submit a new job to run it again"
        )
        raise UserError(f"job {job_id} is already {current.state.value}; {again}")
    raise UserError(
        f"job {job_id} is running on worker {current.worker} (lease until "
        f"{time.strftime('%H:%M:%S', time.localtime(current.lease_until or 0))}); it becomes claimable when that lease expires"
    )


def _latest_committed(job: Job) -> int | None:
    """The step the next attempt will restore, for the timeline; unknown when the store cannot be read."""
    from gpucloud.checkpoint.store import latest_committed

    try:
        return latest_committed(checkpoint_uri_for(job.spec.checkpoint_uri), job.id)
    except Exception as err:  # noqa: BLE001 - informational only; the next attempt's restore decides
        log.warning("could not read the latest committed checkpoint of job %s: %s", job.id, err)
        return None


def _previous_save(queue: JobQueue, job: Job) -> SaveMeasure | None:
    """The last save an earlier attempt measured (the job's timeline); None when unknown."""
    try:
        return last_save_from_events(queue.events(job.id))
    except Exception as err:  # noqa: BLE001 - only the notice-time estimate is lost; the job runs on
        log.warning("could not read the saves measured for job %s: %s", job.id, err)
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
