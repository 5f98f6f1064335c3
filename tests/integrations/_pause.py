"""Test-only: hold training at one step until the supervisor's stop flag is there, so the notice
lands at a known step without any sleep (the test injects it once ``paused_file`` exists)."""

from __future__ import annotations

import os
import time
from pathlib import Path

from gpucloud import control, jobenv


def hold_until_flagged(step: int, pause_at: int, paused_file: str | None) -> None:
    if not paused_file or step != pause_at:
        return
    control_dir = os.environ.get(jobenv.CONTROL_DIR)
    if not control_dir or int(os.environ.get(jobenv.ATTEMPT, "0")) != 1:
        return
    Path(paused_file).write_text(str(step))
    deadline = time.monotonic() + 120
    while not control.exists(control_dir, control.PREEMPT):
        if time.monotonic() > deadline:
            raise SystemExit("no stop flag within 120 s")
        time.sleep(0.01)  # polling a file the supervisor writes
