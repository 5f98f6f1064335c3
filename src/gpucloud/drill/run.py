"""What a drill leaves for the verdict, whichever way the interruption was injected (AWS FIS on a
cluster, ``drill/cluster.py``; an IMDS emulator on the local fleet, ``offline/local_fleet.py``), and
what both ways share: the check of the requested steps and the error that ends a drill without a verdict."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from gpucloud.errors import UserError
from gpucloud.queue.gang import GangQueue

# The training script the demo and the drills run (a source checkout's examples/)
EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "train_spot.py"


@dataclasses.dataclass
class DrillRun:
    queue: GangQueue  # the queue holding the drill job's record, attempts and timeline
    job_id: str
    target: str  # the interrupted node: an instance id on a cluster, the agent's name locally
    injected_at: float  # epoch seconds when the interruption was injected (experiment start / emulator notice)
    lead_seconds: float  # the notice's lead: time between the notice and the reclaim
    injector: str  # "fis" or "imds-emulator"
    experiment: dict[str, Any] | None = None  # FIS: id, template id, final state (None locally)


class DrillAborted(UserError):
    """The drill could not run to its end (an agent died, a wait timed out): no verdict. Exit 1."""

    exit_code = 1


def check_steps(steps: int, notice_at_step: int) -> None:
    """A run of ``steps`` with the notice after ``notice_at_step`` (the demo, the drills): the notice
    must come while the job still trains, or there is nothing to judge."""
    if steps < 2:
        raise UserError(f"--steps must be at least 2, got {steps}")
    if not 1 <= notice_at_step < steps:
        raise UserError(f"--notice-at-step must be between 1 and --steps - 1 ({steps - 1}), got {notice_at_step}")
