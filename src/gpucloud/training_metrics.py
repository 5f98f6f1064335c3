"""What the training session measures for the node's exporter (pure: no I/O, no prometheus_client).

The session (node leader, local rank 0) keeps cumulative histograms of its step times, save times
and training-loop stalls, and a failure count, in a ``SessionMeter``; its JSON rides in the
``progress`` control file (``"metrics"``, rewritten at most once a second and after every save).
The agent's exporter (``gpucloud.agent.metrics``) reads that file and adds what changed since its
last read to the node's own counters: cumulative numbers survive a missed read, and a session that
starts again (a new process in the same control directory) shows as a reset, as a Prometheus
counter reset does. No collective is involved: ranks of one node train in lock step (every step
boundary is an all_reduce), so local rank 0's step times are its node's.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

FORMAT = 1  # the "metrics" payload's version: an exporter ignores a payload of another version

# Steps of 0.05 s (a small model) to 10 min (a huge one with gradient accumulation).
STEP_SECONDS_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0)
# Start -> durable commit; 120 s is the spot notice (an emergency save must commit before it).
SAVE_SECONDS_BUCKETS = (0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 30.0, 60.0, 90.0, 120.0, 300.0, 600.0, 1800.0)
# The loop blocked by one save: milliseconds for an asynchronous save, the whole save for a synchronous one.
STALL_SECONDS_BUCKETS = (0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 600.0)
SAVE_KINDS = ("periodic", "emergency")  # emergency: the notice's save; periodic: every other one


@dataclasses.dataclass
class Histogram:
    """A cumulative histogram: per-bucket counts (``counts[i]`` for values <= ``bounds[i]``, the last
    entry for values above every bound), their sum and their count."""

    bounds: tuple[float, ...]
    counts: list[int] = dataclasses.field(default_factory=list)
    sum: float = 0.0

    def __post_init__(self) -> None:
        if not self.counts:
            self.counts = [0] * (len(self.bounds) + 1)

    @property
    def count(self) -> int:
        return sum(self.counts)

    def observe(self, value: float, times: int = 1) -> None:
        if not math.isfinite(value) or value < 0 or times < 1:
            return
        index = next((i for i, bound in enumerate(self.bounds) if value <= bound), len(self.bounds))
        self.counts[index] += times
        self.sum += value * times

    def cumulative(self) -> list[tuple[str, int]]:
        """Prometheus' ``le`` buckets: (bound, count of values <= bound), ending with ``+Inf``."""
        out, running = [], 0
        for bound, count in zip((*self.bounds, math.inf), self.counts, strict=True):
            running += count
            out.append(("+Inf" if bound == math.inf else repr(float(bound)), running))
        return out

    def add(self, other: Histogram) -> None:
        self.counts = [a + b for a, b in zip(self.counts, other.counts, strict=True)]
        self.sum += other.sum

    def since(self, earlier: Histogram | None) -> Histogram:
        """What was observed after ``earlier`` (all of it after a reset: a count that went down)."""
        if earlier is None or any(now < before for now, before in zip(self.counts, earlier.counts, strict=True)):
            return Histogram(self.bounds, list(self.counts), self.sum)
        return Histogram(
            self.bounds, [a - b for a, b in zip(self.counts, earlier.counts, strict=True)], self.sum - earlier.sum
        )

    def to_json(self) -> dict[str, Any]:
        return {"le": list(self.bounds), "counts": list(self.counts), "sum": round(self.sum, 6)}

    @classmethod
    def from_json(cls, data: object, bounds: tuple[float, ...]) -> Histogram | None:
        """The histogram in ``data`` if it has exactly ``bounds``; None otherwise (other bounds
        cannot be added to ours)."""
        if not isinstance(data, dict) or data.get("le") != list(bounds):
            return None
        counts, total = data.get("counts"), data.get("sum")
        if not isinstance(counts, list) or len(counts) != len(bounds) + 1:
            return None
        if not all(isinstance(c, int) and not isinstance(c, bool) and c >= 0 for c in counts):
            return None
        if isinstance(total, bool) or not isinstance(total, (int, float)) or not math.isfinite(total):
            return None
        return cls(bounds, list(counts), float(total))


@dataclasses.dataclass
class Snapshot:
    """One ``"metrics"`` payload, parsed: cumulative since the session started."""

    steps: Histogram = dataclasses.field(default_factory=lambda: Histogram(STEP_SECONDS_BUCKETS))
    saves: dict[str, Histogram] = dataclasses.field(
        default_factory=lambda: {kind: Histogram(SAVE_SECONDS_BUCKETS) for kind in SAVE_KINDS}
    )
    stalls: Histogram = dataclasses.field(default_factory=lambda: Histogram(STALL_SECONDS_BUCKETS))
    failures: int = 0
    last_bytes: int | None = None  # the last committed checkpoint's size (every rank's files)

    def since(self, earlier: Snapshot | None) -> Snapshot:
        """What this session observed after ``earlier`` (each part from zero after a reset)."""
        if earlier is None:
            earlier = Snapshot()
        failures = self.failures - earlier.failures if self.failures >= earlier.failures else self.failures
        return Snapshot(
            steps=self.steps.since(earlier.steps),
            saves={kind: self.saves[kind].since(earlier.saves[kind]) for kind in SAVE_KINDS},
            stalls=self.stalls.since(earlier.stalls),
            failures=failures,
            last_bytes=self.last_bytes,
        )

    def add(self, delta: Snapshot) -> None:
        """Add a ``since`` delta to these node-lifetime totals."""
        self.steps.add(delta.steps)
        for kind in SAVE_KINDS:
            self.saves[kind].add(delta.saves[kind])
        self.stalls.add(delta.stalls)
        self.failures += delta.failures
        if delta.last_bytes is not None:
            self.last_bytes = delta.last_bytes

    def to_json(self) -> dict[str, Any]:
        return {
            "v": FORMAT,
            "step_seconds": self.steps.to_json(),
            "save_seconds": {kind: h.to_json() for kind, h in self.saves.items()},
            "stall_seconds": self.stalls.to_json(),
            "failures": self.failures,
            "bytes": self.last_bytes,
        }

    @classmethod
    def from_json(cls, data: object) -> Snapshot | None:
        """None unless ``data`` is a payload of this format with our buckets (a session of another
        gpucloud version); a part that does not parse counts as nothing observed."""
        if not isinstance(data, dict) or data.get("v") != FORMAT:
            return None
        snap = cls()
        snap.steps = Histogram.from_json(data.get("step_seconds"), STEP_SECONDS_BUCKETS) or snap.steps
        saves = data.get("save_seconds")
        saves = saves if isinstance(saves, dict) else {}
        for kind in SAVE_KINDS:
            snap.saves[kind] = Histogram.from_json(saves.get(kind), SAVE_SECONDS_BUCKETS) or snap.saves[kind]
        snap.stalls = Histogram.from_json(data.get("stall_seconds"), STALL_SECONDS_BUCKETS) or snap.stalls
        failures, size = data.get("failures"), data.get("bytes")
        if isinstance(failures, int) and not isinstance(failures, bool) and failures >= 0:
            snap.failures = failures
        if isinstance(size, int) and not isinstance(size, bool) and size >= 0:
            snap.last_bytes = size
        return snap


class SessionMeter:
    """The session's side: told of every step boundary and every save, it keeps a ``Snapshot``."""

    def __init__(self) -> None:
        self.snapshot = Snapshot()
        self._last: tuple[float, int] | None = None  # (monotonic time, step) of the last boundary

    def start(self, now: float, step: int) -> None:
        """Training (re)starts at ``step``: the next boundary's interval is measured from here."""
        self._last = (now, step)

    def step(self, now: float, step: int) -> None:
        """A step boundary. ``k`` steps since the last one count as ``k`` steps of 1/k the interval
        each; a repeated boundary (same step) moves nothing."""
        last = self._last
        if last is not None and step > last[1]:
            done = step - last[1]
            self.snapshot.steps.observe((now - last[0]) / done, times=done)
        if last is None or step > last[1]:
            self._last = (now, step)

    def saved(self, kind: str, *, seconds: float, stall: float, size: int) -> None:
        self.snapshot.saves[kind if kind in SAVE_KINDS else "periodic"].observe(seconds)
        self.snapshot.stalls.observe(stall)
        self.snapshot.last_bytes = size

    def failed(self, *, stall: float) -> None:
        self.snapshot.failures += 1
        self.snapshot.stalls.observe(stall)

    def to_json(self) -> dict[str, Any]:
        return self.snapshot.to_json()
