"""S3 checkpoint readers on one local S3 endpoint, in one run: how a restore should fetch a step.

    .venv/bin/python benchmarks/bench_s3_readers.py [--size-mb 256] [--reps 3] [--concurrency 32] [--range-mb 64]

One committed checkpoint (weights + AdamW moments, saved by ``TrainingSession`` to
``s3://bench-checkpoints/ckpt``) is read back with each reader, round-robin so that drift on a
shared machine hits all of them alike. MB/s are of the step's bytes (10**6 bytes per second):

* ``boto3_download``: the S3 tier's ``download_step`` (boto3's managed transfer: ranged GETs of
  64 MiB parts, 32 at a time) into a local directory, which restore then verifies and loads.
* ``gpucloud_restore``: ``gpucloud.checkpoint.load`` end to end from S3 into the model: download,
  XXH3 of every file, load (what a resume on a fresh node does).
* ``ranged_get_memory``: parallel ranged GETs (``--range-mb``) of every file straight into preallocated
  memory, no disk: the transport's ceiling for a reader that fills the tensors in place.
* ``s3torchconnector``: AWS's DCP reader ``S3StorageReader`` loading the step straight into the
  model's tensors (its own ranged GETs through the CRT).

One moto server on 127.0.0.1 (tests/moto_process.py) stands in for S3: moto is a Python process,
and on a 2-core machine it is the ceiling; the figures compare the clients against one emulator,
not against S3. Needs the test extra (moto) and the s3 extra.

Writes ``benchmarks/results/s3-readers.json``.
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(1, str(ROOT / "tests"))

from tests.conftest import FAKE_AWS, moto_endpoint  # noqa: E402

from bench_checkpoint import build  # noqa: E402
from report import config_of, finish  # noqa: E402  (benchmarks/report.py)

RESULTS = ROOT / "benchmarks" / "results" / "s3-readers.json"
BUCKET = "bench-checkpoints"
PREFIX = "ckpt"
JOB = "bench"
REGION = FAKE_AWS["AWS_DEFAULT_REGION"]


def ranged_get_into_memory(client, keys: dict[str, int], concurrency: int, range_bytes: int) -> int:
    """Every object fetched with parallel ranged GETs into one preallocated buffer per object."""
    buffers = {key: bytearray(size) for key, size in keys.items()}
    jobs = [
        (key, start, min(start + range_bytes, size))
        for key, size in keys.items()
        for start in range(0, size, range_bytes)
    ]

    def fetch(job: tuple[str, int, int]) -> int:
        key, start, end = job
        body = client.get_object(Bucket=BUCKET, Key=key, Range=f"bytes={start}-{end - 1}")["Body"]
        view = memoryview(buffers[key])[start:end]
        done = 0
        while done < view.nbytes:
            chunk = body.read(min(1024 * 1024, view.nbytes - done))
            if not chunk:
                raise OSError(f"{key}: short ranged GET at {start + done}")
            view[done : done + len(chunk)] = chunk
            done += len(chunk)
        return done

    with ThreadPoolExecutor(max_workers=concurrency) as pool:
        return sum(pool.map(fetch, jobs))


def s3torch_load(model, optimizer, step_uri: str) -> None:
    import torch.distributed.checkpoint as dcp
    from s3torchconnector import S3ClientConfig
    from s3torchconnector.dcp import S3StorageReader

    from gpucloud.checkpoint import state

    target = state.capture(model, optimizer, {}, rank=0, step=0)
    target.pop("rng")
    target.pop("extra")
    reader = S3StorageReader(REGION, step_uri, s3client_config=S3ClientConfig(force_path_style=True))
    dcp.load(target, storage_reader=reader, no_dist=True)
    state.apply_weights(target, model, optimizer, {}, source_rank=0)


def run(args: argparse.Namespace) -> dict:
    model, optimizer, nbytes = build(args.size_mb)
    times: dict[str, list[float]] = {}
    errors: dict[str, str] = {}

    def timed(name: str, fn: Callable[[], object]) -> None:
        if name in errors:
            return
        start = time.perf_counter()
        try:
            fn()
        except Exception as exc:  # noqa: BLE001  (a reader that cannot talk to the emulator: report why)
            errors[name] = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
            return
        times.setdefault(name, []).append(time.perf_counter() - start)

    with tempfile.TemporaryDirectory(prefix="bench-s3r-", dir=args.dir) as tmp, moto_endpoint() as endpoint:
        os.environ.update({**FAKE_AWS, "AWS_ENDPOINT_URL": endpoint, "GPUCLOUD_S3_UPLOADER": "boto3"})
        import boto3
        from botocore.config import Config

        from gpucloud.checkpoint import TrainingSession
        from gpucloud.checkpoint import load as gpucloud_load
        from gpucloud.checkpoint.manifest import Manifest
        from gpucloud.checkpoint.store import CheckpointStore

        boto3.client("s3").create_bucket(Bucket=BUCKET)
        scratch = Path(tmp)
        uri = f"s3://{BUCKET}/{PREFIX}"
        sess = TrainingSession(model, optimizer, checkpoint_uri=uri, job_id=JOB, local_dir=str(scratch / "save"))
        sess.restore()
        sess.save_now(1)
        sess.finish()
        shutil.rmtree(scratch / "save")
        store = CheckpointStore(uri, JOB, local_dir=str(scratch / "unused"))
        tier = store.durable
        raw = tier.read_manifest_bytes(JOB, 1)
        manifest = Manifest.parse(raw, "bench")
        step_bytes = manifest.total_bytes
        keys = {f"{PREFIX}/{JOB}/step-1/{e.name}": e.size for e in manifest.files}
        client = boto3.client("s3", config=Config(max_pool_connections=args.concurrency + 4))
        for rep in range(args.reps):
            target = scratch / f"download-{rep}"
            timed("boto3_download", lambda t=target: tier.download_step(JOB, 1, manifest, raw, t))
            shutil.rmtree(target, ignore_errors=True)
            local = scratch / f"restore-{rep}"
            timed(
                "gpucloud_restore", lambda d=local: gpucloud_load(uri, model, optimizer, job_id=JOB, local_dir=str(d))
            )
            shutil.rmtree(local, ignore_errors=True)
            timed(
                "ranged_get_memory",
                lambda: ranged_get_into_memory(client, keys, args.concurrency, args.range_mb * 1024 * 1024),
            )
            timed("s3torchconnector", lambda: s3torch_load(model, optimizer, f"{uri}/{JOB}/step-1"))
    mbps = {name: round(step_bytes / statistics.median(ts) / 1e6, 1) for name, ts in times.items()}
    best = {name: round(step_bytes / min(ts) / 1e6, 1) for name, ts in times.items()}
    fetchers = {k: v for k, v in mbps.items() if k in ("boto3_download", "ranged_get_memory", "s3torchconnector")}
    return {
        "benchmark": "s3-readers",
        "config": config_of(
            args,
            python=platform.python_version(),
            torch=torch.__version__,
            cpus=os.cpu_count(),
            endpoint="moto server on 127.0.0.1 (tests/moto_process.py)",
        ),
        "seconds": {k: [round(t, 3) for t in v] for k, v in times.items()},
        "summary": {
            "step_mb": round(step_bytes / 1e6, 1),
            "state_mb": round(nbytes / 1e6, 1),
            "mb_per_s": mbps,
            "best_mb_per_s": best,
            "errors": errors,
            "fastest_fetch": max(fetchers, key=lambda k: fetchers[k]) if fetchers else None,
        },
        "goals_met": {"every_reader_ran": not errors},
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size-mb", type=int, default=256, help="state size in MB (default 256)")
    parser.add_argument("--reps", type=int, default=3, help="repetitions per reader, round-robin (default 3)")
    parser.add_argument("--concurrency", type=int, default=32, help="parallel ranged GETs (default 32, as boto3's)")
    parser.add_argument("--range-mb", type=int, default=64, help="bytes per ranged GET, MiB (default 64, as boto3's)")
    parser.add_argument("--dir", type=Path, default=None, help="scratch directory (default: the system temp dir)")
    parser.add_argument("--out", type=Path, default=RESULTS, help=f"report path (default {RESULTS})")
    args = parser.parse_args()
    return finish(args.out, run(args))


if __name__ == "__main__":
    sys.exit(main())
