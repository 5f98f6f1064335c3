"""The backlog alarm scales a group out from zero nodes: its unclaimed-slot term has an input that
AWS publishes itself (the job queue's visible slot messages), so no agent has to be running.

The alarm's arguments are read from the stack program under Pulumi mocks and then sent, as a
``PutMetricAlarm`` request, through botocore's validation against the CloudWatch service model.
"""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from gpucloud.cluster import agent_contract
from gpucloud.cluster import scaling_plan as plan
from gpucloud.infra.preview import StackPreview

from .botocore_check import assert_valid_request

ALARM = "aws:cloudwatch/metricAlarm:MetricAlarm"
QUEUE = "aws:sqs/queue:Queue"
ASG = "aws:autoscaling/group:Group"
SCALING_STACKS = ["dev", "p4d-spot"]  # the shipped stacks with scaling on
ID_RE = re.compile(r"\b[a-z][a-z0-9_]*\b")
FUNCTIONS = {"FILL", "IF", "REPEAT"}


def the_alarm(preview: StackPreview) -> dict:
    """The backlog alarm (a drill stack has a second alarm, the FIS stop condition)."""
    (alarm,) = [a for a in preview.of_type(ALARM) if a.name.endswith("-backlog")]
    return alarm.inputs


def job_queue_name(preview: StackPreview) -> str:
    (queue,) = [q for q in preview.of_type(QUEUE) if q.name.endswith("-jobplane-jobs")]
    return queue.name


def put_metric_alarm_request(alarm: dict) -> dict:
    """The recorded Pulumi inputs as the CloudWatch API request the provider sends."""

    def query(q: dict) -> dict:
        out = {"Id": q["id"], "ReturnData": q["returnData"]}
        if "expression" in q:
            out.update(Expression=q["expression"], Label=q["label"])
        else:
            m = q["metric"]
            out["MetricStat"] = {
                "Metric": {
                    "Namespace": m["namespace"],
                    "MetricName": m["metricName"],
                    "Dimensions": [{"Name": k, "Value": v} for k, v in m["dimensions"].items()],
                },
                "Period": int(m["period"]),
                "Stat": m["stat"],
            }
        return out

    return {
        "AlarmName": "backlog",
        "AlarmDescription": alarm["alarmDescription"],
        "ComparisonOperator": alarm["comparisonOperator"],
        "Threshold": float(alarm["threshold"]),
        "EvaluationPeriods": int(alarm["evaluationPeriods"]),
        "DatapointsToAlarm": int(alarm["datapointsToAlarm"]),
        "TreatMissingData": alarm["treatMissingData"],
        "AlarmActions": alarm["alarmActions"],
        "Metrics": [query(q) for q in alarm["metricQueries"]],
    }


@pytest.mark.parametrize("stack", SCALING_STACKS)
def test_unclaimed_slots_come_from_the_job_queue_too(previews, stack: str) -> None:
    alarm = the_alarm(previews[stack])
    queries = {q["id"]: q for q in alarm["metricQueries"]}
    queued = queries[plan.QUEUED_SLOTS_ID]["metric"]
    assert (queued["namespace"], queued["metricName"]) == ("AWS/SQS", "ApproximateNumberOfMessagesVisible")
    # the job queue itself: not its dead-letter queue, not the events queue
    assert queued["dimensions"] == {"QueueName": job_queue_name(previews[stack])}
    assert (queued["stat"], queued["period"]) == ("Maximum", 60)
    agents = queries[plan.AGENT_UNCLAIMED_ID]["metric"]
    assert (agents["namespace"], agents["metricName"]) == (agent_contract.NAMESPACE, agent_contract.UNCLAIMED_SLOTS)


@pytest.mark.parametrize("stack", SCALING_STACKS)
def test_the_metric_math_is_the_shared_constants(previews, stack: str) -> None:
    queries = {q["id"]: q for q in the_alarm(previews[stack])["metricQueries"]}
    expressions = {i: q["expression"] for i, q in queries.items() if "expression" in q}
    assert expressions == {
        plan.AGENTS_ID: "FILL(agent_unclaimed, REPEAT)",
        plan.QUEUED_ID: "FILL(queued_slots, REPEAT)",
        plan.SHORTFALL_ID: ("FILL(busy_nodes, REPEAT) + IF(agents > queued, agents, queued) - FILL(desired, REPEAT)"),
    }
    assert [i for i, q in queries.items() if q["returnData"]] == [plan.SHORTFALL_ID]


@pytest.mark.parametrize("stack", SCALING_STACKS)
def test_every_expression_reads_only_queries_defined_before_it_and_every_input_is_read(previews, stack: str) -> None:
    seen: list[str] = []
    read: set[str] = set()
    for q in the_alarm(previews[stack])["metricQueries"]:
        assert re.fullmatch(r"[a-z][A-Za-z0-9_]*", q["id"]), q["id"]  # CloudWatch's id rule
        if "expression" in q:
            names = set(ID_RE.findall(q["expression"])) - {f.lower() for f in FUNCTIONS}
            assert names <= set(seen), f"{q['id']} reads {names - set(seen)} before they are defined"
            read |= names
        seen.append(q["id"])
    assert set(seen) - read == {plan.SHORTFALL_ID}  # nothing fetched and left unused


@pytest.mark.parametrize("stack", SCALING_STACKS)
def test_the_alarm_is_a_valid_put_metric_alarm_request(previews, stack: str) -> None:
    assert_valid_request("cloudwatch", "put_metric_alarm", put_metric_alarm_request(the_alarm(previews[stack])))


def test_the_group_publishes_the_desired_capacity_the_alarm_subtracts(previews) -> None:
    (asg,) = previews["dev"].of_type(ASG)
    queries = {q["id"]: q for q in the_alarm(previews["dev"])["metricQueries"]}
    desired = queries[plan.DESIRED_ID]["metric"]
    assert (desired["namespace"], desired["metricName"]) == ("AWS/AutoScaling", "GroupDesiredCapacity")
    assert desired["dimensions"] == {"AutoScalingGroupName": asg.name}
    assert "GroupDesiredCapacity" in asg.inputs["enabledMetrics"]


def test_groups_without_scaling_get_no_alarm(previews) -> None:
    assert not previews["p5-capacity-block"].of_type(ALARM)


def test_the_scaling_plan_stays_pure() -> None:
    code = (
        "import sys, gpucloud.cluster.scaling_plan\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('pulumi', 'pulumi_aws', 'boto3')))"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"
