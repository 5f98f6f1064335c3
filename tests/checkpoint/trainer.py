"""A small deterministic training job for the checkpoint tests (run as a script, one process
per rank, or import build_model/DataPosition; RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT/LOCAL_RANK come from the environment).

It uses everything a real job does: DDP over gloo, AdamW, dropout (torch RNG), python ``random``
noise, and a data position object in ``extra_state``. ``--preempt-at K --preempt-rank R`` makes
rank R write the ``preempt`` control file into its own control directory after step K, the way a
supervisor on R's node would. The final weights go to ``--out`` (rank 0).
"""

from __future__ import annotations

import argparse
import os
import random
import sys

import torch
import torch.distributed as dist

from gpucloud import control
from gpucloud.checkpoint import TrainingSession


class DataPosition:
    """Where the data stream is: the next sample index (what a resumable loader tracks)."""

    def __init__(self, rank: int) -> None:
        self.rank = rank
        self.index = 0

    def batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        g = torch.Generator().manual_seed(1_000_003 * self.index + self.rank)
        self.index += 1
        x = torch.randn(8, 16, generator=g)
        return x, x.sum(dim=1, keepdim=True)

    def state_dict(self) -> dict:
        return {"index": self.index}

    def load_state_dict(self, sd: dict) -> None:
        self.index = int(sd["index"])


def build_model() -> torch.nn.Module:
    torch.manual_seed(1234)
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Dropout(0.1), torch.nn.Linear(32, 1))


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, required=True)
    p.add_argument("--uri", required=True)
    p.add_argument("--job", default="job")
    p.add_argument("--control", required=True, help="base dir; each rank uses <base>/node<rank>")
    p.add_argument("--local", default=None, help="base dir of the node-local tier (per rank)")
    p.add_argument("--every-steps", type=int, default=None)
    p.add_argument("--preempt-at", type=int, default=None)
    p.add_argument("--preempt-rank", type=int, default=0)
    p.add_argument("--out", default=None)
    p.add_argument("--dump-restored", default=None, help="save rank 0's weights right after restore")
    args = p.parse_args(argv)

    distributed = int(os.environ.get("WORLD_SIZE", "1")) > 1
    if distributed:
        dist.init_process_group("gloo")
    rank = dist.get_rank() if distributed else 0
    model = build_model()
    ddp = torch.nn.parallel.DistributedDataParallel(model) if distributed else model
    optimizer = torch.optim.AdamW(ddp.parameters(), lr=1e-2)
    data = DataPosition(rank)
    control_dir = os.path.join(args.control, f"node{rank}")
    local = os.path.join(args.local, f"node{rank}") if args.local else None
    torch.manual_seed(99 + rank)
    random.seed(7 + rank)
    sess = TrainingSession(
        ddp,
        optimizer,
        extra_state={"data": data},
        every_steps=args.every_steps,
        checkpoint_uri=args.uri,
        job_id=args.job,
        control_dir=control_dir,
        local_dir=local,
    )
    start = sess.restore()
    if rank == 0 and args.dump_restored:
        torch.save(
            {
                "step": start,
                "weights": {k: v.detach().clone() for k, v in model.state_dict().items()},
                "data_index": data.index,
            },
            args.dump_restored,
        )
    try:
        for step in range(start, args.steps):
            x, y = data.batch()
            loss = torch.nn.functional.mse_loss(ddp(x), y) + 1e-3 * random.random()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            if args.preempt_at == step + 1 and rank == args.preempt_rank:
                control.write(control_dir, control.PREEMPT, {"kind": "spot-interruption"})
            sess.step_done(step + 1)
        sess.finish()
    finally:  # also on SystemExit(75): the weights of the step that was checkpointed
        if rank == 0 and args.out:
            torch.save({k: v.detach().clone() for k, v in model.state_dict().items()}, args.out)
    if distributed:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
