"""gpucloud:budget under Pulumi mocks: the budget filtered by the stack tag, a notification per
percentage to an encrypted topic Budgets may publish to, and (stop-scale-out) exactly the node IAM
the budget gate needs, its node settings and the monthly resume; the policy pack still passes."""

from __future__ import annotations

import json
from typing import Any

import pulumi
import pytest

from gpucloud.cluster.agent_contract import ACCOUNT_ID_ENV, BUDGET_NAME_ENV
from gpucloud.infra.budget import budget_summary
from gpucloud.infra.preview import ACCOUNT, mocked_runtime, preview_stack
from gpucloud.infra.program import build_cluster
from gpucloud.policy.runner import run_policies
from gpucloud.spec import load_stack_file, stack_file_for
from gpucloud.spec.model import Budget, ClusterSpec

BUDGET = "aws:budgets/budget:Budget"
TOPIC = "aws:sns/topic:Topic"
TOPIC_POLICY = "aws:sns/topicPolicy:TopicPolicy"
SUBSCRIPTION = "aws:sns/topicSubscription:TopicSubscription"
KEY = "aws:kms/key:Key"
ROLE_POLICY = "aws:iam/rolePolicy:RolePolicy"
SCHEDULE = "aws:scheduler/schedule:Schedule"
ASG = "aws:autoscaling/group:Group"
LT = "aws:ec2/launchTemplate:LaunchTemplate"
TOPIC_ARN = f"arn:aws:sns:us-east-1:{ACCOUNT}:dev-budget"  # the mocks' ARN for the topic named dev-budget


def spec_with(stack: str, **budget: Any) -> ClusterSpec:
    spec = load_stack_file(stack_file_for(stack))
    return spec.model_copy(update={"budget": Budget(**budget) if budget else None})


def record(spec: ClusterSpec, stack: str) -> list:
    return preview_stack(spec, stack).resources


def of(resources, type_token):
    return [r for r in resources if r.type == type_token]


def env_of(launch_template) -> dict[str, str]:
    import base64

    script = base64.b64decode(launch_template.inputs["userData"]).decode()
    body = script.split("<<'GPUCLOUD_ENV'\n", 1)[1].split("\nGPUCLOUD_ENV\n", 1)[0]
    return dict(line.split("=", 1) for line in body.splitlines())


@pytest.fixture(scope="module")
def notify():
    spec = spec_with("dev", monthlyUsd=1500, alertAtPercent=[50, 80, 100], alertEmails=["finance@example.com"])
    return spec, record(spec, "dev")


@pytest.fixture(scope="module")
def stop():
    spec = spec_with("p4d-spot", monthlyUsd=60000, onExceeded="stop-scale-out", alertEmails=["finance@example.com"])
    return spec, record(spec, "p4d-spot")


def test_the_budget_is_a_monthly_cost_budget_filtered_by_the_stack_tag(notify) -> None:
    _, resources = notify
    [budget] = of(resources, BUDGET)
    inputs = budget.inputs
    assert inputs["name"] == "gpucloud-dev"
    assert (inputs["budgetType"], inputs["timeUnit"], inputs["limitUnit"]) == ("COST", "MONTHLY", "USD")
    assert inputs["limitAmount"] == "1500.00"
    assert inputs["costFilters"] == [{"name": "TagKeyValue", "values": ["user:gpucloud:stack$dev"]}]
    assert inputs["tags"]["gpucloud:stack"] == "dev"


def test_one_actual_percentage_notification_per_alert_to_the_budget_topic(notify) -> None:
    _, resources = notify
    [budget] = of(resources, BUDGET)
    [_topic] = [t for t in of(resources, TOPIC) if t.inputs["name"] == "dev-budget"]
    assert [
        (n["notificationType"], n["comparisonOperator"], n["threshold"], n["thresholdType"])
        for n in budget.inputs["notifications"]
    ] == [("ACTUAL", "GREATER_THAN", p, "PERCENTAGE") for p in (50.0, 80.0, 100.0)]
    assert all(n["subscriberSnsTopicArns"] == [TOPIC_ARN] for n in budget.inputs["notifications"])
    [subscription] = of(resources, SUBSCRIPTION)
    assert subscription.inputs["endpoint"] == "finance@example.com" and subscription.inputs["topic"] == TOPIC_ARN


def test_budgets_may_publish_to_the_topic_for_this_account_only_and_encrypt_with_its_key(notify) -> None:
    _, resources = notify
    [topic] = [t for t in of(resources, TOPIC) if t.inputs["name"] == "dev-budget"]
    [key] = [k for k in of(resources, KEY) if "budget" in k.name]
    assert (
        topic.inputs["kmsMasterKeyId"] == f"arn:aws:kms:us-east-1:{ACCOUNT}:key/{key.name}"
    )  # a customer key: aws/sns refuses Budgets
    [policy] = of(resources, TOPIC_POLICY)
    assert policy.inputs["arn"] == TOPIC_ARN
    [statement] = json.loads(policy.inputs["policy"])["Statement"]
    assert statement["Principal"] == {"Service": "budgets.amazonaws.com"}
    assert statement["Action"] == "SNS:Publish" and statement["Resource"] == TOPIC_ARN
    assert statement["Condition"] == {
        "StringEquals": {"aws:SourceAccount": ACCOUNT},
        "ArnLike": {"aws:SourceArn": f"arn:aws:budgets::{ACCOUNT}:*"},
    }
    encrypts = [s for s in json.loads(key.inputs["policy"])["Statement"] if s["Sid"] == "PublisherEncrypts"]
    assert encrypts[0]["Principal"] == {"Service": "budgets.amazonaws.com"}
    assert encrypts[0]["Condition"] == {"StringEquals": {"aws:SourceAccount": ACCOUNT}}


def test_notify_gives_the_nodes_no_budget_access_and_schedules_nothing(notify) -> None:
    _, resources = notify
    assert not [p for p in of(resources, ROLE_POLICY) if "budget" in p.name]
    assert not of(resources, SCHEDULE)
    assert all(BUDGET_NAME_ENV not in env_of(lt) for lt in of(resources, LT))


def test_stop_scale_out_grants_view_on_this_budget_and_the_switch_on_this_stacks_groups(stop) -> None:
    _, resources = stop
    [policy] = [p for p in of(resources, ROLE_POLICY) if p.name.endswith("-budget-budget")]
    read, switch = json.loads(policy.inputs["policy"])["Statement"]
    assert read["Action"] == ["budgets:ViewBudget"]
    assert read["Resource"] == [f"arn:aws:budgets::{ACCOUNT}:budget/gpucloud-p4d-spot"]
    assert switch["Action"] == ["autoscaling:SuspendProcesses", "autoscaling:ResumeProcesses"]
    assert switch["Condition"]["StringEquals"] == {
        "autoscaling:ResourceTag/gpucloud:stack": "p4d-spot",
        "autoscaling:ResourceTag/gpucloud:cluster": "p4d-spot",
    }


def test_stop_scale_out_tells_every_node_the_budget_and_account(stop) -> None:
    _, resources = stop
    envs = [env_of(lt) for lt in of(resources, LT)]
    assert envs and all(e[BUDGET_NAME_ENV] == "gpucloud-p4d-spot" and e[ACCOUNT_ID_ENV] == ACCOUNT for e in envs)


def test_every_scaling_group_is_resumed_when_the_month_restarts(stop) -> None:
    _, resources = stop
    [asg] = of(resources, ASG)
    [schedule] = of(resources, SCHEDULE)
    assert schedule.inputs["scheduleExpression"] == "cron(5 0 1 * ? *)"
    assert schedule.inputs["scheduleExpressionTimezone"] == "UTC"
    target = schedule.inputs["target"]
    assert target["arn"] == "arn:aws:scheduler:::aws-sdk:autoscaling:resumeProcesses"
    assert json.loads(target["input"]) == {
        "AutoScalingGroupName": asg.name,
        "ScalingProcesses": ["AlarmNotification"],
    }
    [resume] = [p for p in of(resources, ROLE_POLICY) if p.name.endswith("-budget-resume")]
    [statement] = json.loads(resume.inputs["policy"])["Statement"]
    assert statement["Action"] == ["autoscaling:ResumeProcesses"] and len(statement["Resource"]) == 1
    assert statement["Resource"][0].endswith(f":autoScalingGroupName/{asg.name}")


@pytest.mark.parametrize("fixture", ["notify", "stop"])
def test_the_policy_pack_passes_with_a_budget(fixture: str, request) -> None:
    _, resources = request.getfixturevalue(fixture)
    stack = "dev" if fixture == "notify" else "p4d-spot"
    assert [v.describe() for v in run_policies(resources, stack=stack)] == []


def test_plan_line() -> None:
    assert budget_summary(None) is None
    line = budget_summary(Budget(monthlyUsd=60000, alertAtPercent=[50, 80, 100], onExceeded="stop-scale-out"))
    assert line == "60,000.00 USD/month; alerts at 50%, 80%, 100%; at 100%: stop-scale-out"


def test_plan_shows_the_shipped_stacks_budget_in_one_line_and_in_json(capsys) -> None:
    import json as json_module

    from gpucloud.cli import main

    main(["plan", "--stack", "p4d-spot"])  # returns: no mandatory policy violation
    out = capsys.readouterr().out
    lines = [line for line in out.splitlines() if line.startswith("budget: ")]
    assert lines == ["budget: 60,000.00 USD/month; alerts at 50%, 80%, 100%; at 100%: stop-scale-out"]
    main(["plan", "--stack", "p4d-spot", "--output", "json"])
    found = json_module.loads(capsys.readouterr().out)["budget"]
    assert found["monthly_usd"] == 60000 and found["on_exceeded"] == "stop-scale-out"
    assert found["alert_at_percent"] == [50, 80, 100]


def test_the_stack_outputs_name_the_budget_and_its_topic() -> None:
    spec = spec_with("dev", monthlyUsd=1500, alertEmails=["finance@example.com"])
    seen: dict[str, object] = {}

    @pulumi.runtime.test
    def run():
        outputs = build_cluster(spec, "dev", None)
        outputs.export()
        assert outputs.budget is not None
        return pulumi.Output.all(outputs.budget.budget.name, outputs.budget.topic.arn).apply(
            lambda v: seen.update(name=v[0], topic=v[1])
        )

    with mocked_runtime("dev", spec.region, spec.availability_zone):
        run()
    assert seen == {"name": "gpucloud-dev", "topic": TOPIC_ARN}
