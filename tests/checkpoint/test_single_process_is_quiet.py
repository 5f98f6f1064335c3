"""A single-process job (no torchrun) saves and loads without a torch warning per checkpoint."""

from __future__ import annotations

import subprocess
import sys

SCRIPT = """
import pathlib, sys, tempfile, torch
from gpucloud.checkpoint import dcp_io
d = pathlib.Path(tempfile.mkdtemp())
dcp_io.save({"w": torch.arange(4.0)}, d)
state = {"w": torch.zeros(4)}
dcp_io.load(state, d)
assert state["w"].tolist() == [0.0, 1.0, 2.0, 3.0]
"""


def test_no_distributed_warning_reaches_the_users_log():
    done = subprocess.run([sys.executable, "-W", "default", "-c", SCRIPT], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "torch.distributed is disabled" not in done.stderr
