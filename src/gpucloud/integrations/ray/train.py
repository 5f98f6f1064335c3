"""The training function's side: Ray reports a preemption → every worker saves the same step
through gpucloud's ``TrainingSession``, reports it to Ray, and Ray restarts the group from it.

    def train_func(config):
        session = TrainingSession(model, optimizer, every_steps=500, checkpoint_uri=..., job_id=...)
        spot = RaySpotSession(session)
        start = spot.restore()
        for step in range(start, total_steps):
            train_one_step(step)
            spot.step_done(step + 1)
        spot.finish()

``step_done`` runs the session's own step boundary (periodic asynchronous saves), then calls
``ray.train.get_preemption_info()``, Ray's barrier across workers, so every worker sees the same
answer at the same step. On a preemption:

* enough time left (the measured save time, doubled, plus a floor): every worker saves this step
  with ``session.save_now`` (manifest, LATEST, proven durable), rank 0 reports a small checkpoint
  to Ray that names the committed step, and every worker waits for Ray to restart the group. No
  step runs after the save, so the restart loses none;
* too little time: the decision is agreed by all ranks (one all_reduce), logged, and nothing is
  saved; Ray restarts from the last committed checkpoint, which ``restore`` loads.

The gpucloud checkpoint store is the checkpoint; Ray's checkpoint is only a pointer to its step,
so Ray copies a few bytes to ``storage_path``, not the weights.
"""

from __future__ import annotations

import json
import logging
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import ray.train

from gpucloud.checkpoint.session import TrainingSession

log = logging.getLogger("gpucloud.integrations.ray")

POINTER_FILE = "gpucloud_checkpoint.json"
DEFAULT_MIN_SECONDS = 5.0


class PreemptionNotHonored(RuntimeError):
    """Ray reported a preemption but did not restart the worker group well past its deadline."""


class RaySpotSession:
    """Connects a ``TrainingSession`` to Ray Train's preemption API (see the module docs)."""

    def __init__(
        self,
        session: TrainingSession,
        *,
        min_seconds: float = DEFAULT_MIN_SECONDS,
        hold_past_deadline: float = 60.0,
        on_preemption: Callable[[RaySpotSession], None] | None = None,
    ) -> None:
        if isinstance(min_seconds, bool) or not isinstance(min_seconds, (int, float)) or min_seconds < 0:
            raise ValueError(f"min_seconds must be a number of seconds >= 0, got {min_seconds!r}")
        self.session = session
        self.min_seconds = float(min_seconds)
        self.hold_past_deadline = float(hold_past_deadline)
        # Called on every worker once the preemption is handled (saved or skipped), before the
        # worker waits for Ray's restart: the place to log or flush what the script keeps.
        self.on_preemption = on_preemption
        self.preempted_at: int | None = None  # the step at which Ray's preemption was agreed
        self.committed_on_preemption: int | None = None
        self.preemption_seen_at: float | None = None  # epoch s: this worker passed Ray's barrier with it
        self.committed_at: float | None = None  # epoch s: the preemption save was durable
        self.skipped_save: str | None = None  # why the preemption save was not made

    def restore(self) -> int:
        """Load the newest committed checkpoint (0 when none). Ray's checkpoint, when it has one,
        names a committed step; the store's newest is that one or newer."""
        step = self.session.restore()
        reported = _reported_step(ray.train.get_checkpoint())
        if reported is not None and step < reported:
            log.warning("Ray's checkpoint names step %d but the store's newest is step %d", reported, step)
        return step

    def step_done(self, step: int) -> None:
        """After every completed step, on every worker (``step`` = steps done)."""
        self.session.step_done(step)
        info = ray.train.get_preemption_info()  # a barrier: every worker gets the same answer here
        if info is None or self.preempted_at is not None:
            return
        self.preempted_at = step
        self.preemption_seen_at = time.time()
        seconds_left = None if info.deadline_ms is None else info.deadline_ms / 1000 - time.time()
        needed = self.seconds_needed()
        short = seconds_left is not None and seconds_left < needed
        (short_anywhere,) = self.session.ranks.agree_max([int(short)])  # clocks differ per node: one decision
        if short_anywhere:
            left = f"{seconds_left:.1f}s" if short else "too little time"  # this rank's clock, or another's
            self.skipped_save = (
                f"preemption of ranks {info.preempted_ranks} at step {step}: "
                f"{left} left, a save needs {needed:.1f}s; "
                f"not saving, Ray restarts from committed step {self.session.last_committed or 0}"
            )
            log.warning("%s", self.skipped_save)
        else:
            self.session.save_now(step)
            self.committed_on_preemption = step
            self.committed_at = time.time()
            log.warning(
                "preemption of ranks %s: step %d committed to %s",
                info.preempted_ranks,
                step,
                self.session.store.durable_description(step),
            )
        self._report_committed()
        if self.on_preemption is not None:
            self.on_preemption(self)
        self._hold(info.deadline_ms)

    def seconds_needed(self) -> float:
        """Time a preemption save needs: twice the last measured save, at least ``min_seconds``."""
        last = self.session.last_save
        measured = float(last["seconds"]) * 2 if last else 0.0
        return max(self.min_seconds, measured)

    def finish(self) -> None:
        self.session.finish()

    def _report_committed(self) -> None:
        """Tell Ray which step is committed (every rank calls report; rank 0 gives the checkpoint)."""
        step = self.session.last_committed
        metrics = {"gpucloud_committed_step": -1 if step is None else step}
        if step is None or self.session.ranks.rank != 0:
            ray.train.report(metrics)
            return
        with tempfile.TemporaryDirectory(prefix="gpucloud-ray-") as tmp:
            body = {"step": step, "uri": self.session.store.durable_description(step)}
            (Path(tmp) / POINTER_FILE).write_text(json.dumps(body))
            ray.train.report(metrics, checkpoint=ray.train.Checkpoint.from_directory(tmp))

    def _hold(self, deadline_ms: int | None) -> None:
        """Wait for Ray to tear the group down and restart it (it does at the deadline, or once
        every worker has exited). Training on would only run steps the restart throws away."""
        deadline = time.time() + 120.0 if deadline_ms is None else deadline_ms / 1000
        until = deadline + self.hold_past_deadline
        event = threading.Event()
        while not event.wait(timeout=max(0.0, min(1.0, until - time.time()))):
            if time.time() >= until:
                raise PreemptionNotHonored(
                    f"Ray reported a preemption (deadline {deadline:.0f}) but did not restart the worker group "
                    f"{self.hold_past_deadline:.0f}s past it"
                )


def _reported_step(checkpoint: Any) -> int | None:
    if checkpoint is None:
        return None
    with checkpoint.as_directory() as directory:
        pointer = Path(directory) / POINTER_FILE
        if not pointer.exists():
            return None
        return int(json.loads(pointer.read_text())["step"])
