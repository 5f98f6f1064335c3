"""The scale-out alarms on what the agents really publish when no agent is idle.

Each scenario sets up the job table, lets a real ``Agent`` publish through ``AsgHooks`` (the
PutMetricData request botocore validates and the Stubber answers), then evaluates the stack's own
alarm expressions (``test_group_alarms.evaluate``) at one minute on those datapoints (Maximum per
minute, matched by metric name and dimensions) plus what AWS itself publishes (the group's desired
capacity, the job queue's visible messages):

1. every node of a one-group cluster busy, a gang of 2 queued: the group adds 2 nodes;
2. group a busy with 4 nodes, a gang of 2 for the empty group b: b adds 2 nodes;
3. the spot group's gang requeued by a spot notice and every node gone, its fallback due 10
   minutes later: the fallback group adds the gang's nodes then, with no agent up.
"""

from __future__ import annotations

import datetime as dt
import time
from pathlib import Path

import boto3
import pytest
from botocore.stub import ANY, Stubber

from gpucloud.agent.asg_hooks import AsgHooks, NodeSettings
from gpucloud.agent.identity import NodeIdentity
from gpucloud.agent.loop import Agent, AgentOptions, _SlotKeeper
from gpucloud.agent.node_groups import NodeGroups
from gpucloud.cluster import scaling_plan as plan
from gpucloud.cluster.agent_contract import PERIOD_SECONDS
from gpucloud.infra.preview import StackPreview, preview_stack
from gpucloud.jobs.supervisor import SupervisorConfig
from gpucloud.lifecycle.model import AttemptEnd, AttemptState, JobSpec, JobState, NodeRecord, NodeState
from gpucloud.queue import gang
from gpucloud.queue.sqlite import SqliteQueue
from gpucloud.spec import spec_from_config
from helpers.notices import Inbox, spot_notice
from helpers.waiting import wait_for
from infra.test_group_alarms import group

from .test_group_alarms import alarm_of, evaluate

CLUSTER = "fleet"
LEASE = 2.0  # slot lease: the slot keeper renews (and publishes) every LEASE / 4 seconds


def preview(groups: list[dict]) -> StackPreview:
    config = {
        "aws:region": "us-east-1",
        "gpucloud:availabilityZone": "us-east-1a",
        "gpucloud:clusterName": CLUSTER,
        "gpucloud:nodeGroups": groups,
        "gpucloud:agent": {"package": "s3://wheels-bucket/gpucloud-0.1.0-py3-none-any.whl"},
    }
    return preview_stack(spec_from_config(config, "generated"), "busy")


@pytest.fixture(scope="module")
def one_group() -> StackPreview:
    return preview([group("p4d", "spot")])


@pytest.fixture(scope="module")
def spot_and_od() -> StackPreview:
    return preview([group("spot", "spot"), group("od", "on-demand")])


class Published:
    """The PutMetricData requests an agent's hooks sent, as CloudWatch would store them."""

    def __init__(self) -> None:
        self.requests: list[dict] = []

    def at_minute(self, alarm: dict, minute: float) -> dict[str, float]:
        """The alarm's agent-published inputs at ``minute`` (epoch s): Maximum of the matching datums."""
        out: dict[str, float] = {}
        for q in alarm["metricQueries"]:
            m = q.get("metric")
            if m is None or m["namespace"] != "gpucloud":
                continue
            for request in self.requests:
                for d in request["MetricData"]:
                    dims = {x["Name"]: x["Value"] for x in d["Dimensions"]}
                    when = d["Timestamp"].timestamp()
                    if d["MetricName"] == m["metricName"] and dims == m["dimensions"] and minute <= when < minute + 60:
                        out[q["id"]] = max(out.get(q["id"], d["Value"]), d["Value"])
        return out


def agent(tmp_path: Path, queue: SqliteQueue, own: str, names: tuple[str, ...], sent: Published) -> Agent:
    session = boto3.session.Session(region_name="us-east-1", aws_access_key_id="x", aws_secret_access_key="x")
    cloudwatch, autoscaling = session.client("cloudwatch"), session.client("autoscaling")
    cloudwatch.meta.events.register(
        "provide-client-params.cloudwatch.PutMetricData", lambda params, **_: sent.requests.append(params)
    )
    stub = Stubber(cloudwatch)
    for _ in range(20):
        stub.add_response("put_metric_data", {}, {"Namespace": "gpucloud", "MetricData": ANY})
    stub.activate()
    settings = NodeSettings(cluster=CLUSTER, node_group=own, lifecycle_hook=None, scale_in=False, idle_seconds=600)
    hooks = AsgHooks(
        autoscaling=autoscaling, cloudwatch=cloudwatch, instance_id=f"i-{own}0", asg_name=own, settings=settings
    )
    return Agent(
        queue,
        NodeIdentity(worker=f"{own}0", address="10.0.0.1"),
        Inbox(),
        hooks,
        SupervisorConfig(lease_seconds=10.0, ack_timeout=5.0, stop_margin=1.0, kill_after=2.0),
        AgentOptions(
            slot_lease=LEASE,
            poll_interval=0.1,
            groups=NodeGroups(own=own, names=names),
            group_check_interval=3600.0,
            run_root=tmp_path / "run",
        ),
    )


def run_gang(queue: SqliteQueue, group_name: str, nodes: int, **spec: object) -> list[gang.SlotClaim]:
    """A running gang of ``group_name``: every member holds its slot and reports itself running."""
    job = queue.submit(JobSpec(command=["train"], nodes=nodes, group=group_name, **spec))
    takes = NodeGroups(own=group_name, names=(group_name,))
    claims = []
    for i in range(nodes):
        claim = gang.claim_slot(
            queue,
            f"{group_name}{i}",
            f"10.0.0.{i + 1}",
            lease_seconds=3600,
            accepts=lambda j, at: takes.takes(j.spec, queued_for=gang.queued_for(j, at)),
        )
        assert claim is not None
        claims.append(claim)
        queue.register_node(
            NodeRecord(
                id=claim.worker,
                address=claim.address,
                state=NodeState.RUNNING,
                group=group_name,
                job_id=job.id,
                attempt=claim.attempt,
                slot=claim.slot,
                updated_at=time.time() + 3600,  # stays live for the test's length
            )
        )
    assert gang.start_gang(queue, claims[0], lease_seconds=3600) is not None
    return claims


def busy_publication(node: Agent, claim: gang.SlotClaim, sent: Published) -> float:
    """Run ``node`` as a busy gang member (its slot keeper) until it has published; the minute."""
    node.current = claim
    node.report(NodeState.RUNNING)
    with _SlotKeeper(node, claim):
        wait_for(lambda: sent.requests, timeout=30, what="a busy agent's PutMetricData")
    return minute_of(sent.requests[0]["MetricData"][0]["Timestamp"])


def minute_of(when: dt.datetime) -> float:
    return when.timestamp() // PERIOD_SECONDS * PERIOD_SECONDS


def test_every_node_busy_and_a_gang_queued_the_group_adds_its_nodes(tmp_path, one_group) -> None:
    """maxNodes 8, 4 nodes busy, a gang of 2 queued. Before, nobody published: 0 + 2 - 4 = -2."""
    queue = SqliteQueue(tmp_path / "queue.db")
    claims = run_gang(queue, "p4d", 4)
    queue.submit(JobSpec(command=["train"], nodes=2, group="p4d"))
    sent = Published()
    minute = busy_publication(agent(tmp_path, queue, "p4d", ("p4d",), sent), claims[0], sent)

    alarm = alarm_of(one_group, "p4d")
    aws = {plan.DESIRED_ID: 4, plan.QUEUED_SLOTS_ID: 2}  # the gang's 2 slot messages are visible
    assert evaluate(alarm, {**sent.at_minute(alarm, minute), **aws}) == 2


def test_a_busy_and_a_gang_for_the_empty_group_b_scales_b(tmp_path) -> None:
    """a busy with 4 nodes, a gang of 2 for b with no node. Before, nobody published: b's alarm 0."""
    two = preview([group("a", "spot"), group("b", "on-demand")])
    queue = SqliteQueue(tmp_path / "queue.db")
    claims = run_gang(queue, "a", 4)
    queue.submit(JobSpec(command=["train"], nodes=2, group="b"))
    sent = Published()
    minute = busy_publication(agent(tmp_path, queue, "a", ("a", "b"), sent), claims[0], sent)

    b_alarm, a_alarm = alarm_of(two, "b"), alarm_of(two, "a")
    assert evaluate(b_alarm, {**sent.at_minute(b_alarm, minute), plan.DESIRED_ID: 0}) == 2
    a_inputs = {**sent.at_minute(a_alarm, minute), plan.DESIRED_ID: 4, plan.QUEUED_SLOTS_ID: 2}
    assert evaluate(a_alarm, a_inputs) == 0  # a is busy with its own 4: nothing more for a


def test_spot_group_gone_the_fallback_group_scales_out_when_the_wait_is_over(tmp_path, spot_and_od) -> None:
    """The spot gang (2 nodes, fallback od after 10 minutes) is requeued by a spot notice; its agents
    stop; nothing is up anywhere. Ten minutes later od's alarm must add 2 nodes. Before, the last
    datapoints were the running gang's (or none): od's alarm read 0 and the job waited for spot."""
    queue = SqliteQueue(tmp_path / "queue.db")
    claims = run_gang(queue, "spot", 2, fallback_group="od", fallback_after_minutes=10)
    job_id = claims[0].job_id
    # The gang saved and requeued (the supervisor's end of the attempt): attempt 2 waits.
    queue.end_attempt(job_id, 1, AttemptEnd(state=AttemptState.REQUEUED, reason="spot interruption", exit_code=75))
    requeued = queue.get(job_id)
    assert (requeued.state, requeued.attempt) == (JobState.QUEUED, 2)
    queued_at = requeued.updated_at
    for claim in claims:  # its members stopped: their records are no longer busy
        queue.register_node(
            NodeRecord(
                id=claim.worker, address=claim.address, state=NodeState.STOPPED, group="spot", updated_at=time.time()
            )
        )

    sent = Published()
    node = agent(tmp_path, queue, "spot", ("spot", "od"), sent)
    node.notices.source.put(spot_notice())  # type: ignore[attr-defined]
    summary = node.run()
    assert summary.stopped_by == "spot-interruption"

    due = -(-(queued_at + 600) // PERIOD_SECONDS) * PERIOD_SECONDS
    od, spot = alarm_of(spot_and_od, "od"), alarm_of(spot_and_od, "spot")
    assert plan.LIVE_AGENTS_ID not in sent.at_minute(od, due)  # no agent is up then
    assert evaluate(od, {**sent.at_minute(od, due), plan.DESIRED_ID: 0}) == 2
    # The spot group keeps its one woken node it cannot launch; it asks for no more.
    assert evaluate(spot, {**sent.at_minute(spot, due), plan.DESIRED_ID: 1, plan.QUEUED_SLOTS_ID: 2}) == 0
    # Before the wait is over, od adds nothing: the spot group may still get capacity back.
    before = due - 2 * PERIOD_SECONDS
    assert evaluate(od, {**sent.at_minute(od, before), plan.DESIRED_ID: 0}) <= 0
