"""Helpers for the checkpoint tests: launching real multi-rank jobs of trainer.py, moto."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from helpers.tiny_job import TinyJob

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


@pytest.fixture
def tiny_job():
    return TinyJob
