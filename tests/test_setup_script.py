"""``scripts/setup.sh`` says what it is doing, one line per step, before each step (pip is quiet for
minutes otherwise). Run on a copy of the script with stand-ins for python3 and the venv's python, so
nothing is installed: each stand-in writes a marker into the same stream as the script's lines."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

# The venv's python: pip "installs", -c prints a version. $SETUP_LOG is the script's own stderr file.
VENV_PYTHON = """#!/bin/bash
if [[ "$1 $2" == "-m pip" ]]; then echo "<pip ran>" >>"$SETUP_LOG"; exit 0; fi
if [[ "$1" == "-c" ]]; then echo "0.0.test"; exit 0; fi
exit 3
"""
# python3 -m venv .venv: makes the venv's python above
PYTHON3 = """#!/bin/bash
echo "<venv made>" >>"$SETUP_LOG"
mkdir -p .venv/bin && cp "$(dirname "$0")/venv-python" .venv/bin/python && chmod +x .venv/bin/python
"""


def _stand_in(path: Path, text: str) -> None:
    path.write_text(text)
    path.chmod(0o755)


def test_setup_announces_each_step_before_it_runs(tmp_path: Path) -> None:
    checkout = tmp_path / "checkout"
    (checkout / "scripts").mkdir(parents=True)
    shutil.copy(REPO / "scripts" / "setup.sh", checkout / "scripts" / "setup.sh")
    tools = tmp_path / "bin"
    tools.mkdir()
    _stand_in(tools / "python3", PYTHON3)
    _stand_in(tools / "venv-python", VENV_PYTHON)
    log = tmp_path / "stderr.log"
    env = dict(os.environ, PATH=f"{tools}{os.pathsep}{os.environ['PATH']}", SETUP_LOG=str(log))
    with open(log, "a") as stderr:
        done = subprocess.run(
            ["bash", str(checkout / "scripts" / "setup.sh")], env=env, stderr=stderr, stdout=subprocess.PIPE, timeout=60
        )
    lines = log.read_text().splitlines()
    assert done.returncode == 0, lines
    assert [line.split(" ", 2)[:2] for line in lines] == [
        ["setup:", "creating"],
        ["<venv", "made>"],
        ["setup:", "installing"],
        ["<pip", "ran>"],
        ["setup:", "gpucloud"],
    ], lines
    assert "torch 2.13.0" in lines[2] and "train,deploy,report" in lines[2]
