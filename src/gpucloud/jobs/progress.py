"""Live progress of a running attempt: its current step and its step rate (pure, no I/O).

The session writes the ``progress`` control file (at most once a second, on a step boundary);
the supervisor feeds each new one to ``StepRate`` and hands the queue a ``Progress`` with every
lease renewal (``JobQueue.heartbeat``), so `gpucloud jobs` and `job show` follow a running job at
no extra write to the job table (on DynamoDB the renewal is one ``UpdateItem`` of the job item
either way; three more numbers in it cost no more write units).
"""

from __future__ import annotations

import collections
import dataclasses
import math

from gpucloud.lifecycle.model import Progress

RATE_WINDOW_S = 60.0  # the rate is over the samples of the last minute: recent, yet smooth
MIN_SPAN_S = 0.001  # samples closer than this give no rate (it would be noise, or overflow)


@dataclasses.dataclass(frozen=True)
class Sample:
    at: float  # when the session wrote the step (its ``written_at``)
    step: int


class StepRate:
    """Steps per second over the last ``window_s`` of progress samples, and the newest step."""

    def __init__(self, window_s: float = RATE_WINDOW_S) -> None:
        if not window_s > 0:
            raise ValueError(f"window_s must be > 0, got {window_s}")
        self.window_s = window_s
        self._samples: collections.deque[Sample] = collections.deque()

    def add(self, step: int, at: float) -> None:
        """A progress sample. The same file read again (not newer) changes nothing; a step that
        went back (a restore within the attempt) starts the window again."""
        if not math.isfinite(at):
            return
        samples = self._samples
        if samples and at <= samples[-1].at:
            return
        if samples and step < samples[-1].step:
            samples.clear()
        samples.append(Sample(at, step))
        # Keep one sample older than the window: steps slower than the window still get a rate.
        while len(samples) > 2 and samples[1].at <= at - self.window_s:
            samples.popleft()

    @property
    def last(self) -> Sample | None:
        return self._samples[-1] if self._samples else None

    def rate(self, now: float) -> float | None:
        """Steps per second; None until two samples exist. 0.0 once no step was written for
        longer than the window and twice the last interval between steps: training stopped
        advancing (hung, or saving a large checkpoint), and an old rate would hide it."""
        if len(self._samples) < 2:
            return None
        first, last = self._samples[0], self._samples[-1]
        previous = self._samples[-2]
        if now - last.at > max(self.window_s, 2 * (last.at - previous.at)):
            return 0.0
        span = last.at - first.at
        if span < MIN_SPAN_S:  # the session writes at most once a second: these are not two steps apart
            return None
        return (last.step - first.step) / span

    def progress(self, now: float) -> Progress | None:
        """What the queue stores; None before the first sample."""
        last = self.last
        if last is None:
            return None
        rate = self.rate(now)
        return Progress(last_step=last.step, step_rate=None if rate is None else round_rate(rate), progress_at=last.at)


def round_rate(rate: float) -> float:
    """Four significant digits: 2.513 steps/s, 0.003333 (one step in five minutes)."""
    return float(f"{rate:.4g}")
