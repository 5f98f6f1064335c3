"""Fixtures for the fleet tests: a Stubber-answered autoscaling client, a moto SQS server."""

from __future__ import annotations

import os
import socket
import urllib.request
from collections.abc import Iterator

import boto3
import pytest
from botocore.config import Config
from botocore.stub import Stubber

from gpucloud.fleet.asg import AutoScaling, ContentionRetry

_FAKE_AWS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"}


class StubbedAsg:
    """A real boto3 autoscaling client whose answers come from botocore's Stubber, which validates
    both our requests and the canned responses against the service model."""

    def __init__(self, client, stub: Stubber) -> None:
        self.stub = stub
        self.sleeps: list[float] = []
        self.api = AutoScaling(client, retry=ContentionRetry(attempts=3, first_delay=0.25), sleep=self.sleeps.append)

    def ok(self, operation: str, params: dict, response: dict | None = None) -> None:
        self.stub.add_response(operation, response or {}, params)

    def fails(self, operation: str, params: dict, code: str, message: str, status: int = 400) -> None:
        self.stub.add_client_error(operation, service_error_code=code, service_message=message,
                                   http_status_code=status, expected_params=params)


@pytest.fixture
def asg(monkeypatch) -> Iterator[StubbedAsg]:
    for key, value in _FAKE_AWS.items():
        monkeypatch.setenv(key, value)
    client = boto3.client("autoscaling", region_name="us-east-1")
    with Stubber(client) as stub:
        stubbed = StubbedAsg(client, stub)
        yield stubbed
        stub.assert_no_pending_responses()


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="session")
def moto_endpoint() -> Iterator[str]:
    """One moto server for the session (started once: it takes a second); tests reset its state."""
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=_free_port(), verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    try:
        yield f"http://{host}:{port}"
    finally:
        server.stop()


@pytest.fixture
def sqs(moto_endpoint, monkeypatch):
    """An SQS client on a freshly reset moto server, reached through AWS_ENDPOINT_URL."""
    for key, value in {**_FAKE_AWS, "AWS_ENDPOINT_URL": moto_endpoint}.items():
        monkeypatch.setenv(key, value)
    urllib.request.urlopen(urllib.request.Request(f"{moto_endpoint}/moto-api/reset", method="POST")).read()
    assert os.environ["AWS_ENDPOINT_URL"] == moto_endpoint
    return boto3.client("sqs", config=Config(retries={"max_attempts": 1}))
