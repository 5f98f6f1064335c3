"""The events-queue side of a capacity block's end: its expiration warning (the documented payload,
on moto SQS) reaches the fleet consumer, which lists the reservation's instances (EC2
DescribeInstances, answered by botocore's Stubber) and stops the gangs running there, through the
job table, so they save and requeue before EC2 terminates the block's instances. No lifecycle
action is completed (the instances are InService); the block's group is marked (an Auto Scaling tag)
so that its idle agents, which the message does not reach, stop taking work too."""

from __future__ import annotations

import json
import time

import boto3
import pytest
from botocore.stub import ANY, Stubber

from gpucloud.agent.events_handler import ec2_reservation_instances
from gpucloud.agent.events_queue import EventsQueueConsumer
from gpucloud.cluster.agent_contract import BLOCK_ENDING_TAG
from gpucloud.signals.eventbridge import CAPACITY_BLOCK_ACTION
from gpucloud.signals.interpret import format_rfc3339

from .test_events_handler import GROUP, LEASE, SELF, X, asg, handler, jq, running_gang  # noqa: F401 - fixtures

RESERVATION = "cr-0123456789abcdef0"


def warning_body(sent: float) -> str:
    """The documented event (capacity-blocks-monitor), as EventBridge delivers it."""
    return json.dumps(
        {
            "version": "0",
            "id": "7bf73129-1428-4cd3-a780-95db273d1602",
            "detail-type": "Capacity Block Reservation Expiration Warning",
            "source": "aws.ec2",
            "account": "123456789012",
            "time": format_rfc3339(sent),
            "region": "us-east-1",
            "resources": [f"arn:aws:ec2:us-east-1:123456789012:capacity-reservation/{RESERVATION}"],
            "detail": {"capacity-reservation-id": RESERVATION, "end-date": format_rfc3339(sent + 2400)},
        }
    )


@pytest.fixture
def ec2(monkeypatch):
    for k, v in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing"}.items():
        monkeypatch.setenv(k, v)
    client = boto3.client("ec2", region_name="us-east-1", endpoint_url="https://ec2.us-east-1.amazonaws.com")
    with Stubber(client) as stub:
        yield client, stub
        stub.assert_no_pending_responses()


def expect_reservation(stub, instances: list[str]) -> None:
    stub.add_response(
        "describe_instances",
        {
            "Reservations": [
                {"ReservationId": "r-0123456789abcdef0", "Instances": [{"InstanceId": i} for i in instances]}
            ]
        },
        {
            "Filters": [
                {"Name": "capacity-reservation-id", "Values": [RESERVATION]},
                {"Name": "instance-state-name", "Values": ["pending", "running"]},
            ]
        },
    )


def test_the_warning_on_the_events_queue_stops_the_gangs_in_the_block(jq, asg, ec2, fresh_aws_account):
    hooks, asg_stub = asg  # only the group's mark is expected: any other Auto Scaling call fails the test
    client, stub = ec2
    started = running_gang(jq, dead_for=LEASE + 5)  # X's agent is dead; SELF's is alive
    expect_reservation(stub, [X])
    asg_stub.add_response(
        "describe_auto_scaling_instances",
        {
            "AutoScalingInstances": [
                {
                    "InstanceId": X,
                    "AutoScalingGroupName": GROUP,
                    "AvailabilityZone": "us-east-1a",
                    "LifecycleState": "InService",
                    "HealthStatus": "HEALTHY",
                    "ProtectedFromScaleIn": True,
                }
            ]
        },
        {"InstanceIds": [X]},
    )
    asg_stub.add_response(
        "create_or_update_tags",
        {},
        {
            "Tags": [
                {
                    "ResourceId": GROUP,
                    "ResourceType": "auto-scaling-group",
                    "Key": BLOCK_ENDING_TAG,
                    "Value": ANY,
                    "PropagateAtLaunch": False,
                }
            ]
        },
    )
    fleet = handler(jq, hooks, reservation_instances=ec2_reservation_instances(client))
    sqs = boto3.client("sqs")
    url = sqs.create_queue(QueueName="events")["QueueUrl"]
    sqs.send_message(QueueUrl=url, MessageBody=warning_body(time.time()))
    consumer = EventsQueueConsumer(
        sqs, url, on_notice=fleet, on_reservation=fleet.on_reservation, wait_seconds=1, visibility_timeout=60
    )
    result = consumer.poll_once()
    assert [r.reservation_id for r in result.reservations] == [RESERVATION] and not result.failed
    request = jq.stop_request(started.id, 1)
    assert request is not None and (request.kind, request.action) == ("asg-terminate", CAPACITY_BLOCK_ACTION)
    assert request.payload["instance-id"] == X
    assert request.deadline == result.reservations[0].deadline
    # Handled: deleted from the queue, not left to come back.
    assert sqs.receive_message(QueueUrl=url, WaitTimeSeconds=0).get("Messages", []) == []


def test_a_warning_whose_instances_cannot_be_listed_is_left_for_redelivery(jq, asg, ec2, fresh_aws_account):
    hooks, _ = asg
    client, stub = ec2
    stub.add_client_error(
        "describe_instances",
        service_error_code="UnauthorizedOperation",
        service_message="You are not authorized to perform this operation.",
        http_status_code=403,
    )
    started = running_gang(jq, dead_for=LEASE + 5)
    fleet = handler(jq, hooks, reservation_instances=ec2_reservation_instances(client))
    sqs = boto3.client("sqs")
    url = sqs.create_queue(QueueName="events")["QueueUrl"]
    sqs.send_message(QueueUrl=url, MessageBody=warning_body(time.time()))
    consumer = EventsQueueConsumer(
        sqs, url, on_notice=fleet, on_reservation=fleet.on_reservation, wait_seconds=1, visibility_timeout=1
    )
    result = consumer.poll_once()
    assert len(result.failed) == 1 and "UnauthorizedOperation" in result.failed[0]
    assert jq.stop_request(started.id, 1) is None
