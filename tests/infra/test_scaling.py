"""Autoscaling wired into the stacks: the backlog metric contract, the scale-out policy and its alarm,
the capacity-block wind-down, the node agent's IAM and settings, and the exports."""

from __future__ import annotations

import base64
import datetime as dt
import itertools
import json

import pulumi
import pytest

from gpucloud.agent import backlog_metric
from gpucloud.cli import main
from gpucloud.cluster import agent_contract
from gpucloud.cluster.scaling_plan import (
    MAX_STEP_ADJUSTMENTS,
    SHORTFALL_EXPRESSION,
    ScaleOutStep,
    default_lead_minutes,
    minimum_lead_minutes,
    scale_out_steps,
    schedule_timestamp,
    wind_down_time,
)
from gpucloud.infra.iam import GroupScope, JobPlaneArns, node_policy_document
from gpucloud.infra.preview import StackPreview, mocked_runtime, preview_stack
from gpucloud.infra.program import build_cluster
from gpucloud.policy.pack import POLICIES
from gpucloud.policy.runner import run_policies
from gpucloud.spec import spec_from_config

from .botocore_check import assert_valid_request
from .stack_outputs import run_with_outputs

ASG = "aws:autoscaling/group:Group"
POLICY = "aws:autoscaling/policy:Policy"
ALARM = "aws:cloudwatch/metricAlarm:MetricAlarm"
SCHEDULE = "aws:autoscaling/schedule:Schedule"
LT = "aws:ec2/launchTemplate:LaunchTemplate"
ROLE_POLICY = "aws:iam/rolePolicy:RolePolicy"
CR = "cr-0123456789abcdef0"
NODE_LIFECYCLE_ACTIONS = [
    "autoscaling:SetInstanceProtection",
    "autoscaling:DetachInstances",
    "autoscaling:TerminateInstanceInAutoScalingGroup",
    "autoscaling:SetInstanceHealth",
]


def block_end_in(days: int) -> dt.datetime:
    return (dt.datetime.now(dt.timezone.utc) + dt.timedelta(days=days)).replace(second=0, microsecond=0)


BLOCK_END = block_end_in(7)


def mixed_config() -> dict:
    """A capacity block with an end and more nodes than one policy has steps, beside a fixed group."""
    return {
        "aws:region": "us-east-1",
        "gpucloud:availabilityZone": "us-east-1d",
        "gpucloud:nodeGroups": [
            {
                "name": "h100",
                "instanceType": "p5.48xlarge",
                "minNodes": 0,
                "maxNodes": 30,
                "capacity": {"type": "capacity-block", "reservationId": CR, "blockEnd": BLOCK_END.isoformat()},
                "drainTimeoutSeconds": 900,
                "scaling": {"idleMinutes": 25, "instanceWarmupSeconds": 240},
            },
            {"name": "fixed", "instanceType": "g6.xlarge", "minNodes": 1, "maxNodes": 1, "scaling": {"enabled": False}},
        ],
        "gpucloud:agent": {"package": "s3://wheels-bucket/gpucloud-0.1.0-py3-none-any.whl"},
    }


@pytest.fixture(scope="module")
def mixed() -> StackPreview:
    return preview_stack(spec_from_config(mixed_config(), "generated"), "mixed")


def in_group(preview: StackPreview, type_token: str, group: str) -> list:
    return [r for r in preview.of_type(type_token) if f"-group-{group}-" in r.name]


def user_data_env(preview: StackPreview, group: str) -> dict[str, str]:
    (lt,) = in_group(preview, LT, group)
    text = base64.b64decode(lt.inputs["userData"]).decode()
    env = text.split("<<'GPUCLOUD_ENV'\n", 1)[1].split("\nGPUCLOUD_ENV\n", 1)[0]
    return dict(line.split("=", 1) for line in env.splitlines())


# --- pure planning ---------------------------------------------------------------------------


@pytest.mark.parametrize("max_nodes", [1, 2, 3, 7, 20, 21, 64])
def test_steps_add_exactly_the_shortfall_up_to_the_quota(max_nodes: int) -> None:
    steps = scale_out_steps(max_nodes)
    assert len(steps) == min(max_nodes, MAX_STEP_ADJUSTMENTS)
    assert steps[0].lower == 0 and steps[-1].upper is None
    for before, after in itertools.pairwise(steps):
        assert before.upper == after.lower  # no gap, no overlap (AWS rejects either)
    assert all(s.add > 0 for s in steps)  # never a scale-in step

    def added(shortfall: float) -> int:
        return next(s.add for s in steps if s.lower <= shortfall and (s.upper is None or shortfall < s.upper))

    for shortfall in range(1, max_nodes + 5):
        assert added(shortfall) == min(shortfall, max_nodes, MAX_STEP_ADJUSTMENTS)
    assert added(0.5) == 1  # a partial node still needs a whole node


def test_three_node_steps_spelled_out() -> None:
    assert scale_out_steps(3) == [ScaleOutStep(0, 2, 1), ScaleOutStep(2, 3, 2), ScaleOutStep(3, None, 3)]
    assert scale_out_steps(1) == [ScaleOutStep(0, None, 1)]
    with pytest.raises(ValueError, match="at least 1"):
        scale_out_steps(0)


def test_wind_down_lead_covers_aws_reclaim_and_the_drain() -> None:
    assert minimum_lead_minutes(600) == 40 and minimum_lead_minutes(900) == 45 and minimum_lead_minutes(61) == 32
    assert default_lead_minutes(900) == 50
    end = dt.datetime(2026, 12, 1, 13, 30, 15, 999, tzinfo=dt.timezone(dt.timedelta(hours=2)))
    at = wind_down_time(end, 50)
    assert at == dt.datetime(2026, 12, 1, 10, 40, 15, tzinfo=dt.timezone.utc)
    assert schedule_timestamp(at) == "2026-12-01T10:40:15Z"
    with pytest.raises(ValueError, match="timezone-aware"):
        wind_down_time(dt.datetime(2026, 12, 1, 12, 0), 50)


# --- the metric contract (what agents and submit send) ---------------------------------------


def test_backlog_request_is_a_valid_put_metric_data_call() -> None:
    now = dt.datetime(2026, 11, 21, 20, 0, tzinfo=dt.timezone.utc)
    request = backlog_metric.put_metric_data_request(
        [
            backlog_metric.GroupBacklog("research", "h100", unclaimed_slots=3, busy_nodes=2),
            backlog_metric.GroupBacklog("research", "a100", unclaimed_slots=0, busy_nodes=0),
        ],
        now,
    )
    assert_valid_request("cloudwatch", "put_metric_data", request)
    assert request["Namespace"] == "gpucloud"
    h100 = {
        d["MetricName"]: d["Value"]
        for d in request["MetricData"]
        if {"Name": "NodeGroup", "Value": "h100"} in d["Dimensions"]
    }
    assert h100 == {"UnclaimedSlots": 3.0, "BusyNodes": 2.0}
    assert backlog_metric.GroupBacklog("c", "g", 3, 2).wanted_nodes == 5


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"unclaimed_slots": -1}, "unclaimed_slots must be a count"),
        ({"busy_nodes": 1.5}, "busy_nodes must be a count"),
        ({"busy_nodes": True}, "busy_nodes must be a count"),
        ({"node_group": ""}, "node_group must not be empty"),
    ],
)
def test_bad_backlog_counts_are_refused(fields: dict, message: str) -> None:
    values = {"cluster": "c", "node_group": "g", "unclaimed_slots": 0, "busy_nodes": 0, **fields}
    with pytest.raises(ValueError, match=message):
        backlog_metric.GroupBacklog(**values)


def test_backlog_request_needs_groups_and_an_aware_time() -> None:
    backlog = backlog_metric.GroupBacklog("c", "g", 1, 0)
    with pytest.raises(ValueError, match="no node group"):
        backlog_metric.put_metric_data_request([], dt.datetime.now(dt.timezone.utc))
    with pytest.raises(ValueError, match="timezone-aware"):
        backlog_metric.put_metric_data_request([backlog], dt.datetime(2026, 1, 1))


# --- the scale-out policy and its alarm, under mocks -----------------------------------------


@pytest.mark.parametrize("stack", ["dev", "p4d-spot"])
def test_shipped_spot_stacks_scale_out_on_the_backlog(previews, stack: str) -> None:
    preview = previews[stack]
    (asg,) = preview.of_type(ASG)
    (policy,) = preview.of_type(POLICY)
    (alarm,) = [a for a in preview.of_type(ALARM) if a.name.endswith("-backlog")]  # not the drill's stop alarm
    p = policy.inputs
    assert p["autoscalingGroupName"] == asg.name  # the group has no fixed name: the mocks echo its logical one
    assert (p["policyType"], p["adjustmentType"], p["metricAggregationType"]) == (
        "StepScaling",
        "ChangeInCapacity",
        "Maximum",
    )
    max_nodes = int(asg.inputs["maxSize"])
    assert [
        (s.get("metricIntervalLowerBound"), s.get("metricIntervalUpperBound"), s["scalingAdjustment"])
        for s in p["stepAdjustments"]
    ] == [(str(s.lower), None if s.upper is None else str(s.upper), s.add) for s in scale_out_steps(max_nodes)]
    assert all(s["scalingAdjustment"] > 0 for s in p["stepAdjustments"])  # scale-in is the agents' job

    a = alarm.inputs
    assert (a["comparisonOperator"], a["threshold"], a["evaluationPeriods"]) == ("GreaterThanThreshold", 0, 1)
    assert a["treatMissingData"] == "notBreaching"
    assert a["alarmActions"] == [f"arn:aws:autoscaling:us-east-1:123456789012:policy/{policy.name}"]
    queries = {q["id"]: q for q in a["metricQueries"]}
    assert queries["shortfall"]["expression"] == SHORTFALL_EXPRESSION  # the math: tests/infra/test_scale_from_zero.py
    assert [q["id"] for q in a["metricQueries"] if q["returnData"]] == ["shortfall"]
    group = asg.inputs["tags"][[t["key"] for t in asg.inputs["tags"]].index("gpucloud:node-group")]["value"]
    for query_id, name in (("busy_nodes", "BusyNodes"), ("agent_unclaimed", "UnclaimedSlots")):
        m = queries[query_id]["metric"]
        assert (m["namespace"], m["metricName"], m["stat"], m["period"]) == ("gpucloud", name, "Maximum", 60)
        assert m["dimensions"] == {"ClusterName": preview.cluster, "NodeGroup": group}
    desired = queries["desired"]["metric"]
    assert (desired["namespace"], desired["metricName"]) == ("AWS/AutoScaling", "GroupDesiredCapacity")
    assert desired["dimensions"] == {"AutoScalingGroupName": p["autoscalingGroupName"]}
    # the alarm reads the group's desired capacity, which AWS publishes only while collection is on
    assert "GroupDesiredCapacity" in asg.inputs["enabledMetrics"]
    assert asg.inputs["metricsGranularity"] == "1Minute"
    assert a["tags"]["gpucloud:stack"] == stack


def test_metric_names_in_the_alarm_come_from_the_shared_module(previews) -> None:
    (alarm,) = previews["dev"].of_type(ALARM)
    metrics = {
        q["metric"]["metricName"]
        for q in alarm.inputs["metricQueries"]
        if "metric" in q and q["metric"]["namespace"] == agent_contract.NAMESPACE
    }
    assert metrics == {backlog_metric.UNCLAIMED_SLOTS, backlog_metric.BUSY_NODES}


def test_policy_steps_stop_at_the_quota_and_warmup_is_the_setting(mixed) -> None:
    (policy,) = in_group(mixed, POLICY, "h100")
    assert len(policy.inputs["stepAdjustments"]) == MAX_STEP_ADJUSTMENTS  # maxNodes 30
    assert policy.inputs["stepAdjustments"][-1] == {"metricIntervalLowerBound": "20", "scalingAdjustment": 20}
    assert policy.inputs["estimatedInstanceWarmup"] == 240


def test_scaling_disabled_builds_no_policy_and_tells_the_agent(mixed, previews) -> None:
    assert not in_group(mixed, POLICY, "fixed") and not in_group(mixed, ALARM, "fixed")
    (asg,) = in_group(mixed, ASG, "fixed")
    assert "enabledMetrics" not in asg.inputs
    assert user_data_env(mixed, "fixed")[agent_contract.SCALE_IN_ENV] == "0"
    assert not previews["p5-capacity-block"].of_type(POLICY)  # the shipped block keeps its nodes
    env = user_data_env(mixed, "h100")
    assert (env[agent_contract.SCALE_IN_ENV], env[agent_contract.IDLE_MINUTES_ENV]) == ("1", "25")


# --- the capacity block's end ----------------------------------------------------------------


def test_capacity_block_scales_to_zero_before_aws_reclaims_it(mixed) -> None:
    (schedule,) = mixed.of_type(SCHEDULE)
    (asg,) = in_group(mixed, ASG, "h100")
    s = schedule.inputs
    lead = BLOCK_END - dt.datetime.strptime(s["startTime"], "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=dt.timezone.utc)
    assert lead == dt.timedelta(minutes=50)  # 30 (AWS reclaim) + 15 (drainTimeoutSeconds 900) + 5 margin
    assert (s["minSize"], s["maxSize"], s["desiredCapacity"]) == (0, 0, 0)  # max 0: no relaunch into it
    assert "recurrence" not in s  # one-time
    assert s["autoscalingGroupName"] == asg.name
    assert s["scheduledActionName"] == f"gpucloud-capacity-block-end-{BLOCK_END:%Y%m%dT%H%M}Z"
    assert schedule.parent and schedule.parent.endswith("-group-h100-block")


def test_no_schedule_without_a_block_end(previews) -> None:
    for preview in previews.values():
        assert not preview.of_type(SCHEDULE)


# --- IAM for the node agent ------------------------------------------------------------------


def test_node_policy_statements_for_the_agent() -> None:
    scope = GroupScope("arn:aws:autoscaling:r:1:autoScalingGroup:*:autoScalingGroupName/*", stack="s", cluster="c")
    jobs = JobPlaneArns(
        "arn:aws:sqs:r:1:q", "arn:aws:sqs:r:1:q-dlq", "arn:aws:sqs:r:1:e", "arn:aws:dynamodb:r:1:table/t"
    )
    doc = node_policy_document("arn:aws:s3:::b", jobs, scope)
    by_sid = {s["Sid"]: s for s in doc["Statement"]}
    assert by_sid["NodeLifecycle"]["Action"] == NODE_LIFECYCLE_ACTIONS
    assert by_sid["NodeLifecycle"]["Resource"] == [scope.group_arn_pattern]
    assert by_sid["FindOwnGroup"] == {
        "Sid": "FindOwnGroup",
        "Effect": "Allow",
        "Resource": ["*"],
        "Action": ["autoscaling:DescribeAutoScalingInstances", "autoscaling:DescribeAutoScalingGroups"],
    }
    assert by_sid["PublishBacklog"] == {
        "Sid": "PublishBacklog",
        "Effect": "Allow",
        "Action": ["cloudwatch:PutMetricData"],
        "Resource": ["*"],
        "Condition": {"StringEquals": {"cloudwatch:namespace": "gpucloud"}},
    }
    # EC2: only the job-id tag on this cluster's resources, and finding this node's own attachments for
    # it; a failed bootstrap's reason on its own instance
    ec2 = {s["Sid"]: s["Action"] for s in doc["Statement"] if any(a.startswith("ec2:") for a in s["Action"])}
    assert ec2 == {
        "FindInstances": ["ec2:DescribeInstances"],
        "JobTags": ["ec2:CreateTags", "ec2:DeleteTags"],
        "BootstrapFailedTag": ["ec2:CreateTags"],
    }
    assert "NodeLifecycle" not in {s["Sid"] for s in node_policy_document("a", jobs, None)["Statement"]}


@pytest.mark.parametrize("which", ["dev", "p4d-spot", "p5-capacity-block", "mixed"])
def test_agent_statements_name_exactly_this_stacks_groups(previews, mixed, which: str) -> None:
    preview = mixed if which == "mixed" else previews[which]
    (role_policy,) = [p for p in preview.of_type(ROLE_POLICY) if p.name.endswith("-node-access")]  # not the monitor's
    by_sid = {s["Sid"]: s for s in json.loads(role_policy.inputs["policy"])["Statement"]}
    for asg in preview.of_type(ASG):  # every group carries the tags the statements require
        tags = {t["key"]: t["value"] for t in asg.inputs["tags"]}
        assert tags["gpucloud:stack"] == preview.stack and tags["gpucloud:cluster"] == preview.cluster
    for sid in ("NodeLifecycle", "DrainOnTermination"):
        assert by_sid[sid]["Resource"] == [
            "arn:aws:autoscaling:us-east-1:123456789012:autoScalingGroup:*:autoScalingGroupName/*"
        ]
        assert by_sid[sid]["Condition"] == {
            "StringEquals": {
                "autoscaling:ResourceTag/gpucloud:stack": preview.stack,
                "autoscaling:ResourceTag/gpucloud:cluster": preview.cluster,
            }
        }


def test_policy_pack_is_clean_with_scaling_and_a_block_end(mixed) -> None:
    violations = run_policies(mixed.resources, stack="mixed", policies=POLICIES)
    assert [v.describe() for v in violations] == []
    assert mixed.of_type(ALARM) and mixed.of_type(SCHEDULE)  # the new resources were checked


# --- what operators and agents see -----------------------------------------------------------


def test_plan_json_shows_the_scaling_resources(tmp_path, capsys) -> None:
    import yaml

    path = tmp_path / "Pulumi.blocky.yaml"
    path.write_text(yaml.safe_dump({"config": mixed_config()}))
    try:
        main(["plan", "--stack-file", str(path), "--output", "json"])
    except SystemExit as done:  # click's standalone mode exits even on success
        assert done.code in (0, None)
    plan = json.loads(capsys.readouterr().out)
    assert plan["policy_violations"] == []
    by_type = {}
    for r in plan["resources"]:
        by_type.setdefault(r["type"], []).append(r)
    assert len(by_type[POLICY]) == 1 and len(by_type[ALARM]) == 1 and len(by_type[SCHEDULE]) == 1
    assert by_type[SCHEDULE][0]["inputs"]["desiredCapacity"] == 0
    assert "gpucloud:scaling:BacklogScaling" in by_type


def test_exports_for_agents_and_operators() -> None:
    spec = spec_from_config(mixed_config(), "generated")
    _, seen = run_with_outputs(spec, "mixed")
    assert seen["scalingPolicies"] == {
        "h100": "arn:aws:autoscaling:us-east-1:123456789012:policy/mixed-group-h100-scaling-out"
    }
    assert list(seen["backlogAlarms"]) == ["h100"]
    assert seen["backlogMetric"] == {
        "namespace": "gpucloud",
        "metrics": ["UnclaimedSlots", "BusyNodes"],
        "dimensions": ["ClusterName", "NodeGroup"],
    }
    assert seen["capacityBlockScaleDown"] == {"h100": schedule_timestamp(BLOCK_END - dt.timedelta(minutes=50))}
    assert set(seen["autoscalingGroups"]) == {"h100", "fixed"}


def test_later_deploys_leave_a_scaling_groups_desired_capacity_alone() -> None:
    spec = spec_from_config(mixed_config(), "generated")
    ignored: dict[str, list[str]] = {}

    @pulumi.runtime.test
    def run():
        build_cluster(spec, "mixed")

    with mocked_runtime("mixed", "us-east-1", "us-east-1d") as (_, monitor):
        register = monitor.RegisterResource

        def recording(request):  # what the engine would be told, besides the inputs
            if request.type == ASG:
                ignored[request.name] = list(request.ignoreChanges)
            return register(request)

        monitor.RegisterResource = recording
        run()
    assert ignored == {"mixed-group-h100-asg": ["desiredCapacity"], "mixed-group-fixed-asg": []}
