"""Test-only: the Ray Train training function the Ray tests run (imported by Ray's worker processes).

Each step's batch is derived from the step and the rank, so a resumed run sees the batches an
uninterrupted one does. Every worker appends what it did to ``<logdir>/events.jsonl`` (one JSON
line per event: start, step, preemption, finish), which is what the tests read. ``pause_at`` holds
the first attempt at one step until ``<logdir>/gate`` exists, so the notice lands at a known point
without a sleep; ``step_seconds`` stands in for a bigger model.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import ray.train
import ray.train.torch
import torch


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))


def _batch(step: int, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(step * 1000 + rank)
    x = torch.randn(16, 8, generator=gen)
    return x, x.sum(dim=1, keepdim=True).sin()


class _Events:
    def __init__(self, logdir: str, rank: int) -> None:
        self.path = Path(logdir) / "events.jsonl"
        self.rank = rank
        self.run = uuid.uuid4().hex[:8]

    def write(self, event: str, **fields: Any) -> None:
        line = json.dumps({"event": event, "rank": self.rank, "run": self.run, "t": time.time(), **fields})
        with open(self.path, "a") as fh:  # one short line per write: O_APPEND keeps lines whole
            fh.write(line + "\n")


def train_func(config: dict[str, Any]) -> None:
    rank = ray.train.get_context().get_world_rank()
    events = _Events(config["logdir"], rank)
    model = ray.train.torch.prepare_model(_model())
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    if config["integration"]:
        _with_gpucloud(config, model, optimizer, events, rank)
    else:
        _plain_ray(config, model, optimizer, events, rank)


def _step(model: torch.nn.Module, optimizer: torch.optim.Optimizer, step: int, rank: int) -> None:
    x, y = _batch(step, rank)
    optimizer.zero_grad()
    torch.nn.functional.mse_loss(model(x), y).backward()
    optimizer.step()


def _pause(config: dict[str, Any], step: int, start: int, rank: int) -> None:
    if config.get("pause_at") != step or start != 0:
        return
    logdir = Path(config["logdir"])
    if rank == 0:
        (logdir / "paused").write_text(str(step))
    deadline = time.monotonic() + 300
    while not (logdir / "gate").exists():
        if time.monotonic() > deadline:
            raise RuntimeError("the test never opened the gate")
        time.sleep(0.02)  # polling a file the test writes


def _with_gpucloud(config: dict[str, Any], model: Any, optimizer: Any, events: _Events, rank: int) -> None:
    from gpucloud.checkpoint import TrainingSession
    from gpucloud.integrations.ray.train import RaySpotSession

    session = TrainingSession(
        model.module if hasattr(model, "module") else model,
        optimizer,
        every_steps=config["every"],
        checkpoint_uri=config["checkpoint_uri"],
        job_id=config["job_id"],
        data_from_step=True,
    )

    def preempted(spot: RaySpotSession) -> None:
        events.write(
            "preempted",
            step=spot.preempted_at,
            committed=spot.committed_on_preemption,
            skipped=spot.skipped_save,
            last_committed=session.last_committed,
            seen_at=spot.preemption_seen_at,
            committed_at=spot.committed_at,
        )

    spot = RaySpotSession(session, on_preemption=preempted)
    start = spot.restore()
    events.write("start", step=start, node=ray.get_runtime_context().get_node_id())
    for step in range(start, config["steps"]):
        _pause(config, step, start, rank)
        _step(model, optimizer, step, rank)
        events.write("step", step=step + 1)
        time.sleep(config["step_seconds"])  # stands in for a bigger model's step
        spot.step_done(step + 1)
    spot.finish()
    _finished(config, model, events, rank)


def _plain_ray(config: dict[str, Any], model: Any, optimizer: Any, events: _Events, rank: int) -> None:
    """Ray Train as its docs show it, without gpucloud: periodic checkpoints reported to Ray."""
    start = 0
    checkpoint = ray.train.get_checkpoint()
    inner = model.module if hasattr(model, "module") else model
    if checkpoint is not None:
        with checkpoint.as_directory() as directory:
            saved = torch.load(Path(directory) / "state.pt", weights_only=True)
        inner.load_state_dict(saved["model"])
        optimizer.load_state_dict(saved["optimizer"])
        start = saved["step"]
    events.write("start", step=start, node=ray.get_runtime_context().get_node_id())
    for step in range(start, config["steps"]):
        _pause(config, step, start, rank)
        _step(model, optimizer, step, rank)
        events.write("step", step=step + 1)
        time.sleep(config["step_seconds"])
        if (step + 1) % config["every"] == 0:
            with tempfile.TemporaryDirectory() as tmp:
                ckpt = None
                if rank == 0:
                    state = {"model": inner.state_dict(), "optimizer": optimizer.state_dict(), "step": step + 1}
                    torch.save(state, Path(tmp) / "state.pt")
                    ckpt = ray.train.Checkpoint.from_directory(tmp)
                ray.train.report({"step": step + 1}, checkpoint=ckpt)
    _finished(config, model, events, rank)


def _finished(config: dict[str, Any], model: Any, events: _Events, rank: int) -> None:
    inner = model.module if hasattr(model, "module") else model
    if rank == 0:
        out = Path(config["logdir"]) / "final.pt"
        tmp = out.with_suffix(f".{os.getpid()}.tmp")
        torch.save({k: v.clone() for k, v in inner.state_dict().items()}, tmp)
        os.replace(tmp, out)
    events.write("finish", step=config["steps"])
