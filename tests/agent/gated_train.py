"""The example training script (``examples/train_spot.py``), held before a step boundary until the
test opens a gate: attempt 1 of the fleet simulation (and of the lost-member test) then cannot finish
before its notice comes (or its node dies), however slowly a loaded machine starts the standby agent.

``GPUCLOUD_TEST_GATE``: the gate file; while it is absent, ``step_done(n)`` for n past
``GPUCLOUD_TEST_GATE_AFTER`` waits for it, and a rank that waits says so in ``<gate>.held`` (the
test's signal that training got that far). Without the variable this is the example unchanged. The
hold is outside the session's own work: the step is reported and saved exactly as in the example.
"""

from __future__ import annotations

import os
import runpy
import sys
import time
from pathlib import Path

from gpucloud.checkpoint import TrainingSession
from gpucloud.offline.demo import EXAMPLE

# This script, run in place of the example
GATED_EXAMPLE = Path(__file__).resolve()


def held_marker(gate: Path) -> Path:
    return gate.with_name(gate.name + ".held")


def hold_until_gate_opens(gate: Path, after_step: int) -> None:
    original = TrainingSession.step_done

    def step_done(self, step, *args, **kwargs):
        if step > after_step and not gate.exists():
            held_marker(gate).touch()
        while step > after_step and not gate.exists():
            time.sleep(0.05)  # polling the gate file: the test creates it, nothing else to wait on
        return original(self, step, *args, **kwargs)

    TrainingSession.step_done = step_done  # type: ignore[method-assign]


if __name__ == "__main__":
    if gate := os.environ.get("GPUCLOUD_TEST_GATE"):
        hold_until_gate_opens(Path(gate), int(os.environ.get("GPUCLOUD_TEST_GATE_AFTER", "0")))
    sys.argv[0] = str(EXAMPLE)
    runpy.run_path(str(EXAMPLE), run_name="__main__")
