"""The session's moto server (``tests/conftest.py``) holding the job plane exactly as the stack declares it:
the job queue with its dead-letter queue and redrive policy, and the job table with its index.

Settings come from the stack's own constants (``infra/jobplane.py``, ``queue/aws/schema.py``), so a
change to the stack is a change to what these tests run against.
"""

from __future__ import annotations

import json

import pytest

REGION = "us-east-1"
TABLE = "gpucloud-test-jobs"


def create_job_plane(endpoint: str) -> dict[str, str]:
    """A fresh account with the stack's job queue, dead-letter queue and job table."""
    import boto3

    from gpucloud.infra.jobplane import (
        DLQ_RETENTION_SECONDS,
        JOB_QUEUE_MAX_RECEIVES,
        JOB_QUEUE_RETENTION_SECONDS,
        JOB_QUEUE_VISIBILITY_SECONDS,
        QUEUE_LONG_POLL_SECONDS,
    )
    from gpucloud.queue.aws.schema import TTL_ATTRIBUTE, create_table_request

    sqs = boto3.client("sqs", region_name=REGION, endpoint_url=endpoint)
    dlq_url = sqs.create_queue(
        QueueName="jobs-dlq",
        Attributes={
            "MessageRetentionPeriod": str(DLQ_RETENTION_SECONDS),
            "SqsManagedSseEnabled": "true",
        },
    )["QueueUrl"]
    dlq_arn = sqs.get_queue_attributes(QueueUrl=dlq_url, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
    queue_url = sqs.create_queue(
        QueueName="jobs",
        Attributes={
            "VisibilityTimeout": str(JOB_QUEUE_VISIBILITY_SECONDS),
            "MessageRetentionPeriod": str(JOB_QUEUE_RETENTION_SECONDS),
            "ReceiveMessageWaitTimeSeconds": str(QUEUE_LONG_POLL_SECONDS),
            "SqsManagedSseEnabled": "true",
            "RedrivePolicy": json.dumps({"deadLetterTargetArn": dlq_arn, "maxReceiveCount": JOB_QUEUE_MAX_RECEIVES}),
        },
    )["QueueUrl"]
    ddb = boto3.client("dynamodb", region_name=REGION, endpoint_url=endpoint)
    ddb.create_table(**create_table_request(TABLE))
    ddb.update_time_to_live(TableName=TABLE, TimeToLiveSpecification={"Enabled": True, "AttributeName": TTL_ATTRIBUTE})
    return {"queue_url": queue_url, "dlq_url": dlq_url, "table": TABLE}


@pytest.fixture
def aws_job_plane(fresh_aws_account: str) -> dict[str, str]:
    """The job plane on a reset moto server, reached through AWS_ENDPOINT_URL (as boto3 on a laptop
    pointed at an emulator would); ``uri`` is the queue URI of it."""
    plane = create_job_plane(fresh_aws_account)
    plane["endpoint"] = fresh_aws_account
    plane["uri"] = f"aws://{REGION}?table={plane['table']}&queue={plane['queue_url']}"
    return plane


def visible_messages(sqs, url: str, wait: int = 0) -> list[dict]:
    """Receive (and so hide for 30 s) whatever is visible now, waiting up to ``wait`` seconds."""
    return sqs.receive_message(
        QueueUrl=url,
        MaxNumberOfMessages=10,
        WaitTimeSeconds=wait,
        VisibilityTimeout=30,
        MessageSystemAttributeNames=["All"],
    ).get("Messages", [])


def message_counts(sqs, url: str, *, delayed: bool = False) -> tuple[int, ...]:
    """(visible, in flight) messages, and delayed ones when asked."""
    names = ["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"]
    names += ["ApproximateNumberOfMessagesDelayed"] if delayed else []
    attrs = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=names)["Attributes"]
    return tuple(int(attrs[name]) for name in names)
