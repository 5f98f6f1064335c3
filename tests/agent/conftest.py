"""Fixtures for the node-agent tests: an isolated GPUCLOUD_HOME, a queue, agents as processes."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Callable

import pytest

# The real CLI (UserError handling, exit codes), in a separate process per "node".
CLI = [sys.executable, "-m", "gpucloud"]


@pytest.fixture(autouse=True)
def gpucloud_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    home = tmp_path / "home"
    monkeypatch.setenv("GPUCLOUD_HOME", str(home))
    for name in ("GPUCLOUD_QUEUE", "AWS_EC2_METADATA_SERVICE_ENDPOINT", "GPUCLOUD_REGION", "GPUCLOUD_JOB_TABLE",
                 "GPUCLOUD_JOB_QUEUE_URL"):
        monkeypatch.delenv(name, raising=False)
    return home


@pytest.fixture
def env(gpucloud_home: Path) -> dict[str, str]:
    return dict(os.environ)


def wait_for(predicate: Callable[[], object], timeout: float = 30.0, what: str = "condition") -> object:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)  # polling the queue, which the agents write
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")
