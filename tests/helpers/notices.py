"""Spot notices fed by hand: a notice source for the supervisor and agent tests, and the notices it carries."""

from __future__ import annotations

import queue as stdlib_queue
import time

from gpucloud.signals.events import Notice, event_id_for


class Inbox:
    """A notice source the test feeds by hand (the supervisor's side of SignalHub.get)."""

    def __init__(self) -> None:
        self._q: stdlib_queue.Queue[Notice] = stdlib_queue.Queue()

    def put(self, notice: Notice) -> None:
        self._q.put(notice)

    def get(self, timeout: float) -> Notice | None:
        try:
            return self._q.get(timeout=timeout)
        except stdlib_queue.Empty:
            return None


def spot_notice(lead: float = 60.0, *, payload: dict | None = None, kind: str = "spot-interruption") -> Notice:
    now = time.time()
    body = payload or {"action": "terminate", "time": now + lead}
    return Notice(
        kind=kind,
        source="test",
        deadline=None if kind == "rebalance" else now + lead,
        received_at=now,
        event_id=event_id_for(kind, body),
        action="terminate",
        payload=body,
    )
