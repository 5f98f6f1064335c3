"""Fixtures for the queue tests: every backend the contract suite runs against, fresh per test."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import pytest

from gpucloud.queue.protocol import JobQueue
from gpucloud.queue.sqlite import SqliteQueue
from helpers.home import gpucloud_home  # noqa: F401  (autouse: an isolated GPUCLOUD_HOME)
from helpers.waiting import wait_for  # noqa: F401

from .aws_fixtures import aws_job_plane  # noqa: F401  (fixture)

# Every backend the contract suite runs against: the embedded file, and SQS + DynamoDB (moto).
BACKENDS = ["sqlite", "aws"]


class FakeClock:
    """The wall clock plus an offset a test moves forward: a lease runs out at ``advance``, with no
    sleep. Time still passes between calls, as it does for the real clock."""

    def __init__(self) -> None:
        self.offset = 0.0

    def __call__(self) -> float:
        return time.time() + self.offset

    def advance(self, seconds: float) -> None:
        self.offset += seconds


@pytest.fixture
def clock() -> FakeClock:
    """The clock every connection ``open_backend`` makes judges leases by (one for all of them)."""
    return FakeClock()


@pytest.fixture(params=BACKENDS)
def open_backend(request: pytest.FixtureRequest, tmp_path: Path, clock: FakeClock) -> Callable[[], JobQueue]:
    """A factory of connections to one fresh queue on ``clock`` (call it again for a second client)."""
    opened: list[JobQueue] = []
    plane = request.getfixturevalue("aws_job_plane") if request.param == "aws" else None

    def factory() -> JobQueue:
        if request.param == "sqlite":
            q: JobQueue = SqliteQueue(tmp_path / "contract.db", clock=clock)
        else:
            from gpucloud.queue.aws.backend import AwsQueue
            from gpucloud.queue.aws.uri import parse_aws_uri

            q = AwsQueue(parse_aws_uri(plane["uri"]), uri=plane["uri"], clock=clock)
        opened.append(q)
        return q

    yield factory
    for q in opened:
        q.close()


@pytest.fixture
def jq(open_backend: Callable[[], JobQueue]) -> JobQueue:
    return open_backend()
