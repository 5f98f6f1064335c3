"""An isolated ``GPUCLOUD_HOME``: the fixture the job and queue tests make autouse in their conftest."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(autouse=True)
def gpucloud_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty home under ``tmp_path``, with no queue or metadata endpoint inherited from the shell."""
    home = tmp_path / "home"
    monkeypatch.setenv("GPUCLOUD_HOME", str(home))
    monkeypatch.delenv("GPUCLOUD_QUEUE", raising=False)
    monkeypatch.delenv("AWS_EC2_METADATA_SERVICE_ENDPOINT", raising=False)
    return home
