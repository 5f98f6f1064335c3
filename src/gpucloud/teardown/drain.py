"""Draining a cluster's job queue before its nodes are destroyed: stop requests, then wait for commits.

Every running attempt gets a stop request through the job table (``JobQueue.request_stop``, the
path a spot notice and ``gpucloud job cancel`` take to every member of a gang). Its ranks save a
step, the attempt ends REQUEUED, and attempt k+1 is queued to resume at the committed step. Queued
jobs are left queued. Where the queue is the stack's own, the destroy deletes it with them: what
outlives the stack is the checkpoints, where they are outside it or kept (``teardown/unfinished.py``
lists each job and the fate of its checkpoints).

Idle agents of the cluster being drained may claim a queued attempt meanwhile (they do not know
the cluster is going away); the drain stops those too, until nothing runs or the time is up. An
attempt whose lease already ran out has no live supervisor to commit anything: it is not waited
for (whoever serves the queue next takes it over, from its last commit).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable

from gpucloud.lifecycle.model import Attempt, JobState, requested_stop_notice
from gpucloud.queue.protocol import JobQueue
from gpucloud.signals.events import Notice

TEARDOWN_SOURCE = "teardown"  # the stop notice's ``source``: the timeline says who asked
DEFAULT_DRAIN_TIMEOUT_S = 600.0  # the node groups' default drain timeout (spec drain_timeout_seconds)
POLL_INTERVAL_S = 2.0  # between reads of the queue while waiting (one list plus a get per job asked)


def teardown_notice(stack: str, job_id: str, attempt: int, *, now: float, grace_seconds: float) -> Notice:
    """The stop notice recorded on a running attempt: supervisors save a step by the deadline and
    end the attempt REQUEUED, and the node takes no more work (``JobResult.node_stopping``: only a
    cancel's notice keeps a worker going)."""
    return requested_stop_notice(
        TEARDOWN_SOURCE,
        event_id=f"teardown-{stack}-{job_id}-{attempt}",
        now=now,
        grace_seconds=grace_seconds,
        payload={"reason": f"gpucloud teardown of stack {stack}", "stack": stack},
    )


@dataclasses.dataclass(frozen=True)
class StoppedAttempt:
    """A running attempt the drain stopped (or found stopping), and how it ended."""

    job_id: str
    attempt: int
    ended: str | None = None  # the attempt's end state (requeued, finished, cancelled, ...); None: still running
    committed_step: int | None = None
    job_state: str | None = None  # the job afterwards (queued: attempt k+1 waits to resume at the commit)

    def to_json(self) -> dict[str, object]:
        return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True)
class DrainResult:
    stopped: tuple[StoppedAttempt, ...]  # every attempt asked to stop, in the order asked
    orphaned: tuple[str, ...]  # running with an expired lease: nobody to commit, not waited for
    queued: tuple[str, ...]  # left queued (attempts the drain requeued among them)
    timed_out: bool

    @property
    def still_running(self) -> tuple[StoppedAttempt, ...]:
        return tuple(s for s in self.stopped if s.ended is None)

    def to_json(self) -> dict[str, object]:
        return {
            "stopped": [s.to_json() for s in self.stopped],
            "still_running": [s.job_id for s in self.still_running],
            "orphaned": list(self.orphaned),
            "left_queued": list(self.queued),
            "timed_out": self.timed_out,
        }


def drain(
    queue: JobQueue,
    stack: str,
    *,
    timeout_s: float = DEFAULT_DRAIN_TIMEOUT_S,
    progress: Callable[[str], None] = lambda line: None,
    poll_s: float = POLL_INTERVAL_S,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> DrainResult:
    """Stop every running attempt of ``queue`` and wait, up to ``timeout_s``, until each has ended."""
    deadline = clock() + timeout_s
    asked: dict[tuple[str, int], StoppedAttempt] = {}
    orphaned: set[tuple[str, int]] = set()
    next_report = clock()
    while True:
        now = time.time()
        for job in queue.list_jobs([JobState.RUNNING]):
            key = (job.id, job.attempt)
            if key in asked:
                continue
            if job.lease_until is not None and job.lease_until < now:
                if key not in orphaned:
                    orphaned.add(key)
                    progress(f"{job.id} attempt {job.attempt}: its lease ran out (no live node); not waited for")
                continue
            applied = queue.request_stop(
                job.id, job.attempt, teardown_notice(stack, job.id, job.attempt, now=now, grace_seconds=timeout_s)
            )
            step = "" if job.last_step is None else f" at step {job.last_step}"
            progress(
                f"{job.id} attempt {job.attempt}{step}: "
                + ("stop requested, saving a step" if applied else "already stopping (a stop was requested before)")
            )
            asked[key] = StoppedAttempt(job.id, job.attempt)
        for key, stopped in list(asked.items()):
            if stopped.ended is None:
                asked[key] = _settled(queue, stopped, progress)
        waiting = [s for s in asked.values() if s.ended is None]
        if not waiting and not _unasked_running(queue, set(asked) | orphaned):
            return _result(queue, asked, orphaned, timed_out=False)
        if clock() >= deadline:
            progress(f"drain timed out after {timeout_s:.0f} s; still running: {', '.join(s.job_id for s in waiting)}")
            return _result(queue, asked, orphaned, timed_out=True)
        if clock() >= next_report:
            left = max(0.0, deadline - clock())
            progress(f"waiting for {len(waiting)} job(s) to commit and stop ({left:.0f} s left)")
            next_report = clock() + 30.0
        sleep(poll_s)


def _settled(queue: JobQueue, stopped: StoppedAttempt, progress: Callable[[str], None]) -> StoppedAttempt:
    """``stopped`` with its end filled in once the job has left that running attempt."""
    job = queue.get(stopped.job_id)
    if job.state is JobState.RUNNING and job.attempt == stopped.attempt:
        return stopped
    row = _attempt(queue, stopped.job_id, stopped.attempt)
    ended = row.state.value if row is not None else "ended"
    committed = row.committed_step if row is not None else None
    settled = dataclasses.replace(stopped, ended=ended, committed_step=committed, job_state=job.state.value)
    saved = "no step committed" if committed is None else f"committed step {committed}"
    after = f"attempt {job.attempt} queued" if job.state is JobState.QUEUED else f"job {job.state.value}"
    progress(f"{stopped.job_id} attempt {stopped.attempt}: {ended}, {saved}; {after}")
    return settled


def _attempt(queue: JobQueue, job_id: str, number: int) -> Attempt | None:
    return next((a for a in queue.attempts(job_id) if a.number == number), None)


def _unasked_running(queue: JobQueue, seen: set[tuple[str, int]]) -> bool:
    """Whether an attempt runs that the next round would ask to stop (claimed since this round's list)."""
    return any((job.id, job.attempt) not in seen for job in queue.list_jobs([JobState.RUNNING]))


def _result(
    queue: JobQueue,
    asked: dict[tuple[str, int], StoppedAttempt],
    orphaned: set[tuple[str, int]],
    *,
    timed_out: bool,
) -> DrainResult:
    queued = tuple(job.id for job in queue.list_jobs([JobState.QUEUED]))
    lost = tuple(sorted({job_id for job_id, _ in orphaned}))
    return DrainResult(stopped=tuple(asked.values()), orphaned=lost, queued=queued, timed_out=timed_out)
