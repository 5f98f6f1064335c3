"""stop-scale-out with no node running: the budget topic invokes a Lambda function that, over budget,
suspends every scaling group's alarm scale-out. Its code (``infra/budget_stop_lambda.py``) against
botocore's Stubber; its resources, permissions and subscription under Pulumi mocks."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import boto3
import pytest
from botocore.stub import Stubber

from gpucloud.infra import budget_stop_lambda as stop_lambda
from gpucloud.infra.preview import ACCOUNT
from infra.test_budget import ASG, BUDGET, ROLE_POLICY, SUBSCRIPTION, TOPIC_ARN, of, record, spec_with

FUNCTION = "aws:lambda/function:Function"
PERMISSION = "aws:lambda/permission:Permission"
GROUPS = ["p4d-spot-a100-asg-1a2b", "p4d-spot-h100-asg-3c4d"]


def _budget(actual: str, limit: str = "60000.0") -> dict:
    return {
        "Budget": {
            "BudgetName": "gpucloud-p4d-spot",
            "BudgetLimit": {"Amount": limit, "Unit": "USD"},
            "TimeUnit": "MONTHLY",
            "BudgetType": "COST",
            "CalculatedSpend": {"ActualSpend": {"Amount": actual, "Unit": "USD"}},
        }
    }


@pytest.fixture
def clients(monkeypatch):
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv(stop_lambda.BUDGET_NAME, "gpucloud-p4d-spot")
    monkeypatch.setenv(stop_lambda.ACCOUNT_ID, ACCOUNT)
    monkeypatch.setenv(stop_lambda.GROUP_NAMES, ",".join(GROUPS))
    budgets = boto3.client("budgets", region_name="us-east-1")
    autoscaling = boto3.client("autoscaling", region_name="us-east-1")
    with Stubber(budgets) as b, Stubber(autoscaling) as a:
        yield budgets, b, autoscaling, a
        b.assert_no_pending_responses()
        a.assert_no_pending_responses()


def test_over_budget_every_group_stops_scaling_out(clients) -> None:
    budgets, b, autoscaling, a = clients
    b.add_response("describe_budget", _budget("60000.01"), {"AccountId": ACCOUNT, "BudgetName": "gpucloud-p4d-spot"})
    for group in GROUPS:
        a.add_response(
            "suspend_processes", {}, {"AutoScalingGroupName": group, "ScalingProcesses": ["AlarmNotification"]}
        )
    done = stop_lambda.handler({"Records": []}, None, budgets=budgets, autoscaling=autoscaling)
    assert done == {"exceeded": True, "suspended": GROUPS}


def test_under_budget_a_notification_changes_nothing(clients) -> None:
    budgets, b, autoscaling, _ = clients  # the autoscaling Stubber refuses any call
    b.add_response("describe_budget", _budget("48000.0"), {"AccountId": ACCOUNT, "BudgetName": "gpucloud-p4d-spot"})
    assert stop_lambda.handler({}, None, budgets=budgets, autoscaling=autoscaling) == {
        "exceeded": False,
        "suspended": [],
    }


@pytest.fixture(scope="module")
def stop_at_80():
    """stop-scale-out whose alerts stop at 80 %: the 100 % notification is added for the function."""
    spec = spec_with("p4d-spot", monthlyUsd=60000, alertAtPercent=[80], onExceeded="stop-scale-out")
    return record(spec, "p4d-spot")


def test_the_budget_topic_invokes_the_stop_function_at_100_percent(stop_at_80) -> None:
    resources = stop_at_80
    [budget] = of(resources, BUDGET)
    assert [n["threshold"] for n in budget.inputs["notifications"]] == [80.0, 100.0]
    topic = TOPIC_ARN.replace("dev-budget", "p4d-spot-budget")
    [function] = of(resources, FUNCTION)
    assert function.inputs["name"] == "p4d-spot-budget-stop" and function.inputs["handler"] == "index.handler"
    [asg] = of(resources, ASG)
    assert function.inputs["environment"]["variables"] == {
        stop_lambda.BUDGET_NAME: "gpucloud-p4d-spot",
        stop_lambda.ACCOUNT_ID: ACCOUNT,
        stop_lambda.GROUP_NAMES: asg.name,
    }
    [subscription] = [s for s in of(resources, SUBSCRIPTION) if s.inputs["protocol"] == "lambda"]
    assert subscription.inputs["topic"] == topic and subscription.inputs["endpoint"].endswith("p4d-spot-budget-stop")
    shipped = hashlib.sha256(Path(stop_lambda.__file__).read_bytes()).hexdigest()
    assert function.inputs["code"] == {"archive": {"index.py": {"text_sha256": shipped}}}  # the tested module
    [permission] = of(resources, PERMISSION)
    assert (permission.inputs["principal"], permission.inputs["sourceArn"]) == ("sns.amazonaws.com", topic)
    [policy] = [p for p in of(resources, ROLE_POLICY) if p.name.endswith("-budget-stop")]
    read, stop, logs = json.loads(policy.inputs["policy"])["Statement"]
    assert read["Resource"] == [f"arn:aws:budgets::{ACCOUNT}:budget/gpucloud-p4d-spot"]
    assert stop["Action"] == ["autoscaling:SuspendProcesses"] and len(stop["Resource"]) == 1
    assert stop["Resource"][0].endswith(f":autoScalingGroupName/{asg.name}")
    assert logs["Resource"][0].endswith("/aws/lambda/p4d-spot-budget-stop:*")  # its streams


def test_notify_only_makes_no_function(stop_at_80) -> None:
    spec = spec_with("dev", monthlyUsd=1500, alertAtPercent=[80])
    resources = record(spec, "dev")
    assert of(resources, FUNCTION) == [] and [
        n["threshold"] for n in of(resources, BUDGET)[0].inputs["notifications"]
    ] == [80.0]
