"""gpucloud teardown's drain (gpucloud.teardown.drain) on the real queue backends: the embedded
SQLite file and SQS + DynamoDB on the moto server. The node agents are simulated through the queue."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from tests.jobqueue.aws_fixtures import aws_job_plane  # noqa: F401  (fixture)
from tests.teardown.teardown_fakes import SPEC, STACK, SimulatedAgent, running_job

from gpucloud.lifecycle.model import AttemptEnd, AttemptState, JobState
from gpucloud.queue.connect import open_queue
from gpucloud.queue.protocol import JobQueue
from gpucloud.queue.sqlite import SqliteQueue
from gpucloud.teardown.drain import TEARDOWN_SOURCE, drain
from helpers.waiting import wait_for

FAST = {"poll_s": 0.05}


@pytest.fixture(params=["sqlite", "aws"])
def connect(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Callable[[], JobQueue]]:
    """A factory of connections to one fresh queue of the backend."""
    opened: list[JobQueue] = []
    uri = request.getfixturevalue("aws_job_plane")["uri"] if request.param == "aws" else None

    def factory() -> JobQueue:
        q: JobQueue = SqliteQueue(tmp_path / "drain.db") if uri is None else open_queue(uri)
        opened.append(q)
        return q

    yield factory
    for q in opened:
        q.close()


def test_drain_stops_running_jobs_waits_for_the_commit_and_leaves_queued_ones(connect) -> None:
    queue = connect()
    job = running_job(queue)
    waiting = queue.submit(job.spec)
    agent = SimulatedAgent(connect, job.id, job.attempt, step=7)
    agent.start()
    lines: list[str] = []
    result = drain(queue, STACK, timeout_s=120, progress=lines.append, **FAST)
    agent.join(timeout=60)
    assert agent.error is None
    assert not result.timed_out
    [stopped] = result.stopped
    assert (stopped.job_id, stopped.attempt, stopped.ended, stopped.committed_step) == (job.id, 1, "requeued", 7)
    assert stopped.job_state == "queued"  # attempt 2 waits to resume at step 7
    assert set(result.queued) == {job.id, waiting.id}
    assert queue.get(waiting.id).state is JobState.QUEUED and queue.get(waiting.id).attempt == 1
    request = queue.stop_request(job.id, 1)
    assert request is not None and request.source == TEARDOWN_SOURCE and STACK in request.payload["reason"]
    assert any("stop requested" in line for line in lines)
    assert any("committed step 7; attempt 2 queued" in line for line in lines)


def test_drain_times_out_when_no_one_commits(connect) -> None:
    queue = connect()
    job = running_job(queue)
    result = drain(queue, STACK, timeout_s=0.2, **FAST)
    assert result.timed_out
    assert [s.job_id for s in result.still_running] == [job.id]
    assert queue.get(job.id).state is JobState.RUNNING


def test_an_idle_queue_drains_at_once(tmp_path: Path) -> None:
    queue = SqliteQueue(tmp_path / "idle.db")
    queued = queue.submit(SPEC)
    result = drain(queue, STACK, timeout_s=0.0, **FAST)
    assert not result.timed_out and result.stopped == () and result.queued == (queued.id,)


def test_an_attempt_whose_lease_ran_out_is_not_waited_for(tmp_path: Path) -> None:
    queue = SqliteQueue(tmp_path / "orphan.db")
    job = queue.submit(SPEC)
    claimed = queue.claim("dead-node", lease_seconds=0.01, job_id=job.id)
    assert claimed is not None and claimed.lease_until is not None
    wait_for(lambda: time.time() > claimed.lease_until + 0.01, what="the lease to run out")
    result = drain(queue, STACK, timeout_s=60, **FAST)
    assert not result.timed_out and result.stopped == () and result.orphaned == (job.id,)
    assert queue.stop_request(job.id, 1) is None


def test_an_attempt_claimed_again_during_the_drain_is_stopped_too(tmp_path: Path) -> None:
    """An idle agent of the doomed cluster claims the requeued attempt between the drain's reads:
    the drain stops that attempt too. The interleaving is made exact by doing the agent's part when
    the drain reads the job (``_Interleaved.get``), on the real queue."""
    queue = _Interleaved(SqliteQueue(tmp_path / "reclaim.db"))
    job = running_job(queue.real)
    result = drain(queue, STACK, timeout_s=60, **FAST)
    assert [(s.attempt, s.ended, s.committed_step) for s in result.stopped] == [(1, "requeued", 7), (2, "requeued", 8)]
    assert queue.real.get(job.id).state is JobState.QUEUED and queue.real.get(job.id).attempt == 3


class _Interleaved:
    """The real queue, where reading a job whose running attempt was asked to stop first has its
    node commit step ``6 + attempt`` and end it; after attempt 1 another node claims attempt 2 at once."""

    def __init__(self, real: SqliteQueue) -> None:
        self.real = real

    def __getattr__(self, name: str):
        return getattr(self.real, name)

    def get(self, job_id: str):
        job = self.real.get(job_id)
        if job.state is JobState.RUNNING and self.real.stop_request(job_id, job.attempt) is not None:
            step = 6 + job.attempt
            end = AttemptEnd(state=AttemptState.REQUEUED, last_step=step, committed_step=step, resume_from=step)
            self.real.end_attempt(job_id, job.attempt, end)
            if job.attempt == 1:
                assert self.real.claim("node-b", lease_seconds=600, job_id=job_id) is not None
            job = self.real.get(job_id)
        return job


def test_a_real_supervisor_saves_its_step_and_requeues_on_the_drain(tmp_path: Path) -> None:
    """The drain's stop request read by the real supervisor (``supervise_job``, as the agent and the
    worker run it) of a cooperative training command: a step saved, the attempt requeued, the node told
    to stop taking work."""
    import sys
    import textwrap
    import threading

    from gpucloud.jobs.runner import supervise_job
    from gpucloud.jobs.supervisor import SupervisorConfig
    from gpucloud.lifecycle.model import JobSpec
    from helpers.notices import Inbox
    from jobs.test_runner import COOPERATIVE

    fast = SupervisorConfig(ack_timeout=5.0, stop_margin=1.0, exit_grace=5.0, kill_after=1.0, tick=0.02, stop_poll=0.1)
    path = tmp_path / "real.db"
    train = tmp_path / "train.py"
    train.write_text(textwrap.dedent(COOPERATIVE))
    queue = SqliteQueue(path)
    job = queue.submit(JobSpec(command=[sys.executable, str(train)]))
    outcome: dict = {}
    node = threading.Thread(
        target=lambda: outcome.setdefault(
            "r", supervise_job(SqliteQueue(path), job.id, notices=Inbox(), config=fast, worker="node-a")
        )
    )
    node.start()
    try:
        wait_for(lambda: any(e.kind == "resume" for e in queue.events(job.id)), what="the command to start")
        result = drain(queue, STACK, timeout_s=120, **FAST)
    finally:
        node.join(timeout=60)
    assert not node.is_alive() and not result.timed_out
    [stopped] = result.stopped
    assert stopped.ended == "requeued" and stopped.committed_step is not None and stopped.committed_step >= 1
    assert outcome["r"].node_stopping is True  # the node takes no more work: the cluster is going away
    after = queue.get(job.id)
    assert after.state is JobState.QUEUED and after.attempt == 2 and result.queued == (job.id,)
    kinds = [e.kind for e in queue.events(job.id)]
    assert {"stop-request", "flag", "ack", "commit", "requeue"} <= set(kinds)
