"""onExceeded: stop-scale-out. The decision as pure functions, DescribeBudget through botocore's Stubber
(requests and responses validated against the real Budgets model), and the backlog publish end to end."""

from __future__ import annotations

import logging
from decimal import Decimal

import boto3
import pytest
from botocore.stub import Stubber

from gpucloud.agent.asg_hooks import AsgHooks, NodeSettings
from gpucloud.agent.backlog_metric import GroupBacklog
from gpucloud.agent.budget_gate import (
    ACCOUNT_ID_ENV,
    BUDGET_NAME_ENV,
    BudgetGate,
    Spend,
    gate_from_env,
    held,
    spend_of,
)

ACCOUNT, BUDGET = "123456789012", "gpucloud-p4d-spot"
INSTANCE, GROUP = "i-0123456789abcdef0", "gpucloud-p4d-a100"
DESCRIBE = {"AccountId": ACCOUNT, "BudgetName": BUDGET}


def budget_response(actual: str, limit: str = "5000.0") -> dict:
    return {
        "Budget": {
            "BudgetName": BUDGET,
            "BudgetLimit": {"Amount": limit, "Unit": "USD"},
            "TimeUnit": "MONTHLY",
            "BudgetType": "COST",
            "CalculatedSpend": {"ActualSpend": {"Amount": actual, "Unit": "USD"}},
        }
    }


@pytest.fixture
def budgets(monkeypatch):
    for k, v in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing"}.items():
        monkeypatch.setenv(k, v)
    client = boto3.client("budgets", region_name="us-east-1")
    with Stubber(client) as stub:
        yield client, stub
        stub.assert_no_pending_responses()


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.mark.parametrize(
    ("actual", "limit", "exceeded"),
    [("4999.99", "5000", False), ("5000", "5000", True), ("7200.5", "5000", True), ("0", "0", True), ("0", "1", False)],
)
def test_exceeded_at_100_percent_of_the_limit(actual: str, limit: str, exceeded: bool) -> None:
    assert Spend(Decimal(actual), Decimal(limit)).exceeded is exceeded


def test_over_budget_no_group_has_new_work_and_busy_nodes_stay_counted() -> None:
    backlogs = [GroupBacklog("p4d", "a100", 3, 2), GroupBacklog("p4d", "h100", 5, 0)]
    assert held(backlogs, exceeded=False) == backlogs
    assert [(b.node_group, b.unclaimed_slots, b.busy_nodes) for b in held(backlogs, exceeded=True)] == [
        ("a100", 0, 2),
        ("h100", 0, 0),
    ]


def test_a_response_without_actual_spend_is_an_error_not_a_zero() -> None:
    response = budget_response("1")
    del response["Budget"]["CalculatedSpend"]
    with pytest.raises(ValueError, match="no actual spend"):
        spend_of(response)


def test_the_budget_is_read_once_per_check_interval(budgets) -> None:
    client, stub = budgets
    clock = Clock()
    gate = BudgetGate(client, account_id=ACCOUNT, budget_name=BUDGET, clock=clock, check_seconds=600)
    stub.add_response("describe_budget", budget_response("100.0"), DESCRIBE)
    stub.add_response("describe_budget", budget_response("5000.01"), DESCRIBE)
    assert gate.exceeded() is False
    clock.now += 599
    assert gate.exceeded() is False  # cached: a second call would find no stubbed response... or the wrong one
    clock.now += 1
    assert gate.exceeded() is True


def test_a_failed_read_fails_open_is_logged_once_and_is_retried(budgets, caplog) -> None:
    client, stub = budgets
    clock = Clock()
    gate = BudgetGate(client, account_id=ACCOUNT, budget_name=BUDGET, clock=clock, check_seconds=600)
    stub.add_response("describe_budget", budget_response("6000"), DESCRIBE)
    stub.add_client_error("describe_budget", "AccessDeniedException", "not authorized", 400, expected_params=DESCRIBE)
    stub.add_client_error("describe_budget", "ThrottlingException", "slow down", 400, expected_params=DESCRIBE)
    stub.add_response("describe_budget", budget_response("6000"), DESCRIBE)
    caplog.set_level(logging.INFO, logger="gpucloud.agent")
    assert gate.exceeded() is True
    for _ in range(2):  # two failed reads in a row: scale-out is not stopped by a stale "exceeded"
        clock.now += 600
        assert gate.exceeded() is False
    assert sum("cannot read budget" in r.getMessage() for r in caplog.records) == 1
    clock.now += 600
    assert gate.exceeded() is True  # retried, and the gate closes again
    assert any("read again" in r.getMessage() for r in caplog.records)


def test_the_gate_exists_only_when_the_stack_names_a_budget(monkeypatch) -> None:
    session = boto3.session.Session(aws_access_key_id="t", aws_secret_access_key="t", region_name="eu-west-1")
    assert gate_from_env(session, {}) is None
    assert gate_from_env(session, {BUDGET_NAME_ENV: BUDGET}) is None
    gate = gate_from_env(session, {BUDGET_NAME_ENV: BUDGET, ACCOUNT_ID_ENV: ACCOUNT})
    assert gate is not None and gate.budget_name == BUDGET and gate.account_id == ACCOUNT


@pytest.fixture
def node_clients(budgets):
    budgets_client, budgets_stub = budgets
    autoscaling = boto3.client("autoscaling", region_name="us-east-1")
    cloudwatch = boto3.client("cloudwatch", region_name="us-east-1")
    with Stubber(autoscaling) as asg, Stubber(cloudwatch) as cw:
        yield budgets_client, budgets_stub, autoscaling, asg, cloudwatch, cw
        asg.assert_no_pending_responses()
        cw.assert_no_pending_responses()


def _published(unclaimed: dict[str, float], busy: dict[str, float]) -> dict:
    def dims(group: str) -> list[dict[str, str]]:
        return [{"Name": "ClusterName", "Value": "p4d"}, {"Name": "NodeGroup", "Value": group}]

    from botocore.stub import ANY

    data = [
        {"MetricName": "LiveAgents", "Dimensions": [{"Name": "ClusterName", "Value": "p4d"}], "Timestamp": ANY}
        | {"Value": 1.0, "Unit": "Count"}
    ]
    for group in unclaimed:
        data.append(
            {"MetricName": "UnclaimedSlots", "Dimensions": dims(group), "Timestamp": ANY, "Value": unclaimed[group]}
            | {"Unit": "Count"}
        )
        data.append(
            {"MetricName": "BusyNodes", "Dimensions": dims(group), "Timestamp": ANY, "Value": busy[group]}
            | {"Unit": "Count"}
        )
    return {"Namespace": "gpucloud", "MetricData": data}


OTHER_GROUP = "gpucloud-p4d-h100"  # the cluster's other group, at 0 nodes: no agent of its own


def _cluster_groups(asg: Stubber, *names: str) -> None:
    """DescribeAutoScalingGroups by the cluster tag: the groups the switch acts on."""
    groups = [_group() | {"AutoScalingGroupName": name} for name in names]
    asg.add_response(
        "describe_auto_scaling_groups",
        {"AutoScalingGroups": groups},
        {"Filters": [{"Name": "tag:gpucloud:cluster", "Values": ["p4d"]}]},
    )


def test_over_budget_the_publish_says_no_new_slots_and_every_group_stops_scaling_out(node_clients) -> None:
    """A busy node (running a job) publishes with the budget exceeded: 0 unclaimed slots for every
    group, its busy count as it is, and the alarm-driven scale-out suspended on every group of the
    cluster, the other group at 0 nodes too (the queue's wake term would launch a node into it); no
    protection change, no termination (the Stubber fails on any call not expected here). Back under
    budget, every group's alarm scaling resumes and the real backlog is published again."""
    budgets_client, budgets_stub, autoscaling, asg, cloudwatch, cw = node_clients
    settings = NodeSettings(
        cluster="p4d", node_group="a100", lifecycle_hook="gpucloud-drain", scale_in=True, idle_seconds=900
    )
    hooks = AsgHooks(
        autoscaling=autoscaling, cloudwatch=cloudwatch, instance_id=INSTANCE, asg_name=GROUP, settings=settings
    )
    clock = Clock()
    hooks.budget = BudgetGate(budgets_client, account_id=ACCOUNT, budget_name=BUDGET, clock=clock, check_seconds=600)
    suspend = {"AutoScalingGroupName": GROUP, "ScalingProcesses": ["AlarmNotification"]}

    budgets_stub.add_response("describe_budget", budget_response("5200.0"), DESCRIBE)
    cw.add_response("put_metric_data", {}, _published({"a100": 0.0, "h100": 0.0}, {"a100": 1.0, "h100": 0.0}))
    _cluster_groups(asg, OTHER_GROUP, GROUP)
    asg.add_response("suspend_processes", {}, suspend)
    asg.add_response("suspend_processes", {}, suspend | {"AutoScalingGroupName": OTHER_GROUP})
    hooks.publish_backlog(unclaimed_slots=4, busy_nodes=1, other_groups={"h100": (2, 0)})

    # a minute later: still over (cached, no second read), no second suspend
    cw.add_response("put_metric_data", {}, _published({"a100": 0.0, "h100": 0.0}, {"a100": 1.0, "h100": 0.0}))
    hooks.publish_backlog(unclaimed_slots=4, busy_nodes=1, other_groups={"h100": (2, 0)})

    # the limit was raised (or a new month began): the real backlog again, and scale-out resumes
    clock.now += 600
    budgets_stub.add_response("describe_budget", budget_response("5200.0", limit="10000.0"), DESCRIBE)
    cw.add_response("put_metric_data", {}, _published({"a100": 4.0, "h100": 2.0}, {"a100": 1.0, "h100": 0.0}))
    _cluster_groups(asg, GROUP, OTHER_GROUP)
    asg.add_response("resume_processes", {}, suspend)
    asg.add_response("resume_processes", {}, suspend | {"AutoScalingGroupName": OTHER_GROUP})
    hooks.publish_backlog(unclaimed_slots=4, busy_nodes=1, other_groups={"h100": (2, 0)})


def test_without_a_budget_gate_the_backlog_is_published_as_counted(node_clients) -> None:
    _, _, autoscaling, _, cloudwatch, cw = node_clients
    settings = NodeSettings(cluster="p4d", node_group="a100", lifecycle_hook=None, scale_in=True, idle_seconds=900)
    hooks = AsgHooks(
        autoscaling=autoscaling, cloudwatch=cloudwatch, instance_id=INSTANCE, asg_name=GROUP, settings=settings
    )
    cw.add_response("put_metric_data", {}, _published({"a100": 4.0}, {"a100": 1.0}))
    hooks.publish_backlog(unclaimed_slots=4, busy_nodes=1)


def _group(desired: int = 2) -> dict:
    return {
        "AutoScalingGroupName": GROUP,
        "MinSize": 0,
        "MaxSize": 4,
        "DesiredCapacity": desired,
        "DefaultCooldown": 300,
        "AvailabilityZones": ["us-east-1a"],
        "HealthCheckType": "EC2",
        "CreatedTime": "2026-11-01T00:00:00Z",
    }


def test_a_busy_node_stops_scale_out_at_its_group_check_and_the_wind_down_check_still_runs(
    node_clients, caplog
) -> None:
    """Busy nodes publish no backlog; their group check (every minute while running) applies the gate.
    A refused suspend is logged once and retried, and never costs the wind-down check."""
    budgets_client, budgets_stub, autoscaling, asg, cloudwatch, _ = node_clients
    settings = NodeSettings(
        cluster="p4d", node_group="a100", lifecycle_hook="gpucloud-drain", scale_in=True, idle_seconds=900
    )
    hooks = AsgHooks(
        autoscaling=autoscaling, cloudwatch=cloudwatch, instance_id=INSTANCE, asg_name=GROUP, settings=settings
    )
    clock = Clock()
    hooks.budget = BudgetGate(budgets_client, account_id=ACCOUNT, budget_name=BUDGET, clock=clock, check_seconds=600)
    suspend = {"AutoScalingGroupName": GROUP, "ScalingProcesses": ["AlarmNotification"]}
    describe = {"AutoScalingGroupNames": [GROUP]}
    caplog.set_level(logging.WARNING, logger="gpucloud.agent")

    budgets_stub.add_response("describe_budget", budget_response("5000.0"), DESCRIBE)
    _cluster_groups(asg, GROUP)
    asg.add_client_error("suspend_processes", "AccessDenied", "not authorized", 403, expected_params=suspend)
    asg.add_response("describe_auto_scaling_groups", {"AutoScalingGroups": [_group()]}, describe)
    assert hooks.group_ending() is None  # not wound down; checked despite the refused suspend

    _cluster_groups(asg, GROUP)
    asg.add_client_error("suspend_processes", "AccessDenied", "not authorized", 403, expected_params=suspend)
    asg.add_response("describe_auto_scaling_groups", {"AutoScalingGroups": [_group()]}, describe)
    assert hooks.group_ending() is None
    assert sum("cannot suspend" in r.getMessage() for r in caplog.records) == 1

    _cluster_groups(asg, GROUP)
    asg.add_response("suspend_processes", {}, suspend)
    asg.add_response(
        "describe_auto_scaling_groups", {"AutoScalingGroups": [_group(desired=0) | {"MaxSize": 0}]}, describe
    )
    notice = hooks.group_ending()
    assert notice is not None and notice.kind == "asg-terminate"  # the wind-down still stops the node

    asg.add_response("describe_auto_scaling_groups", {"AutoScalingGroups": [_group()]}, describe)
    assert hooks.group_ending() is None  # suspended once: no second call while still exceeded
