"""What a drill leaves for the verdict, whichever way the interruption was injected (AWS FIS on a
cluster, ``drill/cluster.py``; an IMDS emulator on the local fleet, ``drill/local.py``)."""

from __future__ import annotations

import dataclasses
from typing import Any

from gpucloud.queue.gang import GangQueue


@dataclasses.dataclass
class DrillRun:
    queue: GangQueue  # the queue holding the drill job's record, attempts and timeline
    job_id: str
    target: str  # the interrupted node: an instance id on a cluster, the agent's name locally
    injected_at: float  # epoch seconds when the interruption was injected (experiment start / emulator notice)
    lead_seconds: float  # the notice's lead: time between the notice and the reclaim
    injector: str  # "fis" or "imds-emulator"
    experiment: dict[str, Any] | None = None  # FIS: id, template id, final state (None locally)
