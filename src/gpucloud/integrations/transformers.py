"""HF Trainer under ``gpucloud spot-train``: a notice saves the agreed step with the Trainer's own
checkpointing and exits 75; the next attempt resumes from it.

    from gpucloud.integrations.transformers import SpotTrainerCallback, checkpoint_dir, resume_checkpoint

    args = TrainingArguments(output_dir=str(checkpoint_dir()), ...)
    trainer = Trainer(model=model, args=args, train_dataset=ds, callbacks=[SpotTrainerCallback()])
    trainer.train(resume_from_checkpoint=resume_checkpoint(args.output_dir))

At the end of every optimizer step each rank reads the ``preempt`` flag and all ranks agree
(one all_reduce); on a notice the callback asks the Trainer to save (``checkpoint-<step>``:
model, optimizer, scheduler, RNG, trainer state) and to stop. When the save is complete on every
rank (``on_save``), rank 0 fsyncs it and replaces ``<output_dir>/LATEST``, then every rank exits 75.
Periodic saves (``save_steps``) are committed the same way, so a crash resumes from the newest.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

from gpucloud.integrations import _contract

__all__ = ["SpotTrainerCallback", "checkpoint_dir", "resume_checkpoint"]


def checkpoint_dir(*, checkpoint_uri: str | None = None, job_id: str | None = None) -> Path:
    """``<GPUCLOUD_CHECKPOINT_URI>/<GPUCLOUD_JOB_ID>/hf-trainer``: the ``output_dir`` to give the Trainer."""
    return _contract.checkpoint_dir("hf-trainer", checkpoint_uri=checkpoint_uri, job_id=job_id)


def resume_checkpoint(output_dir: str | os.PathLike[str]) -> str | None:
    """The committed checkpoint to pass as ``trainer.train(resume_from_checkpoint=...)``; None on a
    fresh job. Unlike ``get_last_checkpoint`` it never picks a checkpoint a killed save left half-written."""
    found = _contract.committed_checkpoint(output_dir)
    return None if found is None else str(found)


class SpotTrainerCallback(TrainerCallback):
    """Gives an HF Trainer the spot-train contract (see the module docs)."""

    def __init__(self, *, control_dir: str | None = None) -> None:
        self.contract = _contract.SpotContract(control_dir)

    def on_train_begin(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any):
        data = (
            "not restored: ignore_data_skip=True"
            if args.ignore_data_skip
            else "restored (the Trainer skips the batches already seen)"
        )
        self.contract.start(state.global_step, data_position=data)

    def on_step_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any):
        if self.contract.preempt_agreed(state.global_step):
            control.should_save = True
            control.should_training_stop = True
        return control

    def on_save(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any):
        # The Trainer calls on_save right after _save_checkpoint wrote checkpoint-<global_step>.
        self.contract.saved(
            Path(str(args.output_dir)), f"{PREFIX_CHECKPOINT_DIR}-{state.global_step}", state.global_step
        )
        return control

    def on_train_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any):
        self.contract.finished(state.global_step)
