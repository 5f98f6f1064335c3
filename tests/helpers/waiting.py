"""Waiting on a condition with a deadline: what the tests do instead of sleeping a fixed time."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable
from typing import Any


def wait_for(
    predicate: Callable[[], Any],
    timeout: float = 20.0,
    what: str = "condition",
    *,
    every: float = 0.02,
    proc: subprocess.Popen | None = None,
) -> Any:
    """Poll ``predicate`` every ``every`` seconds until it returns something true, and return that.

    Fails after ``timeout`` seconds naming ``what``; with ``proc``, fails at once (with its output)
    if that process exits first, since the condition can then no longer come true.
    """
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if proc is not None and proc.poll() is not None:
            out, err = proc.communicate()
            raise AssertionError(f"{what}: the process exited {proc.returncode}: {str(out)[-2000:]} {str(err)[-3000:]}")
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(every)  # polling state another thread or process writes: nothing to block on
