"""The stack's EventBridge rule forwards a capacity block's expiration warning to the
events queue, and what arrives there is read as the warning. The rule's pattern is the one
``InterruptionEvents`` deploys; EventBridge and SQS are moto's (rule pattern -> SQS delivery is
faithful there; moto accepts an ``aws.ec2`` source, real AWS would not from PutEvents)."""

from __future__ import annotations

import json
import time

import boto3

from gpucloud.infra.jobplane import REBALANCE, capacity_block_pattern
from gpucloud.signals.eventbridge import ReservationExpiring, parse_message
from gpucloud.signals.interpret import parse_rfc3339

RESERVATION = "cr-0123456789abcdef0"
OTHER = "cr-0fedcba9876543210"  # a block of another cluster in the same account


def warning_detail() -> dict[str, str]:
    """EC2 sends the warning 40 minutes before the block ends: the end is taken from the clock when the
    event is sent (a time fixed at import is long past on a loaded machine, and the event then stale)."""
    return {
        "capacity-reservation-id": RESERVATION,
        "end-date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() + 40 * 60)),
    }


def test_the_expiration_warning_reaches_the_events_queue_and_is_read_as_one(fresh_aws_account):
    sqs, events = boto3.client("sqs"), boto3.client("events")
    url = sqs.create_queue(QueueName="events")["QueueUrl"]
    arn = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
    block = capacity_block_pattern([RESERVATION])
    detail = warning_detail()
    for name, pattern in {"capacity-block-expiry": block, "rebalance": REBALANCE}.items():
        events.put_rule(Name=name, EventPattern=json.dumps(pattern), State="ENABLED")
        events.put_targets(Rule=name, Targets=[{"Id": "events-queue", "Arn": arn}])
    sent = events.put_events(
        Entries=[
            {
                "Source": "aws.ec2",
                "DetailType": "Capacity Block Reservation Expiration Warning",
                "Detail": json.dumps(detail),
                "Resources": [f"arn:aws:ec2:us-east-1:123456789012:capacity-reservation/{RESERVATION}"],
            },
            # a capacity-block event the agents need not hear about: matched by no rule
            {"Source": "aws.ec2", "DetailType": "Capacity Block Delivered", "Detail": json.dumps(detail)},
            # another cluster's block ending (the event is account-wide): not this cluster's business
            {
                "Source": "aws.ec2",
                "DetailType": "Capacity Block Reservation Expiration Warning",
                "Detail": json.dumps({**detail, "capacity-reservation-id": OTHER}),
            },
        ]
    )
    assert sent["FailedEntryCount"] == 0
    messages = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10, WaitTimeSeconds=1).get("Messages", [])
    assert len(messages) == 1
    body = messages[0]["Body"]
    event_time = parse_rfc3339(json.loads(body)["time"])
    parsed = parse_message(body, now=event_time + 1)
    assert isinstance(parsed, ReservationExpiring) and parsed.reservation_id == RESERVATION
    assert parsed.deadline == min(event_time + 600, parse_rfc3339(detail["end-date"]) - 1800)
