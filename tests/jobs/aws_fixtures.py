"""A moto server (server mode, 127.0.0.1) holding the job plane exactly as the stack declares it:
the job queue with its dead-letter queue and redrive policy, and the job table with its index.

Settings come from the stack's own constants (``infra/jobplane.py``, ``jobs/aws_schema.py``), so a
change to the stack is a change to what these tests run against.
"""

from __future__ import annotations

import contextlib
import functools
import json
import socket
import threading
import urllib.request
from collections.abc import Iterator

import pytest

REGION = "us-east-1"
TABLE = "gpucloud-test-jobs"
FAKE_AWS = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_SESSION_TOKEN": "testing",
    "AWS_DEFAULT_REGION": REGION,
}


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


# moto 5.2.5 serves requests on concurrent threads, and its TransactWriteItems is not atomic
# against them: it snapshots whole tables, applies the items one by one, and on a cancellation
# restores the snapshot, which erases any write another request committed in between (seen here as
# two racing requeues both "applied"). Real DynamoDB transactions are serializable. One lock
# around moto's item operations gives the emulator that property; our code is not touched.
_SERIALIZED = ("put_item", "get_item", "query", "scan", "update_item", "delete_item", "transact_write_items")


@contextlib.contextmanager
def _serialized_dynamodb() -> Iterator[None]:
    from moto.dynamodb.models import DynamoDBBackend

    lock = threading.RLock()
    originals = {name: getattr(DynamoDBBackend, name) for name in _SERIALIZED}

    def locked(method):
        @functools.wraps(method)
        def call(*args, **kwargs):
            with lock:
                return method(*args, **kwargs)

        return call

    for name, method in originals.items():
        setattr(DynamoDBBackend, name, locked(method))
    try:
        yield
    finally:
        for name, method in originals.items():
            setattr(DynamoDBBackend, name, method)


@pytest.fixture(scope="session")
def moto_server() -> Iterator[str]:
    """One moto server for the session (it takes a second to start); tests reset its state."""
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=_free_port(), verbose=False)
    with _serialized_dynamodb():
        server.start()
        host, port = server.get_host_and_port()
        try:
            yield f"http://{host}:{port}"
        finally:
            server.stop()


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
    from gpucloud.jobs.aws_schema import TTL_ATTRIBUTE, create_table_request

    # moto keeps its backends in process-global state: every test starts from an empty account.
    urllib.request.urlopen(urllib.request.Request(f"{endpoint}/moto-api/reset", method="POST")).read()
    sqs = boto3.client("sqs", region_name=REGION, endpoint_url=endpoint)
    dlq_url = sqs.create_queue(QueueName="jobs-dlq", Attributes={
        "MessageRetentionPeriod": str(DLQ_RETENTION_SECONDS), "SqsManagedSseEnabled": "true",
    })["QueueUrl"]
    dlq_arn = sqs.get_queue_attributes(QueueUrl=dlq_url, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
    queue_url = sqs.create_queue(QueueName="jobs", Attributes={
        "VisibilityTimeout": str(JOB_QUEUE_VISIBILITY_SECONDS),
        "MessageRetentionPeriod": str(JOB_QUEUE_RETENTION_SECONDS),
        "ReceiveMessageWaitTimeSeconds": str(QUEUE_LONG_POLL_SECONDS),
        "SqsManagedSseEnabled": "true",
        "RedrivePolicy": json.dumps({"deadLetterTargetArn": dlq_arn, "maxReceiveCount": JOB_QUEUE_MAX_RECEIVES}),
    })["QueueUrl"]
    ddb = boto3.client("dynamodb", region_name=REGION, endpoint_url=endpoint)
    ddb.create_table(**create_table_request(TABLE))
    ddb.update_time_to_live(TableName=TABLE, TimeToLiveSpecification={"Enabled": True, "AttributeName": TTL_ATTRIBUTE})
    return {"queue_url": queue_url, "dlq_url": dlq_url, "table": TABLE}


@pytest.fixture
def aws_job_plane(moto_server: str, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """The job plane on a reset moto server, reached through AWS_ENDPOINT_URL (as boto3 on a laptop
    pointed at an emulator would); ``uri`` is the queue URI of it."""
    for name, value in {**FAKE_AWS, "AWS_ENDPOINT_URL": moto_server}.items():
        monkeypatch.setenv(name, value)
    for name in ("AWS_PROFILE", "AWS_CONFIG_FILE", "AWS_SHARED_CREDENTIALS_FILE"):
        monkeypatch.delenv(name, raising=False)
    plane = create_job_plane(moto_server)
    plane["endpoint"] = moto_server
    plane["uri"] = f"aws://{REGION}?table={plane['table']}&queue={plane['queue_url']}"
    return plane
