"""The one event type every interruption source produces, and the handler consumes.

Sources (IMDS poller, OS signals, queue-mode EventBridge events) turn what they observe into a
``Notice``; the supervisor acts on Notices only. ``deadline`` is computed from the notice itself
(never an assumed 120 s). ``event_id`` identifies the payload, so the same notice seen on many
polls is acted on once.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import time
from typing import Any, Literal

NoticeKind = Literal[
    "spot-interruption",  # spot/instance-action or the EventBridge warning: stop by deadline
    "rebalance",  # rebalance recommendation: checkpoint early, keep running
    "asg-terminate",  # target-lifecycle-state Terminated / lifecycle action: stop by deadline
    "scheduled-maintenance",  # events/maintenance/scheduled (active): stop before NotBefore
    "sigterm",  # SIGTERM/SIGINT to the supervisor: stop by now + grace
]

STOP_KINDS = frozenset({"spot-interruption", "asg-terminate", "scheduled-maintenance", "sigterm"})


@dataclasses.dataclass(frozen=True)
class Notice:
    kind: NoticeKind
    source: str  # "imds", "signal", "queue", ...
    deadline: float | None  # epoch seconds by which the node may be gone; None for rebalance
    received_at: float  # epoch seconds when we observed it
    event_id: str  # stable hash of the payload (dedup key)
    action: str | None = None  # terminate | stop | hibernate | Terminated | system-reboot ...
    payload: dict[str, Any] = dataclasses.field(default_factory=dict)

    @property
    def is_stop(self) -> bool:
        return self.kind in STOP_KINDS

    def seconds_left(self, now: float | None = None) -> float | None:
        if self.deadline is None:
            return None
        return self.deadline - (time.time() if now is None else now)

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def event_id_for(kind: str, payload: Any) -> str:
    """Dedup key: the kind plus a sha256 of the canonical payload (as NTH does for spot ITNs)."""
    blob = json.dumps(payload, sort_keys=True, separators=(",", ":"), default=str)
    return f"{kind}-{hashlib.sha256(blob.encode()).hexdigest()[:16]}"
