"""Several node groups scale independently and a job falls back to another group after a wait in
the queue, on the SQLite backend.

What a group's backlog alarm adds is ``BusyNodes + UnclaimedSlots - GroupDesiredCapacity`` of that
group (``cluster/scaling_plan.py``); the agents publish the two counts. An idle group must publish
zeros while another group runs or waits, or its alarm scales it out for work it will never take.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from gpucloud.agent.asg_hooks import OfflineHooks
from gpucloud.agent.fleet_view import fleet_state
from gpucloud.agent.identity import NodeIdentity
from gpucloud.agent.loop import Agent, AgentOptions
from gpucloud.agent.node_groups import NodeGroups
from gpucloud.agent.scaling import GroupBounds, desired_capacity
from gpucloud.jobs.supervisor import SupervisorConfig
from gpucloud.lifecycle.model import AttemptEnd, AttemptState, JobSpec, JobState, NodeRecord, NodeState
from gpucloud.queue import gang
from gpucloud.queue.sqlite import SqliteQueue
from helpers.notices import Inbox

CLUSTER = ("a", "b")
LEASE = 60.0


class PublishingHooks(OfflineHooks):
    """Offline hooks that keep what the agent published for its group's alarm."""

    def __init__(self) -> None:
        self.published: list[tuple[int, int]] = []
        self.others: list[dict[str, tuple[int, int]]] = []

    def publish_backlog(
        self,
        *,
        unclaimed_slots: int,
        busy_nodes: int,
        other_groups: dict[str, tuple[int, int]] | None = None,
        fallback_due: dict[tuple[str, float], int] | None = None,
    ) -> None:
        self.published.append((unclaimed_slots, busy_nodes))
        self.others.append(dict(other_groups or {}))


def groups(own: str) -> NodeGroups:
    return NodeGroups(own=own, names=CLUSTER)


def accepts(own: str):
    return lambda job, at: groups(own).takes(job.spec, queued_for=gang.queued_for(job, at))


def run_a_gang(queue: SqliteQueue, nodes: int) -> None:
    """Group a runs a gang of ``nodes``: every member holds its slot and reports itself running."""
    job = queue.submit(JobSpec(command=["train"], nodes=nodes, group="a"))
    claims = [
        gang.claim_slot(queue, f"a{i}", f"10.0.0.{i}", lease_seconds=LEASE, accepts=accepts("a")) for i in range(nodes)
    ]
    assert gang.start_gang(queue, claims[0], lease_seconds=LEASE) is not None
    for claim in claims:
        queue.register_node(
            NodeRecord(
                id=claim.worker,
                address=claim.address,
                state=NodeState.RUNNING,
                group="a",
                job_id=job.id,
                attempt=1,
                slot=claim.slot,
                updated_at=time.time(),
            )
        )
    assert queue.get(job.id).state is JobState.RUNNING


def idle_agent(tmp_path: Path, hooks: PublishingHooks, group: str = "b") -> Agent:
    return Agent(
        SqliteQueue(tmp_path / "queue.db"),
        NodeIdentity(worker=f"{group}0", address="10.0.1.1"),
        Inbox(),
        hooks,
        SupervisorConfig(lease_seconds=10.0, ack_timeout=5.0, stop_margin=1.0, kill_after=2.0),
        # idle_exit 0: one idle round (claim, count, publish), then exit
        AgentOptions(
            slot_lease=LEASE, poll_interval=0.1, idle_exit=0.0, groups=groups(group), run_root=tmp_path / "run"
        ),
    )


def shortfall(busy: int, unclaimed: int, desired: int) -> int:
    """The backlog alarm's value for one group (scaling_plan.SHORTFALL_EXPRESSION); > 0 adds nodes."""
    return busy + unclaimed - desired


@pytest.mark.parametrize("a_waits", [False, True], ids=["no-queued-job", "a-gang-queued-too"])
def test_idle_group_b_does_not_scale_out_for_group_a(tmp_path, a_waits) -> None:
    """A busy with 4 nodes, B idle with 1 node: B's agent publishes 0 busy and 0 unclaimed, so B's
    alarm stays below its threshold (it published A's 4 busy nodes before: +3 nodes for B)."""
    queue = SqliteQueue(tmp_path / "queue.db")
    run_a_gang(queue, 4)
    if a_waits:  # a gang of a waiting for a's nodes must not be b's backlog either
        queue.submit(JobSpec(command=["train"], nodes=2, group="a"))
    hooks = PublishingHooks()
    summary = idle_agent(tmp_path, hooks).run()

    assert summary.ran == ()
    assert hooks.published == [(0, 0)]
    assert hooks.others == [{"a": (2 if a_waits else 0, 4)}]  # a's counts go under a's dimension
    unclaimed, busy = hooks.published[0]
    assert shortfall(busy, unclaimed, desired=1) <= 0  # B's alarm: no scale-out
    b_fleet = fleet_state(queue, node_lease=LEASE, groups=groups("b"))
    assert desired_capacity(b_fleet, GroupBounds(min_size=0, max_size=4)).desired == 0  # B's node may go
    a_fleet = fleet_state(queue, node_lease=LEASE, groups=groups("a"))
    assert (a_fleet.busy_nodes, sum(g.unclaimed for g in a_fleet.waiting)) == (4, 2 if a_waits else 0)
    (record,) = [n for n in queue.nodes() if n.id == "b0"]
    assert record.group == "b"


def test_a_group_with_no_node_has_its_backlog_published_by_the_others(tmp_path) -> None:
    """b has no node (no agent of its own to publish): a's idle agent publishes b's 3 unclaimed
    slots under b's dimension, so b's alarm scales b out; a's own counts stay 0."""
    queue = SqliteQueue(tmp_path / "queue.db")
    queue.submit(JobSpec(command=["train"], nodes=3, group="b"))
    hooks = PublishingHooks()
    idle_agent(tmp_path, hooks, group="a").run()
    assert hooks.published == [(0, 0)]
    assert hooks.others == [{"b": (3, 0)}]


def test_a_job_falls_back_to_another_group_after_the_wait_and_not_before(tmp_path) -> None:
    """Every node of a spot gang noticed at once (one pool): attempt 2 waits for group a's spot
    nodes, and group b (on-demand) takes it once it has waited --fallback-after minutes. The
    clock is injected (``now``): nothing sleeps."""
    queue = SqliteQueue(tmp_path / "queue.db")
    spec = JobSpec(command=["train"], nodes=2, group="a", fallback_group="b", fallback_after_minutes=10)
    job = queue.submit(spec)
    spot = [gang.claim_slot(queue, f"a{i}", f"10.0.0.{i}", lease_seconds=LEASE, accepts=accepts("a")) for i in range(2)]
    assert {c.job_id for c in spot} == {job.id}  # b is not asked before the wait: a took it at once
    assert gang.start_gang(queue, spot[0], lease_seconds=LEASE) is not None
    queue.end_attempt(job.id, 1, AttemptEnd(state=AttemptState.REQUEUED, reason="spot interruption", exit_code=75))
    requeued = queue.get(job.id)
    assert (requeued.state, requeued.attempt) == (JobState.QUEUED, 2)
    queued_at = requeued.updated_at

    def b_claims(after_s: float) -> list:
        at = queued_at + after_s
        return [
            gang.claim_slot(queue, f"b{i}", f"10.0.1.{i}", lease_seconds=LEASE, now=at, accepts=accepts("b"))
            for i in range(2)
        ]

    def b_backlog(after_s: float) -> int:
        fleet = fleet_state(queue, node_lease=LEASE, now=queued_at + after_s, groups=groups("b"))
        return sum(g.unclaimed for g in fleet.waiting)

    for early in (0.0, 60.0, 599.0):
        assert b_claims(early) == [None, None]
        assert b_backlog(early) == 0  # b's alarm does not buy nodes for it yet
    assert b_backlog(600.0) == 2  # now b scales out for it
    taken = b_claims(600.0)
    assert sorted((c.job_id, c.attempt, c.slot) for c in taken) == [(job.id, 2, 0), (job.id, 2, 1)]
    members = gang.members(queue, queue.get(job.id), 2, now=queued_at + 600.0)
    assert [m.worker for m in members] == ["b0", "b1"]


def test_group_a_still_takes_its_job_after_the_fallback_time(tmp_path) -> None:
    """The fallback adds a group; it does not take the job away from its own group."""
    queue = SqliteQueue(tmp_path / "queue.db")
    job = queue.submit(JobSpec(command=["train"], group="a", fallback_group="b", fallback_after_minutes=1))
    late = queue.get(job.id).updated_at + 3600
    claim = gang.claim_slot(queue, "a0", "10.0.0.1", lease_seconds=LEASE, now=late, accepts=accepts("a"))
    assert claim is not None and claim.job_id == job.id


def test_a_job_without_a_group_is_the_default_groups(tmp_path) -> None:
    queue = SqliteQueue(tmp_path / "queue.db")
    job = queue.submit(JobSpec(command=["train"]))
    assert gang.claim_slot(queue, "b0", "10.0.1.1", lease_seconds=LEASE, accepts=accepts("b")) is None
    claim = gang.claim_slot(queue, "a0", "10.0.0.1", lease_seconds=LEASE, accepts=accepts("a"))
    assert claim is not None and claim.job_id == job.id


def test_the_agent_publishes_every_groups_counts_and_that_it_is_alive_in_one_call() -> None:
    """What the hooks send: PutMetricData (validated by botocore's Stubber) with both counts of this
    group and of the others, each under its own NodeGroup dimension, and one LiveAgents datapoint."""
    import boto3
    from botocore.stub import ANY, Stubber

    from gpucloud.agent.asg_hooks import AsgHooks, NodeSettings

    session = boto3.session.Session(region_name="us-east-1", aws_access_key_id="x", aws_secret_access_key="x")
    cloudwatch, autoscaling = session.client("cloudwatch"), session.client("autoscaling")
    settings = NodeSettings(cluster="dev", node_group="b", lifecycle_hook=None, scale_in=False, idle_seconds=60)
    sent: list[dict] = []
    cloudwatch.meta.events.register(
        "provide-client-params.cloudwatch.PutMetricData", lambda params, **_: sent.append(params)
    )
    with Stubber(cloudwatch) as stub:
        stub.add_response("put_metric_data", {}, {"Namespace": "gpucloud", "MetricData": ANY})
        hooks = AsgHooks(
            autoscaling=autoscaling, cloudwatch=cloudwatch, instance_id="i-1", asg_name="dev-b", settings=settings
        )
        hooks.publish_backlog(unclaimed_slots=0, busy_nodes=0, other_groups={"a": (2, 4)})
        stub.assert_no_pending_responses()
    values = {(d["MetricName"], tuple(x["Value"] for x in d["Dimensions"])): d["Value"] for d in sent[0]["MetricData"]}
    assert values == {
        ("LiveAgents", ("dev",)): 1.0,
        ("UnclaimedSlots", ("dev", "b")): 0.0,
        ("BusyNodes", ("dev", "b")): 0.0,
        ("UnclaimedSlots", ("dev", "a")): 2.0,
        ("BusyNodes", ("dev", "a")): 4.0,
    }


def test_a_job_past_its_fallback_wait_is_the_fallback_groups_backlog_only(tmp_path) -> None:
    """Counted for both groups, a due gang of 3 would make both alarms add 3 nodes: 6 bought for 3.
    Before the wait it is a's backlog, with a forecast for b from the minute it falls due."""
    from gpucloud.agent.fleet_view import group_backlog
    from gpucloud.cluster.agent_contract import PERIOD_SECONDS

    queue = SqliteQueue(tmp_path / "queue.db")
    job = queue.submit(JobSpec(command=["train"], nodes=3, group="a", fallback_group="b", fallback_after_minutes=10))
    queued_at = queue.get(job.id).updated_at
    early = group_backlog(queue, node_lease=LEASE, groups=groups("a"), now=queued_at + 60)
    assert early.counts == {"a": (3, 0), "b": (0, 0)}
    due_minute = -(-(queued_at + 600) // PERIOD_SECONDS) * PERIOD_SECONDS
    assert early.fallback_due[("b", due_minute)] == 3
    assert {g for g, _ in early.fallback_due} == {"b"}
    late = group_backlog(queue, node_lease=LEASE, groups=groups("a"), now=queued_at + 601)
    assert late.counts == {"a": (0, 0), "b": (3, 0)}
    assert late.fallback_due == {}


def test_a_fallback_gang_is_never_mixed_across_groups(tmp_path) -> None:
    """A gang of 2 for a (fallback b, due at once): a's node holds slot 0. b's agent may not take
    slot 1 (two instance types, two placement groups in one torchrun); once a's member is gone, b
    takes the gang."""
    queue = SqliteQueue(tmp_path / "queue.db")
    job = queue.submit(JobSpec(command=["train"], nodes=2, group="a", fallback_group="b", fallback_after_minutes=0))
    a0 = gang.claim_slot(queue, "a0", "10.0.0.1", lease_seconds=LEASE, accepts=accepts("a"))
    assert a0 is not None and a0.job_id == job.id
    queue.register_node(
        NodeRecord(id="a0", address="10.0.0.1", state=NodeState.WAITING, group="a", updated_at=time.time())
    )
    b_agent = idle_agent(tmp_path, PublishingHooks(), group="b")
    assert gang.claim_slot(queue, "b0", "10.0.1.1", lease_seconds=LEASE, accepts=b_agent.accepts) is None
    assert gang.release(queue, a0)
    claim = gang.claim_slot(queue, "b0", "10.0.1.1", lease_seconds=LEASE, accepts=b_agent.accepts)
    assert claim is not None and claim.job_id == job.id
