"""Events-queue bodies shaped exactly like the samples AWS documents for each event (spot warning,
rebalance, lifecycle action, state change, capacity block), with the placeholders filled in. Built
from those samples, not from moto's output (moto drops ``account``)."""

from __future__ import annotations

import json
from typing import Any

INSTANCE = "i-1234567890abcdef0"
OTHER_INSTANCE = "i-0fedcba0987654321"
TOKEN = "87654321-4321-4321-4321-210987654321"
ASG = "my-asg"
HOOK = "my-lifecycle-hook"
EVENT_TIME = "2026-11-21T08:22:00Z"
EVENT_EPOCH = 1795249320.0  # EVENT_TIME as epoch seconds


def read_soon_after() -> float:
    """A consumer's clock 7 s after the samples were emitted: not stale (interpret.is_stale)."""
    return EVENT_EPOCH + 7.0


def spot_warning(instance: str = INSTANCE, action: str = "terminate", time: str = EVENT_TIME) -> dict[str, Any]:
    return {
        "version": "0",
        "id": "12345678-1234-1234-1234-123456789012",
        "detail-type": "EC2 Spot Instance Interruption Warning",
        "source": "aws.ec2",
        "account": "123456789012",
        "time": time,
        "region": "us-east-2",
        "resources": [f"arn:aws:ec2:us-east-2:123456789012:instance/{instance}"],
        "detail": {"instance-id": instance, "instance-action": action},
    }


def rebalance(instance: str = INSTANCE, time: str = EVENT_TIME) -> dict[str, Any]:
    return {
        "version": "0",
        "id": "6a7e8feb-b491-4cf7-a9f1-bf3703467718",
        "detail-type": "EC2 Instance Rebalance Recommendation",
        "source": "aws.ec2",
        "account": "123456789012",
        "time": time,
        "region": "us-east-2",
        "resources": [f"arn:aws:ec2:us-east-2:123456789012:instance/{instance}"],
        "detail": {"instance-id": instance},
    }


def terminate_action(instance: str = INSTANCE, token: str = TOKEN) -> dict[str, Any]:
    return {
        "version": "0",
        "id": "468fb2ed-e6b7-4c3e-a1f5-0a6b0b9d2a3f",
        "detail-type": "EC2 Instance-terminate Lifecycle Action",
        "source": "aws.autoscaling",
        "account": "123456789012",
        "time": EVENT_TIME,
        "region": "us-west-2",
        "resources": [
            "arn:aws:autoscaling:us-west-2:123456789012:autoScalingGroup:d4738357-2d40-4038-ae7e-b00ae0227003:autoScalingGroupName/my-asg"
        ],
        "detail": {
            "LifecycleActionToken": token,
            "AutoScalingGroupName": ASG,
            "LifecycleHookName": HOOK,
            "EC2InstanceId": instance,
            "LifecycleTransition": "autoscaling:EC2_INSTANCE_TERMINATING",
            "NotificationMetadata": "additional-info",
        },
    }


def direct_lifecycle(
    instance: str = INSTANCE, transition: str = "autoscaling:EC2_INSTANCE_TERMINATING"
) -> dict[str, Any]:
    return {
        "Origin": "AutoScalingGroup",
        "Destination": "EC2",
        "Service": "AWS Auto Scaling",
        "Time": "2026-11-21T08:22:00.517Z",
        "RequestId": "18b2ec17-3e9b-4c15-8024-ff2e8ce8786a",
        "LifecycleActionToken": TOKEN,
        "AccountId": "123456789012",
        "AutoScalingGroupName": ASG,
        "LifecycleHookName": HOOK,
        "EC2InstanceId": instance,
        "LifecycleTransition": transition,
        "NotificationMetadata": "additional-info",
    }


def hook_test_notification() -> dict[str, Any]:
    return {
        "AccountId": "123456789012",
        "RequestId": "4a3eb9d6-2bc3-4cc6-9e5b-2ab1d3e26c44",
        "AutoScalingGroupARN": "arn:aws:autoscaling:us-west-2:123456789012:autoScalingGroup:042cba90-ad2f-431c-9b4d-6d9055bcc9fb:autoScalingGroupName/my-asg",
        "AutoScalingGroupName": ASG,
        "Service": "AWS Auto Scaling",
        "Event": "autoscaling:TEST_NOTIFICATION",
        "Time": "2026-11-21T08:20:00.000Z",
    }


def state_change(instance: str = INSTANCE, state: str = "running") -> dict[str, Any]:
    return {
        "version": "0",
        "id": "7bf73129-1428-4cd3-a780-95db273d1602",
        "detail-type": "EC2 Instance State-change Notification",
        "source": "aws.ec2",
        "account": "111122223333",
        "time": "2019-10-02T17:59:30Z",
        "region": "us-east-1",
        "resources": [f"arn:aws:ec2:us-east-1:111122223333:instance/{instance}"],
        "detail": {"instance-id": instance, "state": state},
    }


def sns_wrapped(inner: dict[str, Any]) -> dict[str, Any]:
    return {
        "Type": "Notification",
        "MessageId": "22b80b92-fdea-4c2c-8f9d-bdfb0c7bf324",
        "TopicArn": "arn:aws:sns:us-west-2:123456789012:lifecycle",
        "Subject": "Auto Scaling:  Lifecycle action 'TERMINATING'",
        "Message": json.dumps(inner),
        "Timestamp": "2026-11-21T08:22:00.600Z",
        "SignatureVersion": "1",
    }


RESERVATION = "cr-0123456789abcdef0"


def capacity_block_expiring(
    reservation: str = RESERVATION, time: str = EVENT_TIME, *, documented: bool = False
) -> dict[str, Any]:
    """The Capacity Block expiration warning from
    https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/capacity-blocks-monitor.html: as the page
    prints it (``documented``: ``customer_event_id``, ``detail_type``), or in EventBridge's envelope."""
    head: dict[str, Any] = (
        {"customer_event_id": f"{reservation}-approaching-expiry", "detail_type": "Capacity Block Expiration Warning"}
        if documented
        else {"version": "0", "id": "7bf73129-1428-4cd3-a780-95db273d1602"}
    )
    if not documented:
        head["detail-type"] = "Capacity Block Reservation Expiration Warning"
    return {
        **head,
        "source": "aws.ec2",
        "account": "123456789012",
        "time": time,
        "resources": [f"arn:aws:ec2:us-east-1:123456789012:capacity-reservation/{reservation}"],
        "detail": {"capacity-reservation-id": reservation, "end-date": "2026-11-21T09:02:00Z"},
    }


def body(data: dict[str, Any]) -> str:
    return json.dumps(data)
