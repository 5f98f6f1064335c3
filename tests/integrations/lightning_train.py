"""A 2-layer Lightning module trained with SpotCheckpoint from a StatefulDataLoader. Run by
tests/integrations/test_frameworks_spot.py under spot-train."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import lightning.pytorch as pl
import torch
from torchdata.stateful_dataloader import StatefulDataLoader

sys.path.insert(0, str(Path(__file__).parent))
from _pause import hold_until_flagged

from gpucloud.integrations.lightning import SpotCheckpoint, checkpoint_dir, resume_checkpoint


class TwoLayer(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))

    def training_step(self, batch, batch_idx):
        x, y = batch
        return torch.nn.functional.mse_loss(self.net(x), y)

    def configure_optimizers(self):
        opt = torch.optim.AdamW(self.parameters(), lr=1e-2)
        return {"optimizer": opt, "lr_scheduler": torch.optim.lr_scheduler.StepLR(opt, step_size=3, gamma=0.9)}


class Pause(pl.Callback):
    def __init__(self, pause_at: int, paused_file: str | None) -> None:
        self.pause_at, self.paused_file = pause_at, paused_file

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        hold_until_flagged(trainer.global_step, self.pause_at, self.paused_file)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--output-dir")
    p.add_argument("--pause-at", type=int, default=0)
    p.add_argument("--paused-file")
    a = p.parse_args()
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(1)
    data = torch.utils.data.TensorDataset(torch.randn(48, 8, generator=g), torch.randn(48, 1, generator=g))
    loader = StatefulDataLoader(data, batch_size=4, shuffle=True)
    model = TwoLayer()
    spot = SpotCheckpoint(a.output_dir or checkpoint_dir())
    trainer = pl.Trainer(
        max_steps=a.steps,
        accelerator="cpu",
        devices=1,
        callbacks=[Pause(a.pause_at, a.paused_file), spot],
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(model, train_dataloaders=loader, ckpt_path=resume_checkpoint(spot.dirpath))
    torch.save({k: v.detach().clone() for k, v in model.state_dict().items()}, a.out)


if __name__ == "__main__":
    main()
