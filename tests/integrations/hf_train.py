"""A tiny GPT-2 (built from a config, nothing downloaded) trained by the HF Trainer with
SpotTrainerCallback. Run by tests/integrations/test_frameworks_spot.py under spot-train."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainerCallback, TrainingArguments

sys.path.insert(0, str(Path(__file__).parent))
from _pause import hold_until_flagged

from gpucloud.integrations.transformers import SpotTrainerCallback, checkpoint_dir, resume_checkpoint


class Tokens(torch.utils.data.Dataset):
    def __init__(self, n: int = 64, length: int = 8, vocab: int = 64) -> None:
        g = torch.Generator().manual_seed(1)
        self.ids = torch.randint(0, vocab, (n, length), generator=g)

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


class Pause(TrainerCallback):
    def __init__(self, pause_at: int, paused_file: str | None) -> None:
        self.pause_at, self.paused_file = pause_at, paused_file

    def on_step_end(self, args, state, control, **kwargs):
        hold_until_flagged(state.global_step, self.pause_at, self.paused_file)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--output-dir")
    p.add_argument("--pause-at", type=int, default=0)
    p.add_argument("--paused-file")
    a = p.parse_args()
    torch.manual_seed(0)
    model = GPT2LMHeadModel(
        GPT2Config(vocab_size=64, bos_token_id=0, eos_token_id=0, n_positions=8, n_embd=16, n_layer=2, n_head=2)
    )
    output_dir = a.output_dir or str(checkpoint_dir())
    args = TrainingArguments(
        output_dir=output_dir,
        max_steps=a.steps,
        per_device_train_batch_size=4,
        learning_rate=1e-3,
        save_strategy="no",
        logging_strategy="no",
        report_to="none",
        use_cpu=True,
        disable_tqdm=True,
        seed=3,
        dataloader_num_workers=0,
    )
    callbacks = [Pause(a.pause_at, a.paused_file), SpotTrainerCallback()]
    trainer = Trainer(model=model, args=args, train_dataset=Tokens(), callbacks=callbacks)
    trainer.train(resume_from_checkpoint=resume_checkpoint(output_dir))
    torch.save({k: v.detach().clone() for k, v in model.state_dict().items()}, a.out)


if __name__ == "__main__":
    main()
