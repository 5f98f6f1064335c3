"""One log line per kind of problem per interval, however often the problem repeats.

A watcher polls every second; a metadata service that answers 5xx to every token request, or a
list of 200 000 bad scheduled events, must not write a line each time. ``RateLimitedLog`` keys each
line by what went wrong (``key``), writes the first one at once, then at most one per ``interval``
seconds for that key, saying how many like it were held back in between.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

DEFAULT_INTERVAL = 60.0  # seconds between two lines with the same key
MAX_KEYS = 1024  # a key per kind of problem, not per value: a flood of distinct keys is cut off here


class RateLimitedLog:
    def __init__(
        self, logger: logging.Logger, interval: float = DEFAULT_INTERVAL, clock: Callable[[], float] = time.monotonic
    ) -> None:
        if interval <= 0:
            raise ValueError(f"interval must be positive seconds, got {interval}")
        self._log = logger
        self.interval = float(interval)
        self._clock = clock
        self._lock = threading.Lock()
        self._last: dict[str, float] = {}  # key -> when its last line was written
        self._held: dict[str, int] = {}  # key -> lines held back since then

    def log(self, level: int, key: str, message: str, *args: object) -> bool:
        """Write ``message % args`` unless a line with ``key`` went out less than ``interval`` ago;
        True if it was written."""
        return self._emit(level, key, message, args, stacklevel=3)

    def warning(self, key: str, message: str, *args: object) -> bool:
        return self._emit(logging.WARNING, key, message, args, stacklevel=3)

    def _emit(self, level: int, key: str, message: str, args: tuple[object, ...], stacklevel: int) -> bool:
        with self._lock:
            if key not in self._last and len(self._last) >= MAX_KEYS:
                key = "(other)"  # keep the table small whatever the keys are
            now = self._clock()
            last = self._last.get(key)
            if last is not None and now - last < self.interval:
                self._held[key] = self._held.get(key, 0) + 1
                return False
            held = self._held.pop(key, 0)
            self._last[key] = now
        if held:
            message += f" (and {held} more like this in the last {self.interval:g}s)"
        self._log.log(level, message, *args, stacklevel=stacklevel)  # the record names our caller
        return True

    def forget(self, key: str) -> None:
        """The condition behind ``key`` ended: its next occurrence is written at once."""
        with self._lock:
            self._last.pop(key, None)
            self._held.pop(key, None)
