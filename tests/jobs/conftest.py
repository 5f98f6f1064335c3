"""Fixtures for the job tests: an isolated GPUCLOUD_HOME, a notice inbox, waiting on a condition."""

from __future__ import annotations

import queue as stdlib_queue
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from gpucloud.signals.events import Notice, event_id_for


@pytest.fixture(autouse=True)
def gpucloud_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    home = tmp_path / "home"
    monkeypatch.setenv("GPUCLOUD_HOME", str(home))
    monkeypatch.delenv("GPUCLOUD_QUEUE", raising=False)
    monkeypatch.delenv("AWS_EC2_METADATA_SERVICE_ENDPOINT", raising=False)
    return home


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
        kind=kind,
        source="test",
        deadline=None if kind == "rebalance" else now + lead,
        received_at=now,
        event_id=event_id_for(kind, body),
        action="terminate",
        payload=body,
    )


def wait_for(predicate: Callable[[], object], timeout: float = 20.0, what: str = "condition") -> object:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.02)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")
