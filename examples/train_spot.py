"""A small deterministic training job that survives spot interruptions.

    gpucloud spot-train -- torchrun --standalone --nproc-per-node 2 examples/train_spot.py --steps 200 --out final.pt
    gpucloud spot-train -- python examples/train_spot.py --steps 200 --out final.pt      # one process
    gpucloud spot-train -- torchrun --standalone --nproc-per-node 8 examples/train_spot.py --device cuda  # NCCL, a GPU per rank

Every step's data is derived from (seed, step, rank), so an attempt that resumes from a checkpoint
sees exactly the batches an uninterrupted run would, and the final weights written to ``--out``
are bitwise identical to an uninterrupted run with the same seed (``gpucloud demo`` checks this).
On CUDA that holds too: deterministic algorithms, cuBLAS's fixed workspace, and the CUDA RNG (dropout)
saved with the checkpoint (``gpucloud demo --device cuda``).
"""

from __future__ import annotations

import argparse
import os
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from gpucloud.checkpoint import TrainingSession


def batch(seed: int, step: int, rank: int, size: int = 32) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed * 1_000_003 + step * 1_009 + rank)
    x = torch.randn(size, 16, generator=gen)
    return x, x.sum(dim=1, keepdim=True).sin()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=200, help="total optimizer steps")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--every-steps", type=int, default=None, help="periodic checkpoint interval (steps)")
    parser.add_argument(
        "--step-seconds", type=float, default=0.0, help="extra time per step, standing in for a big model"
    )
    parser.add_argument("--out", default=None, help="write the final weights here (rank 0)")
    parser.add_argument("--log-steps", action="store_true", help="print 'step N' after every step (rank 0)")
    parser.add_argument(
        "--device", choices=["cpu", "cuda"], default="cpu", help="cpu (gloo) or cuda (one GPU per rank, NCCL)"
    )
    args = parser.parse_args()

    cuda = args.device == "cuda"
    device = torch.device("cpu")
    if cuda:
        # Deterministic cuBLAS needs a fixed workspace, set before its first use (PyTorch's reproducibility notes).
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        torch.cuda.set_device(device)
    # On CUDA a single rank under torchrun joins an NCCL group too: the per-step agreement then runs on NCCL.
    distributed = int(os.environ.get("WORLD_SIZE", "1")) > 1 or (cuda and "LOCAL_RANK" in os.environ)
    if distributed:
        dist.init_process_group("nccl" if cuda else "gloo")
    rank = dist.get_rank() if distributed else 0
    torch.manual_seed(args.seed)
    torch.use_deterministic_algorithms(True)
    model = torch.nn.Sequential(
        torch.nn.Linear(16, 64), torch.nn.Tanh(), torch.nn.Dropout(0.1), torch.nn.Linear(64, 1)
    ).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)

    # The spot-safe loop: restore, call step_done() at every step boundary, finish().
    # data_from_step: batch() derives each step's data from the step, so there is no loader position
    # to save (examples/train_data.py shows the StatefulDataLoader way).
    session = TrainingSession(model, optimizer, every_steps=args.every_steps, data_from_step=True)
    start = session.restore()
    net = DistributedDataParallel(model, device_ids=[device] if cuda else None) if distributed else model
    for step in range(start, args.steps):
        x, y = (t.to(device) for t in batch(args.seed, step, rank))
        loss = torch.nn.functional.mse_loss(net(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        time.sleep(args.step_seconds)
        session.step_done(step + 1)  # on a spot notice: every rank saves this step and exits 75
        if args.log_steps and rank == 0:
            print(f"step {step + 1} loss {loss.item():.6f}", flush=True)
    session.finish()

    if args.out and rank == 0:
        torch.save({k: v.cpu() for k, v in model.state_dict().items()}, args.out)
    if distributed:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
