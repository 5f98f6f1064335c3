"""The Auto Scaling wrapper against a Stubber-answered client (moto does not implement the
lifecycle calls): exact request parameters, real-shaped responses and errors, idempotent cases."""

from __future__ import annotations

import datetime as dt

import pytest

from gpucloud.agent.asg import AsgError, InstanceNotInGroup, LifecycleHeartbeat, Replacement, ScaleIn
from gpucloud.errors import UserError
from gpucloud.signals.lifecycle_action import LifecycleAction

INSTANCE = "i-1234567890abcdef0"
ASG = "p5-spot-asg"
HOOK = "gpucloud-drain"
TOKEN = "87654321-4321-4321-4321-210987654321"
NO_ACTION = f"No active Lifecycle Action found with instance ID {INSTANCE}"
CONTENTION = (
    "You already have a pending update to an Auto Scaling resource (for example, a group, instance, or load balancer)."
)


def lifecycle_params(token: str | None = TOKEN, **extra) -> dict:
    params = {"LifecycleHookName": HOOK, "AutoScalingGroupName": ASG, "InstanceId": INSTANCE, **extra}
    if token is not None:
        params["LifecycleActionToken"] = token
    return params


def activity(description: str, cause: str) -> dict:
    return {
        "ActivityId": "5091cb52-547a-47ce-a236-c9ccbc2cb2c9",
        "AutoScalingGroupName": ASG,
        "Description": description,
        "Cause": cause,
        "StartTime": dt.datetime(2026, 11, 21, 8, 22, tzinfo=dt.timezone.utc),
        "StatusCode": "InProgress",
        "Progress": 50,
    }


# -- CompleteLifecycleAction -------------------------------------------------------------------
def test_complete_termination_sends_continue_with_the_token(asg):
    asg.ok("complete_lifecycle_action", lifecycle_params(LifecycleActionResult="CONTINUE"))
    assert asg.api.complete_termination(ASG, HOOK, INSTANCE, TOKEN) is True


def test_complete_without_token_identifies_the_action_by_instance(asg):
    asg.ok("complete_lifecycle_action", lifecycle_params(token=None, LifecycleActionResult="ABANDON"))
    assert asg.api.complete_termination(ASG, HOOK, INSTANCE, result="ABANDON") is True


def test_completing_twice_is_harmless(asg):
    asg.ok("complete_lifecycle_action", lifecycle_params(LifecycleActionResult="CONTINUE"))
    asg.fails(
        "complete_lifecycle_action",
        lifecycle_params(LifecycleActionResult="CONTINUE"),
        "ValidationError",
        f"No active Lifecycle Action found with token {TOKEN}",
    )
    action = LifecycleAction(asg_name=ASG, hook_name=HOOK, instance_id=INSTANCE, token=TOKEN)
    assert asg.api.complete(action) is True
    assert asg.api.complete(action) is False


def test_contention_is_retried_with_backoff(asg):
    params = lifecycle_params(LifecycleActionResult="CONTINUE")
    asg.fails("complete_lifecycle_action", params, "ResourceContention", CONTENTION, 500)
    asg.fails("complete_lifecycle_action", params, "ResourceContention", CONTENTION, 500)
    asg.ok("complete_lifecycle_action", params)
    assert asg.api.complete_termination(ASG, HOOK, INSTANCE, TOKEN) is True
    assert asg.sleeps == [0.25, 0.5]


def test_contention_that_outlasts_the_retries_is_one_line(asg):
    params = lifecycle_params(LifecycleActionResult="CONTINUE")
    for _ in range(3):
        asg.fails("complete_lifecycle_action", params, "ResourceContention", CONTENTION, 500)
    with pytest.raises(AsgError) as info:
        asg.api.complete_termination(ASG, HOOK, INSTANCE, TOKEN)
    assert str(info.value) == (
        f"autoscaling CompleteLifecycleAction for {INSTANCE} in {ASG} (hook {HOOK}) failed: ResourceContention: {CONTENTION}"
    )


def test_access_denied_is_not_mistaken_for_done(asg):
    asg.fails(
        "complete_lifecycle_action",
        lifecycle_params(LifecycleActionResult="CONTINUE"),
        "AccessDenied",
        "User: arn:aws:sts::123456789012:assumed-role/node/i-1234567890abcdef0 is not authorized to perform: autoscaling:CompleteLifecycleAction",
        403,
    )
    with pytest.raises(AsgError, match="AccessDenied: User: .* is not authorized"):
        asg.api.complete_termination(ASG, HOOK, INSTANCE, TOKEN)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"result": "PROCEED"}, "lifecycle action result 'PROCEED' is not one of CONTINUE, ABANDON"),
        ({"token": "abc"}, "lifecycle action token 'abc' is not a UUID"),
        ({"instance_id": "node-7"}, "instance id 'node-7' is not an EC2 instance id"),
        ({"hook_name": "drain hook"}, "lifecycle hook name 'drain hook' is not valid"),
        ({"asg_name": ""}, "Auto Scaling group name '' is not a valid name"),
    ],
)
def test_bad_arguments_fail_before_any_call(asg, kwargs, message):
    args = {"asg_name": ASG, "hook_name": HOOK, "instance_id": INSTANCE, "token": TOKEN, **kwargs}
    with pytest.raises(UserError) as info:
        asg.api.complete_termination(**args)
    assert message in str(info.value)


# -- RecordLifecycleActionHeartbeat ------------------------------------------------------------
def test_heartbeat_true_while_active_false_once_gone(asg):
    asg.ok("record_lifecycle_action_heartbeat", lifecycle_params())
    asg.fails("record_lifecycle_action_heartbeat", lifecycle_params(), "ValidationError", NO_ACTION)
    assert asg.api.heartbeat(ASG, HOOK, INSTANCE, TOKEN) is True
    assert asg.api.heartbeat(ASG, HOOK, INSTANCE, TOKEN) is False


def test_heartbeat_loop_stops_by_itself_on_validation_error(asg):
    asg.ok("record_lifecycle_action_heartbeat", lifecycle_params())
    asg.fails("record_lifecycle_action_heartbeat", lifecycle_params(), "Throttling", "Rate exceeded")
    asg.ok("record_lifecycle_action_heartbeat", lifecycle_params())
    asg.fails("record_lifecycle_action_heartbeat", lifecycle_params(), "ValidationError", NO_ACTION)
    loop = LifecycleHeartbeat(asg.api, LifecycleAction(ASG, HOOK, INSTANCE, TOKEN), interval=0.01).start()
    assert loop.wait(timeout=10)  # ends on its own: AWS said the action is gone
    assert loop.ended_by_aws and loop.beats == 2  # the throttled beat was logged, not fatal


def test_heartbeat_loop_stops_on_any_validation_error(asg):
    asg.fails(
        "record_lifecycle_action_heartbeat",
        lifecycle_params(),
        "ValidationError",
        "AutoScalingGroup name not found - AutoScalingGroup p5-spot-asg not found",
    )
    loop = LifecycleHeartbeat(asg.api, LifecycleAction(ASG, HOOK, INSTANCE, TOKEN), interval=0.01).start()
    assert loop.wait(timeout=10) and loop.ended_by_aws and loop.beats == 0


def test_heartbeat_loop_stop_ends_it(asg):
    asg.ok("record_lifecycle_action_heartbeat", lifecycle_params())
    loop = LifecycleHeartbeat(asg.api, LifecycleAction(ASG, HOOK, INSTANCE, TOKEN), interval=60).start()
    loop.stop(timeout=10)
    assert not loop.is_running() and loop.beats == 1 and not loop.ended_by_aws


def test_heartbeat_interval_must_be_positive(asg):
    with pytest.raises(UserError, match="heartbeat interval must be positive"):
        LifecycleHeartbeat(asg.api, LifecycleAction(ASG, HOOK, INSTANCE), interval=0)


# -- SetInstanceProtection ---------------------------------------------------------------------
@pytest.mark.parametrize("protected", [True, False])
def test_protect_sets_scale_in_protection(asg, protected):
    asg.ok(
        "set_instance_protection",
        {"InstanceIds": [INSTANCE], "AutoScalingGroupName": ASG, "ProtectedFromScaleIn": protected},
    )
    asg.api.protect(INSTANCE, ASG, protected)


def test_unprotecting_an_instance_that_left_is_a_no_op_protecting_it_is_an_error(asg):
    message = f"The instance {INSTANCE} is not part of Auto Scaling group {ASG}."
    asg.fails(
        "set_instance_protection",
        {"InstanceIds": [INSTANCE], "AutoScalingGroupName": ASG, "ProtectedFromScaleIn": False},
        "ValidationError",
        message,
    )
    asg.fails(
        "set_instance_protection",
        {"InstanceIds": [INSTANCE], "AutoScalingGroupName": ASG, "ProtectedFromScaleIn": True},
        "ValidationError",
        message,
    )
    asg.api.protect(INSTANCE, ASG, False)
    with pytest.raises(InstanceNotInGroup) as info:
        asg.api.protect(INSTANCE, ASG, True)
    assert (
        str(info.value)
        == f"autoscaling SetInstanceProtection for {INSTANCE} in {ASG} failed: ValidationError: {message}"
    )


# -- DetachInstances (replacement at the notice) -----------------------------------------------
DETACH = {"InstanceIds": [INSTANCE], "AutoScalingGroupName": ASG, "ShouldDecrementDesiredCapacity": False}


def test_request_replacement_detaches_without_decrement(asg):
    asg.ok(
        "detach_instances",
        DETACH,
        {
            "Activities": [
                activity(
                    f"Detaching EC2 instance: {INSTANCE}",
                    f"At 2026-11-21T08:22:04Z instance {INSTANCE} was detached in response to a user request.",
                )
            ]
        },
    )
    assert asg.api.request_replacement(INSTANCE, ASG) is Replacement.DETACHED


@pytest.mark.parametrize(
    "message, outcome",
    [
        (f"The instance {INSTANCE} is not in InService or Standby.", Replacement.ALREADY_LEAVING),
        (f"The instance {INSTANCE} is not part of Auto Scaling group {ASG}.", Replacement.NOT_IN_GROUP),
    ],
)
def test_request_replacement_when_the_group_already_acted(asg, message, outcome):
    asg.fails("detach_instances", DETACH, "ValidationError", message)
    assert asg.api.request_replacement(INSTANCE, ASG) is outcome


def test_request_replacement_other_errors_raise(asg):
    asg.fails(
        "detach_instances",
        DETACH,
        "ValidationError",
        "AutoScalingGroup name not found - AutoScalingGroup p5-spot-asg not found",
    )
    with pytest.raises(AsgError, match="DetachInstances .* AutoScalingGroup name not found"):
        asg.api.request_replacement(INSTANCE, ASG)


# -- TerminateInstanceInAutoScalingGroup (idle scale-in) ---------------------------------------
TERMINATE = {"InstanceId": INSTANCE, "ShouldDecrementDesiredCapacity": True}


def test_scale_in_self_terminates_with_decrement(asg):
    asg.ok(
        "terminate_instance_in_auto_scaling_group",
        TERMINATE,
        {
            "Activity": activity(
                f"Terminating EC2 instance: {INSTANCE}",
                f"At 2026-11-21T08:22:04Z instance {INSTANCE} was taken out of service in response to a user request, shrinking the capacity from 2 to 1.",
            )
        },
    )
    assert asg.api.scale_in_self(INSTANCE) is ScaleIn.TERMINATING


@pytest.mark.parametrize(
    "message, outcome",
    [
        (
            (
                "Currently, desiredSize equals minSize (1). Terminating instance without replacement will violate group's min size "
                "constraint. Either set shouldDecrementDesiredCapacity flag to false or lower group's min size."
            ),
            ScaleIn.AT_MIN_SIZE,
        ),
        (f"Instance Id not found - No managed instance found for instance ID: {INSTANCE}", ScaleIn.NOT_IN_GROUP),
    ],
)
def test_scale_in_self_refusals_are_outcomes(asg, message, outcome):
    asg.fails("terminate_instance_in_auto_scaling_group", TERMINATE, "ValidationError", message)
    assert asg.api.scale_in_self(INSTANCE) is outcome


def test_scale_in_self_retries_a_scaling_activity_in_progress(asg):
    asg.fails(
        "terminate_instance_in_auto_scaling_group",
        TERMINATE,
        "ScalingActivityInProgress",
        "Scaling activity 5091cb52-547a-47ce-a236-c9ccbc2cb2c9 is in progress and blocks this action.",
    )
    asg.ok("terminate_instance_in_auto_scaling_group", TERMINATE, {"Activity": activity("Terminating", "user request")})
    assert asg.api.scale_in_self(INSTANCE) is ScaleIn.TERMINATING
    assert asg.sleeps == [0.25]


# -- SetDesiredCapacity ------------------------------------------------------------------------
def test_set_desired_capacity_ignores_cooldown(asg):
    asg.ok("set_desired_capacity", {"AutoScalingGroupName": ASG, "DesiredCapacity": 3, "HonorCooldown": False})
    asg.api.set_desired_capacity(ASG, 3)


@pytest.mark.parametrize("value", [-1, 1.5, True, "3"])
def test_set_desired_capacity_refuses_non_counts(asg, value):
    with pytest.raises(UserError, match="is not a whole number >= 0"):
        asg.api.set_desired_capacity(ASG, value)
