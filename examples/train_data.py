"""Spot-safe training whose data position survives a resume: torchdata's StatefulDataLoader.

    gpucloud spot-train -- python examples/train_data.py --steps 60 --record batches.jsonl
    python examples/train_data.py --checkpoint-uri /tmp/ck --job-id demo --steps 60    # without spot-train

The loader goes into ``extra_state``: every checkpoint keeps its position (which samples of the
epoch were handed out, and the sampler's shuffle state), and ``restore()`` puts it back, so after a
resume the batches are exactly those an uninterrupted run would have seen, batch for batch, across
epoch boundaries (tests/checkpoint/test_data_position.py compares them). ``--record`` writes the
sample indices of every batch, one JSON line per step, to check that yourself.

Two rules (each refused with a one-line error otherwise): a plain ``torch.utils.data.DataLoader``
cannot save its position, so use ``StatefulDataLoader`` (same arguments); and do not pass it
``generator=`` with ``shuffle=True`` (torchdata 0.11 does not resume later epochs' order then):
seed with ``torch.manual_seed`` before building it, as below.
"""

from __future__ import annotations

import argparse
import json
import os
import time
import warnings
from collections.abc import Callable

import torch
from torch.utils.data import Dataset
from torchdata.stateful_dataloader import StatefulDataLoader

from gpucloud.checkpoint import TrainingSession

# torchdata 0.11 calls a torch API that torch 2.13 deprecated, once per loader: noise, not a problem.
warnings.filterwarnings("ignore", message="'set_vital' is deprecated", category=UserWarning)


class Synthetic(Dataset):
    """``size`` samples derived from (seed, index): stands in for a real dataset."""

    def __init__(self, size: int, seed: int) -> None:
        self.size, self.seed = size, seed

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int) -> tuple[int, torch.Tensor, torch.Tensor]:
        x = torch.randn(16, generator=torch.Generator().manual_seed(self.seed * 1_000_003 + index))
        return index, x, x.sum().sin().unsqueeze(0)


def build(args: argparse.Namespace) -> tuple[torch.nn.Module, torch.optim.Optimizer, StatefulDataLoader]:
    torch.manual_seed(args.seed)  # seeds the model and, through it, the loader's shuffle (no generator=)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 1))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    loader = StatefulDataLoader(
        Synthetic(args.samples, args.seed), batch_size=args.batch_size, shuffle=True, num_workers=args.workers
    )
    return model, optimizer, loader


def train(args: argparse.Namespace, on_step: Callable[[int, list[int]], None] | None = None) -> torch.nn.Module:
    """The spot-safe loop; ``on_step(step, sample_indices)`` after every step (recording, tests)."""
    model, optimizer, loader = build(args)
    session = TrainingSession(
        model,
        optimizer,
        # the data position is saved and restored with the weights
        extra_state={} if args.forget_data_position else {"data": loader},
        every_steps=args.every_steps,
        checkpoint_uri=args.checkpoint_uri,
        job_id=args.job_id,
    )
    step = session.restore()  # the loader now continues where the checkpoint's step left it
    say(f"{'resumed at' if step else 'starting at'} step {step} of {args.steps}")
    while step < args.steps:
        for indices, x, y in loader:  # a new epoch starts whenever the previous one is used up
            loss = torch.nn.functional.mse_loss(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            time.sleep(args.step_seconds)
            step += 1
            if on_step is not None:
                on_step(step, indices.tolist())
            if (args.log_every > 0 and step % args.log_every == 0) or step == args.steps:
                say(f"step {step} loss {loss.item():.6f}")
            session.step_done(step)  # a spot notice: every rank saves this step (and the position), exits 75
            if step == args.steps:
                break
    session.finish(save=True)
    say(f"finished: {args.steps} steps, the last one saved with the loader's position")
    return model


def say(line: str) -> None:
    """One line of progress, from the first rank only (under torchrun every rank runs this)."""
    if os.environ.get("RANK", "0") == "0":
        print(line, flush=True)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=60, help="total optimizer steps")
    p.add_argument("--samples", type=int, default=100, help="dataset size (an epoch is samples / batch size steps)")
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--workers", type=int, default=0, help="data-loader worker processes")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--step-seconds", type=float, default=0.0, help="extra time per step, standing in for a big model")
    p.add_argument("--every-steps", type=int, default=None, help="periodic checkpoint interval (steps)")
    p.add_argument("--checkpoint-uri", default=None, help="default: $GPUCLOUD_CHECKPOINT_URI (set by spot-train)")
    p.add_argument("--job-id", default=None, help="default: $GPUCLOUD_JOB_ID (set by spot-train)")
    p.add_argument(
        "--log-every", type=int, default=10, help="print the step and loss every this many steps (0: the last only)"
    )
    p.add_argument("--record", default=None, help="append each step's sample indices here (JSON lines)")
    p.add_argument(
        "--forget-data-position",
        action="store_true",
        help="for comparison: leave the loader out of extra_state (a resume then replays other batches, "
        "and `gpucloud job show` says the data position was not restored)",
    )
    return p


def main() -> None:
    args = parser().parse_args()
    if args.record is None:
        train(args)
        return
    with open(args.record, "a", encoding="utf-8") as out:
        train(args, lambda step, indices: print(json.dumps({"step": step, "samples": indices}), file=out, flush=True))


if __name__ == "__main__":
    main()
