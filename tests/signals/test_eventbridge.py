"""Events-queue bodies -> Notices: pure parsing over the reference's sample payloads."""

from __future__ import annotations

import json

import pytest

from gpucloud.errors import UserError
from gpucloud.signals.eventbridge import QueueRules, Skipped, UnreadableEvent, instance_of, parse_message
from gpucloud.signals.lifecycle_action import LifecycleAction, lifecycle_action_of

from . import eventbridge_samples as s

NOW = s.EVENT_EPOCH + 7.0  # the message is read 7 s after EventBridge emitted it


def parse(data: dict) -> object:
    return parse_message(s.body(data), now=NOW)


@pytest.mark.parametrize("action", ["terminate", "stop"])
def test_spot_warning_deadline_is_event_time_plus_two_minutes(action):
    notice = parse(s.spot_warning(action=action))
    assert notice.kind == "spot-interruption" and notice.source == "queue" and notice.is_stop
    assert notice.action == action
    assert notice.deadline == s.EVENT_EPOCH + 120  # from the emission time, not from when we read it
    assert notice.seconds_left(NOW) == pytest.approx(113.0)
    assert notice.received_at == NOW
    assert instance_of(notice) == s.INSTANCE


def test_spot_hibernate_has_no_lead():
    assert parse(s.spot_warning(action="hibernate")).deadline == s.EVENT_EPOCH


def test_spot_warning_dedup_key_is_stable_and_per_instance():
    first = parse(s.spot_warning())
    redelivered = parse_message(json.dumps(s.spot_warning(), indent=2), now=NOW + 30)
    other = parse(s.spot_warning(instance=s.OTHER_INSTANCE))
    assert first.event_id == redelivered.event_id
    assert first.event_id != other.event_id


def test_rebalance_has_no_deadline():
    notice = parse(s.rebalance())
    assert notice.kind == "rebalance" and notice.deadline is None and not notice.is_stop
    assert instance_of(notice) == s.INSTANCE


def test_eventbridge_lifecycle_action_keeps_token_hook_and_group():
    notice = parse(s.terminate_action())
    assert notice.kind == "asg-terminate" and notice.action == "Terminated"
    assert notice.deadline == s.EVENT_EPOCH + QueueRules().lifecycle_timeout
    assert notice.payload["LifecycleActionToken"] == s.TOKEN
    assert lifecycle_action_of(notice) == LifecycleAction(
        asg_name=s.ASG, hook_name=s.HOOK, instance_id=s.INSTANCE, token=s.TOKEN
    )


def test_lifecycle_deadline_follows_the_hook_timeout():
    notice = parse_message(s.body(s.terminate_action()), now=NOW, rules=QueueRules(lifecycle_timeout=1800))
    assert notice.deadline == s.EVENT_EPOCH + 1800


def test_direct_notification_and_eventbridge_event_for_one_action_share_a_key():
    direct = parse(s.direct_lifecycle())
    bridged = parse(s.terminate_action())
    assert direct.kind == "asg-terminate"
    assert direct.deadline == pytest.approx(s.EVENT_EPOCH + 0.517 + QueueRules().lifecycle_timeout)
    assert lifecycle_action_of(direct) == lifecycle_action_of(bridged)
    assert direct.event_id == bridged.event_id


def test_sns_wrapped_messages_are_unwrapped():
    assert parse(s.sns_wrapped(s.direct_lifecycle())).event_id == parse(s.direct_lifecycle()).event_id
    assert parse(s.sns_wrapped(s.spot_warning())).kind == "spot-interruption"


@pytest.mark.parametrize(
    "data, reason",
    [
        (s.hook_test_notification(), "test notification"),
        (s.direct_lifecycle(transition="autoscaling:EC2_INSTANCE_LAUNCHING"), "launch lifecycle action"),
        (s.state_change(), "report, not a warning"),
        (s.sns_wrapped(s.hook_test_notification()), "test notification"),
    ],
)
def test_messages_that_ask_for_nothing_are_skipped(data, reason):
    result = parse(data)
    assert isinstance(result, Skipped) and reason in result.reason


def _without(data: dict, *path: str) -> dict:
    target = data
    for key in path[:-1]:
        target = target[key]
    del target[path[-1]]
    return data


def _with(data: dict, value: object, *path: str) -> dict:
    target = data
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    return data


@pytest.mark.parametrize(
    "body, message",
    [
        ("", "message body is empty"),
        ("{not json", "message body is not JSON"),
        ("[1, 2]", "message body is JSON list, expected an object"),
        (json.dumps({"hello": "world"}), "neither an EventBridge event"),
        (
            s.body(_with(s.spot_warning(), "AWS Health Event", "detail-type")),
            "detail-type 'AWS Health Event' is not one of",
        ),
        (s.body(_with(s.spot_warning(), "my.app", "source")), "has source 'my.app'; only 'aws.ec2' sends it"),
        (s.body(_without(s.spot_warning(), "detail")), "has no 'detail' object"),
        (s.body(_with(s.spot_warning(), "yyyy-mm-ddThh:mm:ssZ", "time")), "is not an RFC 3339 date-time"),
        (
            s.body(_with(s.spot_warning(), "explode", "detail", "instance-action")),
            "instance-action 'explode' is not one of terminate, stop, hibernate",
        ),
        (s.body(_with(s.spot_warning(), "i-nothex", "detail", "instance-id")), "is not an EC2 instance id"),
        (s.body(_without(s.rebalance(), "detail", "instance-id")), "has no string 'instance-id'"),
        (s.body(_with(s.terminate_action(), "short", "detail", "LifecycleActionToken")), "is not a UUID"),
        (
            s.body(_with(s.terminate_action(), "bad hook!", "detail", "LifecycleHookName")),
            "lifecycle hook name 'bad hook!' is not valid",
        ),
        (
            s.body(_with(s.direct_lifecycle(), "autoscaling:EC2_INSTANCE_EXPLODING", "LifecycleTransition")),
            "is not autoscaling:EC2_INSTANCE_TERMINATING",
        ),
        (s.body(_without(s.direct_lifecycle(), "Time")), "has no string 'Time'"),
        (json.dumps({"Type": "Notification", "Message": "not json"}), "SNS Message is not JSON"),
    ],
)
def test_unreadable_bodies_raise_one_line_naming_the_problem(body, message):
    with pytest.raises(UnreadableEvent) as info:
        parse_message(body, now=NOW)
    text = str(info.value)
    assert message in text
    assert "\n" not in text and len(text) < 300


@pytest.mark.parametrize("timeout", [0, 29, 7201])
def test_lifecycle_timeout_outside_the_hook_range_is_refused(timeout):
    with pytest.raises(UserError, match="outside 30 to 7200 seconds"):
        QueueRules(lifecycle_timeout=timeout)
