"""Calls the agent makes that must never stop it: the backlog metric (CloudWatch PutMetricData),
the node record (``gpucloud nodes``), lifting scale-in protection, the idle scale-in check.

A node whose agent exits on such a failure is worse off than one that skips a datapoint: systemd
restarts the agent in a loop, and a busy node stops running its job. So a failure is logged once
(a warning naming the call and the error), the call is skipped, and the caller tries again at its
next round; the next success is logged once too. Repeats in between go to debug, so a node cut off
from one endpoint (e.g. ``egress: endpoints`` without ``monitoring``) does not flood its journal.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import TypeVar

from gpucloud.errors import error_line

T = TypeVar("T")

log = logging.getLogger("gpucloud.agent")


class NonCritical:
    """Runs non-critical calls; remembers which are failing, so each outage is logged once."""

    def __init__(self) -> None:
        self._failing: set[str] = set()
        self._lock = threading.Lock()
        self.failures = 0  # calls that failed (for tests and the status line)

    def call(
        self,
        what: str,
        fn: Callable[[], T],
        *,
        default: T,
        critical: tuple[type[BaseException], ...] = (),
    ) -> T:
        """``fn()``, or ``default`` when it raised anything but ``critical``."""
        try:
            result = fn()
        except critical:
            raise
        except Exception as err:  # noqa: BLE001 - the point: any failure here is survivable
            with self._lock:
                first = what not in self._failing
                self._failing.add(what)
                self.failures += 1
            if first:
                log.warning(
                    "%s failed (%s: %s); carrying on, retried at the next round (logged again once it works)",
                    what,
                    type(err).__name__,
                    error_line(err),
                )
            else:
                log.debug("%s failed again: %s", what, error_line(err))
            return default
        with self._lock:
            recovered = what in self._failing
            self._failing.discard(what)
        if recovered:
            log.warning("%s works again", what)
        return result

    def failing(self) -> frozenset[str]:
        with self._lock:
            return frozenset(self._failing)
