"""End-to-end fixtures: an isolated GPUCLOUD_HOME shared with the gpucloud subprocesses."""

from __future__ import annotations

import os
from pathlib import Path

import pytest


@pytest.fixture
def e2e_env(tmp_path: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["GPUCLOUD_HOME"] = str(tmp_path / "home")
    env.pop("GPUCLOUD_QUEUE", None)
    env.pop("AWS_EC2_METADATA_SERVICE_ENDPOINT", None)
    return env
