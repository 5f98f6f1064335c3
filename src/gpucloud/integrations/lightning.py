"""Lightning under ``gpucloud spot-train``: a notice saves the agreed step with Lightning's own
checkpointing (``trainer.save_checkpoint``) and exits 75; the next attempt resumes from it.

    from gpucloud.integrations.lightning import SpotCheckpoint, checkpoint_dir, resume_checkpoint

    spot = SpotCheckpoint(checkpoint_dir())
    trainer = L.Trainer(max_steps=1000, callbacks=[spot])
    trainer.fit(model, train_dataloaders=loader, ckpt_path=resume_checkpoint(spot.dirpath))

After every training batch each rank reads the ``preempt`` flag and all ranks agree (one
all_reduce); on a notice every rank calls ``trainer.save_checkpoint(<dir>/step-<n>.ckpt)``
(model, optimizers, schedulers, loop state, and the data loader's position when it is a
``StatefulDataLoader``), rank 0 fsyncs it and replaces ``<dir>/LATEST``, and every rank exits 75.
``every_n_steps`` commits periodic saves the same way.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import lightning.pytorch as pl

from gpucloud.errors import UserError
from gpucloud.integrations import _contract

__all__ = ["SpotCheckpoint", "checkpoint_dir", "resume_checkpoint"]


def checkpoint_dir(*, checkpoint_uri: str | None = None, job_id: str | None = None) -> Path:
    """``<GPUCLOUD_CHECKPOINT_URI>/<GPUCLOUD_JOB_ID>/lightning``."""
    return _contract.checkpoint_dir("lightning", checkpoint_uri=checkpoint_uri, job_id=job_id)


def resume_checkpoint(dirpath: str | os.PathLike[str]) -> str | None:
    """The committed checkpoint to pass as ``trainer.fit(..., ckpt_path=...)``; None on a fresh job."""
    found = _contract.committed_checkpoint(dirpath)
    return None if found is None else str(found)


class SpotCheckpoint(pl.Callback):
    """Gives a Lightning Trainer the spot-train contract (see the module docs)."""

    def __init__(
        self, dirpath: str | os.PathLike[str], *, every_n_steps: int | None = None, control_dir: str | None = None
    ) -> None:
        if every_n_steps is not None and (
            isinstance(every_n_steps, bool) or not isinstance(every_n_steps, int) or every_n_steps < 1
        ):
            raise UserError(
                f"every_n_steps must be a whole number >= 1 (or None: on notices only), got {every_n_steps!r}"
            )
        self.dirpath = Path(dirpath)
        self.every_n_steps = every_n_steps
        self.contract = _contract.SpotContract(control_dir)

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.dirpath.mkdir(parents=True, exist_ok=True)
        self.contract.start(trainer.global_step, data_position=_data_position(trainer))

    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        step = trainer.global_step
        preempt = self.contract.preempt_agreed(step)
        periodic = self.every_n_steps is not None and step > 0 and step % self.every_n_steps == 0
        if preempt or periodic:
            name = f"step-{step}.ckpt"
            trainer.save_checkpoint(self.dirpath / name)  # a collective: every rank calls it
            self.contract.saved(self.dirpath, name, step)  # exits 75 on a notice

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.contract.finished(trainer.global_step)


def _data_position(trainer: pl.Trainer) -> str:
    loaders = trainer.train_dataloader
    flat = (
        list(loaders.values())
        if isinstance(loaders, dict)
        else list(loaders)
        if isinstance(loaders, (list, tuple))
        else [loaders]
    )
    if all(callable(getattr(loader, "state_dict", None)) for loader in flat):
        return "restored (a StatefulDataLoader: Lightning keeps its position in the checkpoint)"
    return (
        "not restored: the train loader cannot save its position; after a mid-epoch resume the batches are not "
        "those of an uninterrupted run (use torchdata's StatefulDataLoader)"
    )
