"""When to save: pure decisions, no I/O, no clocks (the caller passes ``now``).

Three triggers, any of which fires a periodic save:

* ``every_steps``: at every N-th step.
* ``every_seconds``: when that much wall time has passed since the last save.
* ``auto``: the Young/Daly optimum ``sqrt(2 * C * MTBI)``, where ``C`` is the measured cost of a
  checkpoint (the time training was stalled by the last save) and ``MTBI`` the configured mean time
  between interruptions. It is never shorter than the last save's background persist time, so
  saves do not queue up behind each other. Before any save has been measured, the first save
  happens at the first step boundary: that measures ``C`` and proves the store works early.
"""

from __future__ import annotations

import dataclasses
import math

from gpucloud.errors import UserError


@dataclasses.dataclass(frozen=True)
class SavePolicy:
    every_steps: int | None = None
    every_seconds: float | None = None
    auto: bool = False
    mtbi_seconds: float = 6 * 3600.0

    def __post_init__(self) -> None:
        if self.every_steps is not None and (isinstance(self.every_steps, bool) or self.every_steps < 1):
            raise UserError(f"every_steps must be a whole number >= 1, got {self.every_steps!r}")
        if self.every_seconds is not None and not (self.every_seconds > 0 and math.isfinite(self.every_seconds)):
            raise UserError(f"every_seconds must be a finite number > 0, got {self.every_seconds!r}")
        if not (self.mtbi_seconds > 0 and math.isfinite(self.mtbi_seconds)):
            raise UserError(f"mtbi_hours must be a finite number > 0, got {self.mtbi_seconds / 3600!r}")

    @property
    def periodic(self) -> bool:
        return self.auto or self.every_steps is not None or self.every_seconds is not None


@dataclasses.dataclass(frozen=True)
class SaveHistory:
    """What the policy needs to know about past saves."""

    last_step: int | None = None  # step of the last save (None: none this attempt)
    last_time: float | None = None  # when it was started (monotonic seconds)
    stall_seconds: float | None = None  # how long training was blocked by it (C)
    persist_seconds: float | None = None  # how long it took to commit in the background


def young_daly_interval(cost_seconds: float, mtbi_seconds: float) -> float:
    """Young's first-order optimum checkpoint interval, sqrt(2 * C * MTBI)."""
    if cost_seconds < 0 or mtbi_seconds <= 0:
        raise ValueError("cost must be >= 0 and MTBI > 0")
    return math.sqrt(2.0 * cost_seconds * mtbi_seconds)


def auto_interval(history: SaveHistory, mtbi_seconds: float) -> float | None:
    """Seconds between auto saves, or None when no save has been measured yet."""
    if history.stall_seconds is None:
        return None
    interval = young_daly_interval(history.stall_seconds, mtbi_seconds)
    return max(interval, history.persist_seconds or 0.0)


def should_save(policy: SavePolicy, step: int, now: float, history: SaveHistory) -> bool:
    """Whether a periodic save is due at the boundary after ``step`` completed."""
    if history.last_step == step:
        return False
    if policy.every_steps is not None and step % policy.every_steps == 0:
        return True
    elapsed = None if history.last_time is None else now - history.last_time
    if policy.every_seconds is not None and (elapsed is None or elapsed >= policy.every_seconds):
        # Without a previous save the clock starts at the first boundary: see session.
        if elapsed is not None:
            return True
    if policy.auto:
        interval = auto_interval(history, policy.mtbi_seconds)
        if interval is None or elapsed is None or elapsed >= interval:
            return True
    return False
