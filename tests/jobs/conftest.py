"""Fixtures for the job tests: an isolated GPUCLOUD_HOME."""

from __future__ import annotations

from pathlib import Path

import pytest

# The queue tests still import these from here; the shared copies live in tests/helpers.
from helpers.notices import Inbox, spot_notice  # noqa: F401
from helpers.waiting import wait_for  # noqa: F401


@pytest.fixture(autouse=True)
def gpucloud_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    home = tmp_path / "home"
    monkeypatch.setenv("GPUCLOUD_HOME", str(home))
    monkeypatch.delenv("GPUCLOUD_QUEUE", raising=False)
    monkeypatch.delenv("AWS_EC2_METADATA_SERVICE_ENDPOINT", raising=False)
    return home
