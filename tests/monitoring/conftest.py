"""The real tools the monitoring files are checked with: promtool and amtool from Debian's
``prometheus`` and ``prometheus-alertmanager`` packages (``scripts/setup.sh --test`` installs them).
Where one is missing its tests skip with the reason, except in CI (``CI=true``), where they fail."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from gpucloud.spec import load_stack_file, stack_file_for

# /usr/bin first: the Debian packages the setup installs, the versions CI checks with.
SEARCH = "/usr/bin:" + os.environ.get("PATH", "")


def _tool(name: str) -> str:
    found = shutil.which(name, path=SEARCH)
    if found is None:
        reason = f"{name} is not installed (scripts/setup.sh --test installs Debian's prometheus/alertmanager)"
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI=true and {reason}")
        pytest.skip(reason)
    return found


@pytest.fixture(scope="session")
def promtool() -> str:
    return _tool("promtool")


@pytest.fixture(scope="session")
def amtool() -> str:
    return _tool("amtool")


def run_tool(argv: list[str], cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=120, check=False)


def assert_ok(result: subprocess.CompletedProcess[str]) -> None:
    assert result.returncode == 0, f"{result.args} exited {result.returncode}:\n{result.stdout}\n{result.stderr}"


def shipped_spec(stack: str = "p5-capacity-block", **monitoring: object):
    """A shipped stack's spec, with gpucloud:monitoring settings replaced by ``monitoring``."""
    spec = load_stack_file(stack_file_for(stack))
    if monitoring:
        spec = spec.model_copy(update={"monitoring": spec.monitoring.model_copy(update=monitoring)})
    return spec


TOPIC = "arn:aws:sns:us-east-1:123456789012:p5-capacity-block-alerts"
AMP_URL = "https://aps-workspaces.us-east-1.amazonaws.com/workspaces/ws-1234abcd-12ab-34cd-56ef-1234567890ab/api/v1/remote_write"
