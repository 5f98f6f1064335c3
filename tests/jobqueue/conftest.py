"""Fixtures for the queue tests: every backend the contract suite runs against, fresh per test."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from gpucloud.queue.protocol import JobQueue
from gpucloud.queue.sqlite import SqliteQueue
from jobs.conftest import gpucloud_home, wait_for  # noqa: F401  (an isolated GPUCLOUD_HOME; shared helper)

from .aws_fixtures import aws_job_plane  # noqa: F401  (fixture)

# Every backend the contract suite runs against: the embedded file, and SQS + DynamoDB (moto).
BACKENDS = ["sqlite", "aws"]


@pytest.fixture(params=BACKENDS)
def open_backend(request: pytest.FixtureRequest, tmp_path: Path) -> Callable[[], JobQueue]:
    """A factory of connections to one fresh queue (call it again for a second client)."""
    opened: list[JobQueue] = []
    plane = request.getfixturevalue("aws_job_plane") if request.param == "aws" else None

    def factory() -> JobQueue:
        if request.param == "sqlite":
            q: JobQueue = SqliteQueue(tmp_path / "contract.db")
        else:
            from gpucloud.queue.connect import open_queue

            q = open_queue(plane["uri"])
        opened.append(q)
        return q

    yield factory
    for q in opened:
        q.close()


@pytest.fixture
def jq(open_backend: Callable[[], JobQueue]) -> JobQueue:
    return open_backend()
