"""Helpers for the checkpoint tests: launching real multi-rank jobs of trainer.py, moto."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

TRAINER = Path(__file__).with_name("trainer.py")
REPO = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_ranks(world_size: int, args: list[str], *, timeout: float = 120) -> list[subprocess.CompletedProcess]:
    """Run trainer.py as ``world_size`` ranks, each as its own "node" (LOCAL_RANK 0, own
    control directory), the way a multi-node torchrun job looks to the session."""
    port = free_port()
    procs = []
    for rank in range(world_size):
        env = dict(
            os.environ,
            RANK=str(rank),
            WORLD_SIZE=str(world_size),
            LOCAL_RANK="0",
            LOCAL_WORLD_SIZE="1",
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=str(port),
            PYTHONPATH=str(REPO / "src"),
            PYTHONWARNINGS="ignore",
        )
        procs.append(
            subprocess.Popen(
                [sys.executable, str(TRAINER), *args],
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
        )
    results = []
    for proc in procs:
        try:
            out, _ = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            for p in procs:
                p.kill()
            raise
        results.append(subprocess.CompletedProcess(proc.args, proc.returncode, out, ""))
    return results


@pytest.fixture
def moto_s3(fresh_aws_account):
    """The session's moto server, reset, with the bucket the S3-tier tests write to."""
    import boto3

    boto3.client("s3").create_bucket(Bucket="ckpt-bucket")
    return fresh_aws_account


class Counter:
    """An extra_state object: a data-loader position."""

    def __init__(self) -> None:
        self.position = 0

    def state_dict(self) -> dict:
        return {"position": self.position}

    def load_state_dict(self, sd: dict) -> None:
        self.position = int(sd["position"])


class TinyJob:
    """A single-process training job with model, AdamW, dropout, python RNG and a data position."""

    def __init__(
        self,
        uri: str,
        *,
        job_id: str = "job",
        control_dir: str | None = None,
        local_dir: str | None = None,
        width: int = 16,
        **session_kwargs,
    ) -> None:
        import random

        import torch

        from gpucloud.checkpoint import TrainingSession

        torch.manual_seed(0)
        random.seed(0)
        self.model = torch.nn.Sequential(
            torch.nn.Linear(8, width), torch.nn.Dropout(0.2), torch.nn.BatchNorm1d(width), torch.nn.Linear(width, 1)
        )
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=1e-2)
        self.data = Counter()
        self.session = TrainingSession(
            self.model,
            self.optimizer,
            extra_state={"data": self.data},
            checkpoint_uri=uri,
            job_id=job_id,
            control_dir=control_dir,
            local_dir=local_dir,
            **session_kwargs,
        )

    def train_step(self) -> None:
        import random

        import torch

        g = torch.Generator().manual_seed(self.data.position)
        self.data.position += 1
        x = torch.randn(4, 8, generator=g)
        loss = self.model(x).pow(2).mean() * (1 + random.random())
        self.optimizer.zero_grad()
        loss.backward()
        self.optimizer.step()

    def run(self, until: int) -> int:
        start = self.session.restore()
        for step in range(start, until):
            self.train_step()
            self.session.step_done(step + 1)
        self.session.finish()
        return start

    def weights(self) -> dict:
        return {k: v.detach().clone() for k, v in self.model.state_dict().items()}


@pytest.fixture
def tiny_job():
    return TinyJob
