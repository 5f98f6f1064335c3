"""The agent loop against a real SQLite queue and real processes (torchrun for gangs)."""

from __future__ import annotations

import socket
import sys
import threading
import time
from pathlib import Path

import pytest

from gpucloud.agent.asg_hooks import OfflineHooks
from gpucloud.agent.identity import NodeIdentity
from gpucloud.agent.loop import EXIT_STOPPED, Agent, AgentOptions
from gpucloud.errors import UserError
from gpucloud.jobs.supervisor import SupervisorConfig
from gpucloud.lifecycle.model import JobSpec, JobState, NodeState
from gpucloud.queue import gang
from gpucloud.queue.sqlite import SqliteQueue
from gpucloud.signals.events import Notice, event_id_for
from helpers.notices import Inbox  # the same hand-fed notice source the supervisor tests use

CONFIG = SupervisorConfig(lease_seconds=10.0, ack_timeout=5.0, stop_margin=1.0, kill_after=2.0)


class RecordingHooks(OfflineHooks):
    """The offline hooks plus a log of what the agent asked the fleet for, and when."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, object]] = []

    def busy(self, busy: bool) -> None:
        self.calls.append(("busy", busy))

    def noticed(self) -> str:
        self.calls.append(("noticed", None))
        return "recorded"

    def committed(self) -> bool:
        self.calls.append(("committed", None))
        return True


def spot(lead: float = 60.0) -> Notice:
    body = {"action": "terminate", "time": time.time() + lead}
    return Notice(
        kind="spot-interruption",
        source="test",
        deadline=time.time() + lead,
        received_at=time.time(),
        event_id=event_id_for("spot-interruption", body),
        action="terminate",
        payload=body,
    )


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def make_agent(tmp_path: Path, name: str, *, inbox: Inbox | None = None, hooks=None, **options) -> Agent:
    queue = SqliteQueue(tmp_path / "queue.db")
    opts = AgentOptions(
        **{"slot_lease": 4.0, "poll_interval": 0.1, "idle_exit": 1.0, "run_root": tmp_path / name / "run", **options}
    )
    return Agent(
        queue,
        NodeIdentity(worker=name, address="127.0.0.1", instance_type="c5.large", lifecycle="spot"),
        inbox or Inbox(),
        hooks or OfflineHooks(),
        CONFIG,
        opts,
    )


def test_an_agent_runs_a_one_node_job_and_exits_when_idle(tmp_path):
    q = SqliteQueue(tmp_path / "queue.db")
    job = q.submit(JobSpec(command=[sys.executable, "-c", "print('trained')"]))
    hooks = RecordingHooks()
    summary = make_agent(tmp_path, "a", hooks=hooks).run()
    assert summary.exit_code == 0 and summary.stopped_by is None
    assert [(r.job_id, r.slot, r.state) for r in summary.ran] == [(job.id, 0, "finished")]
    assert q.get(job.id).state is JobState.FINISHED
    (node,) = q.nodes()
    assert (node.id, node.state, node.instance_type, node.lifecycle) == ("a", NodeState.STOPPED, "c5.large", "spot")
    assert ("busy", True) in hooks.calls and hooks.calls[-1] == ("busy", False)


def test_a_gang_that_does_not_form_gives_its_slot_back_and_keeps_the_attempt(tmp_path):
    q = SqliteQueue(tmp_path / "queue.db")
    job = q.submit(JobSpec(command=["torchrun", "train.py"], nodes=2))
    summary = make_agent(tmp_path, "lonely", gang_timeout=1.0, idle_exit=0.5).run()
    assert summary.ran == ()
    assert q.slot_claims(job.id, 1) == []
    after = q.get(job.id)
    assert (after.state, after.attempt) == (JobState.QUEUED, 1)


def test_a_stop_notice_while_idle_stops_the_agent_and_asks_for_a_replacement(tmp_path):
    inbox, hooks = Inbox(), RecordingHooks()
    inbox.put(spot())
    summary = make_agent(tmp_path, "noticed", inbox=inbox, hooks=hooks, idle_exit=30.0).run()
    assert (summary.exit_code, summary.stopped_by) == (EXIT_STOPPED, "spot-interruption")
    assert ("noticed", None) in hooks.calls
    assert SqliteQueue(tmp_path / "queue.db").nodes()[0].state is NodeState.STOPPED


def test_the_agent_refuses_bad_options_with_one_line_each():
    with pytest.raises(UserError, match="--rendezvous-port 70000"):
        AgentOptions(rendezvous_port=70000)
    with pytest.raises(UserError, match="more than 0 seconds"):
        AgentOptions(gang_timeout=0)


@pytest.mark.slow
def test_two_agents_form_a_gang_and_run_torchrun_across_both(tmp_path):
    q = SqliteQueue(tmp_path / "queue.db")
    out = tmp_path / "ranks"
    out.mkdir()
    script = f"import os, pathlib; pathlib.Path({str(out)!r}, os.environ['RANK']).write_text(os.environ['WORLD_SIZE'])"
    job = q.submit(JobSpec(command=[sys.executable, "-c", script], nodes=2))
    port = free_port()
    agents = [make_agent(tmp_path, name, rendezvous_port=port, idle_exit=1.5) for name in ("a", "b")]
    results: dict[str, object] = {}
    threads = [threading.Thread(target=lambda a=a: results.__setitem__(a.identity.worker, a.run())) for a in agents]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert q.get(job.id).state is JobState.FINISHED
    assert sorted(p.name for p in out.iterdir()) == ["0", "1"]  # one rank on each node
    assert {p.read_text() for p in out.iterdir()} == {"2"}
    slots = sorted(r.slot for s in results.values() for r in s.ran)
    assert slots == [0, 1]
    kinds = [e.kind for e in q.events(job.id)]
    assert kinds.count("claimed") == 1 and kinds.count("finish") == 1
    assert q.get(job.id).worker is None and gang.gang_worker(job.id, 1) in [
        e.data.get("worker") for e in q.events(job.id)
    ]


def test_a_sigterm_stops_the_agent_without_detaching_a_healthy_node(tmp_path):
    inbox, hooks = Inbox(), RecordingHooks()
    body = {"signal": "SIGTERM"}
    inbox.put(
        Notice(
            kind="sigterm",
            source="signal",
            deadline=time.time() + 30,
            received_at=time.time(),
            event_id=event_id_for("sigterm", body),
            payload=body,
        )
    )
    summary = make_agent(tmp_path, "restarted", inbox=inbox, hooks=hooks, idle_exit=30.0).run()
    assert summary.stopped_by == "sigterm"
    assert ("noticed", None) not in hooks.calls


def test_an_agent_runs_a_job_from_the_aws_queue(tmp_path, fresh_aws_account):
    from gpucloud.queue.connect import open_queue
    from jobqueue.aws_fixtures import create_job_plane  # tests/jobqueue, a top-level package under pytest

    plane = create_job_plane(fresh_aws_account)
    uri = f"aws://us-east-1?table={plane['table']}&queue={plane['queue_url']}"
    q = open_queue(uri)
    job = q.submit(JobSpec(command=[sys.executable, "-c", "print('on aws')"]))
    agent = Agent(
        q,
        NodeIdentity(worker="i-1:1", address="10.0.0.1", lifecycle="on-demand"),
        Inbox(),
        OfflineHooks(),
        CONFIG,
        AgentOptions(slot_lease=4.0, poll_interval=0.1, idle_exit=0.5, run_root=tmp_path / "run"),
    )
    summary = agent.run()
    assert [(r.job_id, r.state) for r in summary.ran] == [(job.id, "finished")]
    assert q.get(job.id).state is JobState.FINISHED
    assert [(c.slot, c.worker) for c in q.slot_claims(job.id, 1)] == [(0, "i-1:1")]
    assert [(n.id, n.state, n.lifecycle) for n in q.nodes()] == [("i-1:1", NodeState.STOPPED, "on-demand")]
