"""Test helpers: a hand-moved clock."""

from __future__ import annotations

import time


class FakeClock:
    """A clock tests move by hand; shared by the emulator and the poller so 'at' times line up.
    As the ``sleep`` of code under test, it moves itself: no real waiting, and a timeout is reached
    deterministically (``slept`` lists each wait)."""

    def __init__(self, start: float | None = None) -> None:
        self.now = time.time() if start is None else start
        self.slept: list[float] = []

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.advance(seconds)
