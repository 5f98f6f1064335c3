"""Stop requests reach the supervisor: a request in the job table flags a real process's ranks like a
local notice and the attempt ends REQUEUED; an agent's own stop notice is recorded for its gang."""

from __future__ import annotations

import threading
import time

import pytest

from gpucloud import control
from gpucloud.agent.asg_hooks import OfflineHooks
from gpucloud.agent.identity import NodeIdentity
from gpucloud.agent.loop import Agent, AgentOptions
from gpucloud.agent.table_notices import TableNotices, request_gang_stop
from gpucloud.jobs.runner import run_attempt
from gpucloud.lifecycle.model import AttemptState, JobSpec, JobState
from gpucloud.queue.sqlite import SqliteQueue
from gpucloud.signals.events import Notice, event_id_for
from helpers.notices import Inbox  # the supervisor tests' hand-fed notice source
from helpers.waiting import wait_for
from jobs.test_runner import COOPERATIVE, FAST, script  # a cooperative training script as a real process

INSTANCE = "i-1234567890abcdef0"


def warning(lead: float = 30.0, *, instance: str | None = INSTANCE, source: str = "queue") -> Notice:
    body = {"instance-id": instance, "time": time.time()} if instance else {"action": "terminate", "time": time.time()}
    return Notice(
        kind="spot-interruption",
        source=source,
        deadline=time.time() + lead,
        received_at=time.time(),
        event_id=event_id_for("spot-interruption", body),
        action="terminate",
        payload=body,
    )


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class FlakyQueue:
    """A queue whose stop-request reads fail ``failures`` times, then answer ``notice``."""

    def __init__(self, notice: Notice | None, failures: int = 0) -> None:
        self.notice, self.failures, self.reads = notice, failures, 0

    def stop_request(self, job_id: str, attempt: int) -> Notice | None:
        self.reads += 1
        if self.reads <= self.failures:
            raise ConnectionError("table unreachable")
        return self.notice


def test_the_request_is_read_at_once_then_every_interval_and_yielded_once():
    clock, inbox, request = Clock(), Inbox(), warning()
    table = FlakyQueue(None)
    seen: list[Notice] = []
    notices = TableNotices(inbox, table, "j1", 1, interval=1.0, on_table_notice=seen.append, clock=clock)
    assert notices.get(0.0) is None and table.reads == 1  # read at once
    assert notices.get(0.0) is None and table.reads == 1  # not again within the interval
    own = warning(instance=None, source="imds")
    inbox.put(own)
    assert notices.get(0.0) is own  # the node's own notices pass through
    table.notice = request
    clock.now = 1.0
    assert notices.get(0.0) is request and seen == [request] and notices.found is request
    clock.now = 5.0
    assert notices.get(0.0) is None and table.reads == 2  # found: no more reads


def test_a_failing_read_is_logged_once_and_retried_at_the_next_interval(caplog):
    clock, request = Clock(), warning()
    table = FlakyQueue(request, failures=3)
    notices = TableNotices(Inbox(), table, "j1", 1, interval=1.0, clock=clock)
    with caplog.at_level("WARNING"):
        for tick in range(3):
            clock.now = float(tick)
            assert notices.get(0.0) is None
        clock.now = 3.0
        assert notices.get(0.0) is request
    assert caplog.text.count("reading the stop request of j1 attempt 1 failed: table unreachable") == 1


def test_a_bad_interval_is_refused():
    with pytest.raises(ValueError, match="more than 0 seconds"):
        TableNotices(Inbox(), FlakyQueue(None), "j1", 1, interval=0)


def test_a_stop_request_in_the_table_flags_the_ranks_and_the_attempt_is_requeued(tmp_path):
    q = SqliteQueue(tmp_path / "queue.db")
    submitted = q.submit(JobSpec(command=script(tmp_path, "coop.py", COOPERATIVE), nodes=2, max_attempts=1))
    worker = f"gang:{submitted.id}:1"
    job = q.claim(worker, lease_seconds=60, job_id=submitted.id, attempt=1)
    result: dict = {}
    notices = TableNotices(Inbox(), q, job.id, 1, interval=0.1)
    thread = threading.Thread(
        target=lambda: result.setdefault(
            "r", run_attempt(q, job, worker=worker, notices=notices, config=FAST, run_root=tmp_path / "run")
        )
    )
    thread.start()
    wait_for(lambda: "resume" in [e.kind for e in q.events(job.id)], timeout=30, what="the command to start training")
    request = warning()
    other_member = SqliteQueue(tmp_path / "queue.db")  # e.g. the events-queue handler of another agent
    assert request_gang_stop(other_member, job.id, 1, request) is True
    thread.join(timeout=60)
    r = result["r"]
    assert r.end.state is AttemptState.REQUEUED and r.exit_code == 75
    assert r.stop_notice.event_id == request.event_id and r.stop_notice.deadline == request.deadline
    preempt = control.read(tmp_path / "run" / job.id / "attempt-1" / "control", control.PREEMPT)
    assert preempt["event_id"] == request.event_id  # the ranks were flagged with the table's notice
    kinds = [e.kind for e in q.events(job.id)]
    assert kinds.index("stop-request") < kinds.index("flag") < kinds.index("ack") < kinds.index("commit")
    (noticed,) = [e for e in q.events(job.id) if e.kind == "notice"]
    assert (noticed.data["source"], noticed.data["deadline"]) == ("queue", request.deadline)
    after = q.get(job.id)
    # REQUEUED, not CRASHED: with max_attempts=1 a crash would have FAILED the job.
    assert (after.state, after.attempt, after.crashes) == (JobState.QUEUED, 2, 0)


def test_an_agents_own_stop_notice_is_recorded_for_its_gang(tmp_path):
    q = SqliteQueue(tmp_path / "queue.db")
    job = q.submit(JobSpec(command=script(tmp_path, "coop.py", COOPERATIVE)))
    inbox = Inbox()
    identity = NodeIdentity(worker="a:1", address="127.0.0.1", instance_id=INSTANCE, lifecycle="spot")
    agent = Agent(
        q,
        identity,
        inbox,
        OfflineHooks(),
        FAST,
        AgentOptions(slot_lease=4.0, poll_interval=0.1, idle_exit=30.0, run_root=tmp_path / "run"),
    )
    result: dict = {}
    thread = threading.Thread(target=lambda: result.setdefault("summary", agent.run()))
    thread.start()
    wait_for(lambda: "resume" in [e.kind for e in q.events(job.id)], timeout=30, what="the attempt to start training")
    own = warning(instance=None, source="imds")  # IMDS notices carry no instance id
    inbox.put(own)
    thread.join(timeout=60)
    assert result["summary"].stopped_by == "spot-interruption"
    (event,) = [e for e in q.events(job.id) if e.kind == "stop-request"]
    assert (event.attempt, event.data["event_id"], event.data["instance_id"]) == (1, own.event_id, INSTANCE)
    assert [e.kind for e in q.events(job.id)].count("flag") == 1  # the copy in the table is not a second notice
    assert q.attempts(job.id)[0].state is AttemptState.REQUEUED


def test_a_notice_the_node_took_before_the_attempt_is_yielded_first():
    inbox, early = Inbox(), warning(instance=None, source="imds")
    notices = TableNotices(inbox, FlakyQueue(None), "j1", 1, first=early, clock=Clock())
    assert notices.get(0.0) is early
    assert notices.get(0.0) is None
