"""Fixtures for the job-system tests: an isolated GPUCLOUD_HOME, queue backends, a notice inbox."""

from __future__ import annotations

import queue as stdlib_queue
import time
from pathlib import Path
from typing import Callable

import pytest

from gpucloud.jobs.queue import JobQueue
from gpucloud.jobs.sqlite_queue import SqliteQueue
from gpucloud.signals.events import Notice, event_id_for

from .aws_fixtures import aws_job_plane  # noqa: F401  (fixture)

# Every backend the contract suite runs against: the embedded file, and SQS + DynamoDB (moto).
BACKENDS = ["sqlite", "aws"]


@pytest.fixture(autouse=True)
def gpucloud_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    home = tmp_path / "home"
    monkeypatch.setenv("GPUCLOUD_HOME", str(home))
    monkeypatch.delenv("GPUCLOUD_QUEUE", raising=False)
    monkeypatch.delenv("AWS_EC2_METADATA_SERVICE_ENDPOINT", raising=False)
    return home


@pytest.fixture(params=BACKENDS)
def open_backend(request: pytest.FixtureRequest, tmp_path: Path) -> Callable[[], JobQueue]:
    """A factory of connections to one fresh queue (call it again for a second client)."""
    opened: list[JobQueue] = []
    plane = request.getfixturevalue("aws_job_plane") if request.param == "aws" else None

    def factory() -> JobQueue:
        if request.param == "sqlite":
            q: JobQueue = SqliteQueue(tmp_path / "contract.db")
        else:
            from gpucloud.jobs.locations import open_queue

            q = open_queue(plane["uri"])
        opened.append(q)
        return q

    yield factory
    for q in opened:
        q.close()


@pytest.fixture
def jq(open_backend: Callable[[], JobQueue]) -> JobQueue:
    return open_backend()


class Inbox:
    """A notice source the test feeds by hand (the supervisor's side of SignalHub.get)."""

    def __init__(self) -> None:
        self._q: stdlib_queue.Queue[Notice] = stdlib_queue.Queue()

    def put(self, notice: Notice) -> None:
        self._q.put(notice)

    def get(self, timeout: float) -> Notice | None:
        try:
            return self._q.get(timeout=timeout)
        except stdlib_queue.Empty:
            return None


def spot_notice(lead: float = 60.0, *, payload: dict | None = None, kind: str = "spot-interruption") -> Notice:
    now = time.time()
    body = payload or {"action": "terminate", "time": now + lead}
    return Notice(
        kind=kind, source="test", deadline=None if kind == "rebalance" else now + lead, received_at=now,
        event_id=event_id_for(kind, body), action="terminate", payload=body,
    )


def wait_for(predicate: Callable[[], object], timeout: float = 20.0, what: str = "condition") -> object:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.02)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")
