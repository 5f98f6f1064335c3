"""Fixtures for the node-agent tests: an isolated GPUCLOUD_HOME, agents as processes, a Stubber-answered
autoscaling client, SQS on the session's moto server."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import boto3
import pytest
from botocore.config import Config
from botocore.stub import Stubber

from gpucloud.agent.asg import AutoScaling, ContentionRetry
from node_env import NODE_ENV

# The real CLI (UserError handling, exit codes), in a separate process per "node".
CLI = [sys.executable, "-m", "gpucloud"]


@pytest.fixture(autouse=True)
def gpucloud_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    home = tmp_path / "home"
    monkeypatch.setenv("GPUCLOUD_HOME", str(home))
    for name in NODE_ENV:
        monkeypatch.delenv(name, raising=False)
    return home


@pytest.fixture
def env(gpucloud_home: Path) -> dict[str, str]:
    return dict(os.environ)


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
        self.stub.add_client_error(
            operation, service_error_code=code, service_message=message, http_status_code=status, expected_params=params
        )


@pytest.fixture
def asg(monkeypatch) -> Iterator[StubbedAsg]:
    for key, value in _FAKE_AWS.items():
        monkeypatch.setenv(key, value)
    client = boto3.client("autoscaling", region_name="us-east-1")
    with Stubber(client) as stub:
        stubbed = StubbedAsg(client, stub)
        yield stubbed
        stub.assert_no_pending_responses()


@pytest.fixture
def sqs(fresh_aws_account):
    """An SQS client on a freshly reset moto server, reached through AWS_ENDPOINT_URL."""
    return boto3.client("sqs", config=Config(retries={"max_attempts": 1}))
