"""Lint, format, types and import layers are part of the test command: ruff, mypy and import-linter,
configured in pyproject.toml."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent  # the tools are installed beside this interpreter by the test extra


@pytest.mark.parametrize(
    "command",
    [
        pytest.param(["ruff", "check", "--no-cache", "."], id="ruff-lint"),
        pytest.param(["ruff", "format", "--check", "--no-cache", "."], id="ruff-format"),
        pytest.param(["mypy"], id="mypy"),
        # the layers and the no-cycles rule of docs/architecture.md ([tool.importlinter] in pyproject.toml)
        pytest.param(["lint-imports", "--no-cache"], id="import-layers"),
    ],
)
def test_the_tree_passes(command: list[str]) -> None:
    run = subprocess.run([str(BIN / command[0]), *command[1:]], cwd=REPO, capture_output=True, text=True, check=False)
    assert run.returncode == 0, f"{' '.join(command)} found problems:\n{run.stdout}{run.stderr}"
