"""The agent's Auto Scaling calls, checked by botocore's Stubber (moto lacks them): requests are
validated against the service model, responses are canned."""

from __future__ import annotations

import boto3
import pytest
from botocore.stub import ANY, Stubber

from gpucloud.agent.asg_hooks import AsgHooks, NodeSettings, OfflineHooks, group_of
from gpucloud.errors import UserError

INSTANCE, GROUP = "i-0123456789abcdef0", "gpucloud-dev-spot"
SETTINGS = NodeSettings(
    cluster="dev", node_group="spot", lifecycle_hook="gpucloud-drain", scale_in=True, idle_seconds=600
)


@pytest.fixture
def clients(monkeypatch):
    for k, v in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing"}.items():
        monkeypatch.setenv(k, v)
    autoscaling = boto3.client("autoscaling", region_name="us-east-1")
    cloudwatch = boto3.client("cloudwatch", region_name="us-east-1")
    with Stubber(autoscaling) as asg, Stubber(cloudwatch) as cw:
        yield autoscaling, cloudwatch, asg, cw
        asg.assert_no_pending_responses()
        cw.assert_no_pending_responses()


def hooks(clients, settings: NodeSettings = SETTINGS) -> AsgHooks:
    autoscaling, cloudwatch, _, _ = clients
    return AsgHooks(
        autoscaling=autoscaling, cloudwatch=cloudwatch, instance_id=INSTANCE, asg_name=GROUP, settings=settings
    )


def test_protection_is_set_when_busy_and_lifted_when_idle_once_each(clients):
    _, _, asg, _ = clients
    for protected in (True, False):
        asg.add_response(
            "set_instance_protection",
            {},
            {"InstanceIds": [INSTANCE], "AutoScalingGroupName": GROUP, "ProtectedFromScaleIn": protected},
        )
    h = hooks(clients)
    h.busy(True)
    h.busy(True)  # no second call: already protected
    h.busy(False)


def test_a_notice_detaches_the_node_without_decrement_so_the_replacement_starts_now(clients):
    _, _, asg, _ = clients
    asg.add_response(
        "detach_instances",
        {"Activities": []},
        {"InstanceIds": [INSTANCE], "AutoScalingGroupName": GROUP, "ShouldDecrementDesiredCapacity": False},
    )
    assert "replacement" in hooks(clients).noticed()


def test_the_lifecycle_action_is_completed_with_continue(clients):
    _, _, asg, _ = clients
    asg.add_response(
        "complete_lifecycle_action",
        {},
        {
            "AutoScalingGroupName": GROUP,
            "LifecycleHookName": "gpucloud-drain",
            "InstanceId": INSTANCE,
            "LifecycleActionResult": "CONTINUE",
        },
    )
    assert hooks(clients).committed() is True


def test_without_a_lifecycle_hook_nothing_is_completed(clients):
    settings = NodeSettings(cluster="dev", node_group="spot", lifecycle_hook=None, scale_in=False, idle_seconds=60)
    assert hooks(clients, settings).committed() is False


def test_the_backlog_is_published_as_both_counts_in_one_call(clients):
    _, _, _, cw = clients
    cw.add_response("put_metric_data", {}, {"Namespace": "gpucloud", "MetricData": ANY})
    hooks(clients).publish_backlog(unclaimed_slots=3, busy_nodes=2)


def test_an_idle_node_above_min_size_terminates_itself_with_a_decrement(clients):
    _, _, asg, _ = clients
    asg.add_response(
        "describe_auto_scaling_groups",
        {"AutoScalingGroups": [_group(desired=3, min_size=0)]},
        {"AutoScalingGroupNames": [GROUP]},
    )
    asg.add_response(
        "set_instance_protection",
        {},
        {"InstanceIds": [INSTANCE], "AutoScalingGroupName": GROUP, "ProtectedFromScaleIn": False},
    )
    asg.add_response(
        "terminate_instance_in_auto_scaling_group", {}, {"InstanceId": INSTANCE, "ShouldDecrementDesiredCapacity": True}
    )
    asg.add_response("complete_lifecycle_action", {}, _own_action())
    assert hooks(clients).scale_in(idle_for=601, unclaimed_slots=0) is True


def test_an_idle_node_stays_while_slots_wait_or_before_its_idle_time_without_asking_the_group(clients):
    h = hooks(clients)  # no stubbed response: any call would fail the test
    assert h.scale_in(idle_for=601, unclaimed_slots=2) is False
    assert h.scale_in(idle_for=10, unclaimed_slots=0) is False


def test_an_idle_node_at_min_size_stays(clients):
    _, _, asg, _ = clients
    asg.add_response(
        "describe_auto_scaling_groups",
        {"AutoScalingGroups": [_group(desired=1, min_size=1)]},
        {"AutoScalingGroupNames": [GROUP]},
    )
    assert hooks(clients).scale_in(idle_for=601, unclaimed_slots=0) is False


def test_the_group_is_found_from_the_instance(clients):
    autoscaling, _, asg, _ = clients
    asg.add_response(
        "describe_auto_scaling_instances",
        {
            "AutoScalingInstances": [
                {
                    "InstanceId": INSTANCE,
                    "AutoScalingGroupName": GROUP,
                    "AvailabilityZone": "us-east-1a",
                    "LifecycleState": "InService",
                    "HealthStatus": "HEALTHY",
                    "ProtectedFromScaleIn": False,
                }
            ]
        },
        {"InstanceIds": [INSTANCE]},
    )
    asg.add_response("describe_auto_scaling_instances", {"AutoScalingInstances": []}, {"InstanceIds": [INSTANCE]})
    assert group_of(autoscaling, INSTANCE) == GROUP
    assert group_of(autoscaling, INSTANCE) is None


@pytest.mark.parametrize(
    "env, message",
    [
        ({"GPUCLOUD_IDLE_MINUTES": "ten"}, "GPUCLOUD_IDLE_MINUTES='ten' is not a number"),
        ({"GPUCLOUD_IDLE_MINUTES": "0"}, "more than 0 minutes"),
        ({"GPUCLOUD_SCALE_IN": "yes"}, "GPUCLOUD_SCALE_IN='yes' must be 1"),
        ({"GPUCLOUD_LIFECYCLE_TIMEOUT": "10m"}, "GPUCLOUD_LIFECYCLE_TIMEOUT='10m' is not a number of seconds"),
        ({"GPUCLOUD_LIFECYCLE_TIMEOUT": "9000"}, "from 30 to 7200"),
    ],
)
def test_bad_node_settings_are_named(env, message):
    with pytest.raises(UserError, match=message):
        NodeSettings.from_env(env)


def test_offline_hooks_do_nothing_and_never_scale_in():
    h = OfflineHooks()
    h.busy(True)
    assert h.scale_in(idle_for=1e9, unclaimed_slots=0) is False and h.committed() is False


def _group(*, desired: int, min_size: int) -> dict:
    return {
        "AutoScalingGroupName": GROUP,
        "MinSize": min_size,
        "MaxSize": 10,
        "DesiredCapacity": desired,
        "DefaultCooldown": 300,
        "AvailabilityZones": ["us-east-1a"],
        "HealthCheckType": "EC2",
        "CreatedTime": "2026-01-01T00:00:00Z",
    }


def _no_active_action(asg) -> None:
    asg.add_client_error(
        "complete_lifecycle_action",
        service_error_code="ValidationError",
        service_message="No active Lifecycle Action found with instance ID i-0123456789abcdef0",
        http_status_code=400,
        expected_params=_own_action(),
    )


def _own_action() -> dict:
    return {
        "AutoScalingGroupName": GROUP,
        "LifecycleHookName": "gpucloud-drain",
        "InstanceId": INSTANCE,
        "LifecycleActionResult": "CONTINUE",
    }


def test_an_idle_node_that_scales_itself_in_completes_its_own_lifecycle_action(clients):
    # Before: the last idle node's drain hook waited out its timeout because nobody completed it.
    # The action appears once the instance reaches Terminating:Wait, a moment after the terminate call.
    _, _, asg, _ = clients
    asg.add_response(
        "describe_auto_scaling_groups",
        {"AutoScalingGroups": [_group(desired=1, min_size=0)]},
        {"AutoScalingGroupNames": [GROUP]},
    )
    asg.add_response(
        "set_instance_protection",
        {},
        {"InstanceIds": [INSTANCE], "AutoScalingGroupName": GROUP, "ProtectedFromScaleIn": False},
    )
    asg.add_response(
        "terminate_instance_in_auto_scaling_group", {}, {"InstanceId": INSTANCE, "ShouldDecrementDesiredCapacity": True}
    )
    _no_active_action(asg)
    asg.add_response("complete_lifecycle_action", {}, _own_action())
    h = hooks(clients)
    h.sleep = lambda seconds: None  # the retry's wait; the Stubber answers at once
    assert h.scale_in(idle_for=601, unclaimed_slots=0) is True
