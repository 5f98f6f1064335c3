"""The drill on a deployed cluster: AWS FIS interrupts one spot node of the drill's own job.

Entry point (``commands/drill.py`` calls it; the verdict judges what it returns)::

    run_on_cluster(
        *,
        stack: str,                       # the stack's name (messages only)
        outputs: Mapping[str, Any],       # infra.automation.open_stack(stack).outputs()
        region: str,                      # the stack's region (spec.region)
        job: DrillJob,                    # what to run: the shipped example, or the user's command
        progress: Callable[[str], None],  # one line per step of the drill (the CLI prints to stderr)
        clients: ClientFactory | None = None,  # service name -> boto3 client; None: boto3 in ``region``
        timeout_s: float = 1800.0,        # the whole drill; past it: DrillAborted (exit 1)
        poll_interval_s: float = 5.0,     # between reads of the queue and GetExperiment
    ) -> DrillRun                         # injector "fis"; its queue is open: the caller closes it

Work in progress: the body lands in the next commits.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any

ClientFactory = Callable[[str], Any]  # "fis" | "ec2" | "cloudwatch" -> a boto3 client


@dataclasses.dataclass(frozen=True)
class DrillJob:
    """The drill's job: a 2-node gang on the stack's spot group.

    Default: ``examples/train_spot.py`` shipped as a ``submit --workdir`` snapshot to the stack's
    checkpoint bucket. ``command`` (with ``workdir`` to ship, or None to run in the node's directory)
    runs the user's own training instead; it must checkpoint through ``gpucloud.checkpoint``."""

    steps: int = 40
    notice_at_step: int = 2
    step_seconds: float = 0.5
    group: str | None = None  # the spot node group whose agents run it (None: the stack's first group)
    command: tuple[str, ...] | None = None
    workdir: Path | None = None
    nodes: int = 2
