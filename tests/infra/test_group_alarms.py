"""Several node groups scale independently: each group's backlog alarm, as the
stack program builds it under Pulumi mocks, evaluated on the metrics the agents and AWS publish.

The cluster has one job queue, so its visible slot messages are every group's. Only the first
scaling group reads it, and only to wake an empty cluster (one node, when no agent is up to
publish); every other alarm reads the counts the agents publish under its own group's dimension.
"""

from __future__ import annotations

import base64
import re

import pytest

from gpucloud.cluster import scaling_plan as plan
from gpucloud.cluster.scaling_plan import QueueTerm, queue_terms
from gpucloud.infra.preview import StackPreview, preview_stack
from gpucloud.spec import spec_from_config

from .botocore_check import assert_valid_request
from .test_scale_from_zero import put_metric_alarm_request

ALARM = "aws:cloudwatch/metricAlarm:MetricAlarm"
LT = "aws:ec2/launchTemplate:LaunchTemplate"


def group(name: str, capacity: str) -> dict:
    return {
        "name": name,
        "instanceType": "g6.xlarge",
        "minNodes": 0,
        "maxNodes": 8,
        "capacity": {"type": capacity},
        "scaling": {"idleMinutes": 10},
    }


@pytest.fixture(scope="module")
def two_groups() -> StackPreview:
    config = {
        "aws:region": "us-east-1",
        "gpucloud:availabilityZone": "us-east-1a",
        "gpucloud:nodeGroups": [group("a", "spot"), group("b", "on-demand")],
        "gpucloud:agent": {"package": "s3://wheels-bucket/gpucloud-0.1.0-py3-none-any.whl"},
    }
    return preview_stack(spec_from_config(config, "generated"), "two")


def alarm_of(preview: StackPreview, name: str) -> dict:
    (alarm,) = [a for a in preview.of_type(ALARM) if f"-group-{name}-" in a.name]
    return alarm.inputs


def evaluate(alarm: dict, inputs: dict[str, float]) -> float:
    """The alarm's metric math at one minute, pointwise: FILL(x, REPEAT) and FILL(x, 0) are x (the
    minute has its datapoint, or x is 0), IF is a pointwise choice, and an input with no datapoint
    is 0 in arithmetic and in a comparison (CloudWatch "Using metric math"). Only ids the alarm
    fetches may be given."""
    fetched = {q["id"] for q in alarm["metricQueries"] if "metric" in q}
    assert set(inputs) <= fetched, f"the alarm does not read {set(inputs) - fetched}"
    values = {i: float(inputs.get(i, 0.0)) for i in fetched}
    for q in alarm["metricQueries"]:
        if "expression" in q:
            text = re.sub(r"FILL\((\w+), (?:REPEAT|0)\)", r"\1", q["expression"]).replace("IF(", "_if(")
            values[q["id"]] = eval(text, {"_if": lambda c, a, b: a if c else b}, dict(values))
    return values[plan.SHORTFALL_ID]


def published(group_counts: dict[str, tuple[int, int]], group: str) -> dict[str, float]:
    """What the agents publish for ``group``'s dimension: (busy, unclaimed)."""
    busy, unclaimed = group_counts[group]
    return {plan.BUSY_NODES_ID: busy, plan.AGENT_UNCLAIMED_ID: unclaimed}


def test_each_group_reads_the_queue_its_own_way(two_groups) -> None:
    a, b = alarm_of(two_groups, "a"), alarm_of(two_groups, "b")
    a_ids = {q["id"] for q in a["metricQueries"]}
    b_ids = {q["id"] for q in b["metricQueries"]}
    assert {plan.QUEUED_SLOTS_ID, plan.LIVE_AGENTS_ID} <= a_ids  # a wakes an empty cluster
    assert plan.QUEUED_SLOTS_ID not in b_ids  # b never counts a's queued slots
    for alarm in (a, b):
        dims = [q["metric"]["dimensions"] for q in alarm["metricQueries"] if "metric" in q]
        assert all(d.get("NodeGroup") in (None, "a" if alarm is a else "b") for d in dims)
        assert_valid_request("cloudwatch", "put_metric_alarm", put_metric_alarm_request(alarm))


def test_a_busy_with_4_nodes_b_idle_with_1_and_nothing_queued_b_does_not_scale(two_groups) -> None:
    counts = {"a": (4, 0), "b": (0, 0)}  # (busy, unclaimed) as every agent now publishes them
    b = {**published(counts, "b"), plan.DESIRED_ID: 1}
    assert evaluate(alarm_of(two_groups, "b"), b) <= 0
    a = {**published(counts, "a"), plan.DESIRED_ID: 4, plan.LIVE_AGENTS_ID: 1}
    assert evaluate(alarm_of(two_groups, "a"), a) <= 0


def test_a_gang_of_a_waiting_in_the_queue_scales_a_and_not_b(two_groups) -> None:
    """Before, b's alarm read the queue's 2 visible slot messages of a's gang: +1 node for b."""
    counts = {"a": (4, 2), "b": (0, 0)}
    b = {**published(counts, "b"), plan.DESIRED_ID: 1}
    assert evaluate(alarm_of(two_groups, "b"), b) <= 0
    a = {**published(counts, "a"), plan.DESIRED_ID: 4, plan.QUEUED_SLOTS_ID: 2, plan.LIVE_AGENTS_ID: 1}
    assert evaluate(alarm_of(two_groups, "a"), a) == 2


def test_an_empty_cluster_wakes_one_node_then_the_agents_counts_scale_the_right_group(two_groups) -> None:
    """A gang of 3 for b, no node anywhere: a (the first group) wakes one node, b waits for a count;
    a minute after that node's agent is up it publishes b's 3 slots and b scales out by 3, while a
    adds nothing more (its idle node leaves on its own)."""
    a_alarm, b_alarm = alarm_of(two_groups, "a"), alarm_of(two_groups, "b")
    assert evaluate(a_alarm, {plan.QUEUED_SLOTS_ID: 3}) == 1
    assert evaluate(b_alarm, {}) <= 0
    counts = {"a": (0, 0), "b": (0, 3)}
    awake = {plan.QUEUED_SLOTS_ID: 3, plan.LIVE_AGENTS_ID: 1, plan.DESIRED_ID: 1}
    assert evaluate(a_alarm, {**published(counts, "a"), **awake}) <= 0
    assert evaluate(b_alarm, published(counts, "b")) == 3


@pytest.mark.parametrize(
    ("term", "inputs", "expected"),
    [
        (QueueTerm.COUNT, {"busy": 1, "agents_unclaimed": 0, "queued_visible": 3, "live_agents": 0, "desired": 1}, 3),
        (QueueTerm.WAKE, {"busy": 0, "agents_unclaimed": 0, "queued_visible": 3, "live_agents": 0, "desired": 0}, 1),
        (QueueTerm.WAKE, {"busy": 1, "agents_unclaimed": 0, "queued_visible": 3, "live_agents": 2, "desired": 1}, 0),
        (QueueTerm.NONE, {"busy": 0, "agents_unclaimed": 0, "queued_visible": 3, "live_agents": 1, "desired": 1}, -1),
    ],
)
def test_the_plans_shortfall_is_what_the_alarm_computes(two_groups, term, inputs, expected) -> None:
    assert plan.shortfall(term, **inputs) == expected
    if term is QueueTerm.COUNT:
        return  # the shipped single-group stacks: tests/infra/test_scale_from_zero.py
    alarm = alarm_of(two_groups, "a" if term is QueueTerm.WAKE else "b")
    fetched = {
        plan.BUSY_NODES_ID: inputs["busy"],
        plan.AGENT_UNCLAIMED_ID: inputs["agents_unclaimed"],
        plan.QUEUED_SLOTS_ID: inputs["queued_visible"],
        plan.LIVE_AGENTS_ID: inputs["live_agents"],
        plan.DESIRED_ID: inputs["desired"],
    }
    reads = {q["id"] for q in alarm["metricQueries"] if "metric" in q}
    assert evaluate(alarm, {k: v for k, v in fetched.items() if k in reads}) == expected


def test_queue_terms_one_group_counts_several_wake_with_the_first_scaling_group() -> None:
    assert queue_terms([("only", True)]) == {"only": QueueTerm.COUNT}
    assert queue_terms([("fixed", False), ("a", True), ("b", True)]) == {"a": QueueTerm.WAKE, "b": QueueTerm.NONE}
    assert queue_terms([("x", False)]) == {}


def test_every_node_knows_its_group_and_the_clusters_groups(two_groups) -> None:
    for name in ("a", "b"):
        (lt,) = [t for t in two_groups.of_type(LT) if f"-group-{name}-" in t.name]
        text = base64.b64decode(lt.inputs["userData"]).decode()
        env = dict(
            line.split("=", 1)
            for line in text.split("<<'GPUCLOUD_ENV'\n", 1)[1].split("\nGPUCLOUD_ENV\n")[0].splitlines()
        )
        assert (env["GPUCLOUD_NODE_GROUP"], env["GPUCLOUD_NODE_GROUPS"]) == (name, "a,b")


def test_every_alarm_stays_within_cloudwatchs_query_limits(two_groups) -> None:
    """PutMetricAlarm takes at most 10 metric queries and 10 expressions per alarm."""
    for name in ("a", "b"):
        queries = alarm_of(two_groups, name)["metricQueries"]
        assert sum(1 for q in queries if "metric" in q) <= plan.MAX_ALARM_METRICS
        assert sum(1 for q in queries if "expression" in q) <= plan.MAX_ALARM_EXPRESSIONS
