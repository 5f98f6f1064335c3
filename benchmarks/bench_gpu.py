"""The checkpoint path on a real GPU: periodic-save stall, emergency save, restore and the per-step agreement.

    python benchmarks/bench_gpu.py [--state-gb 10] [--dir /local/disk/dir] [--out results.json]

Run it on a GPU host with that host's CUDA build of torch (``--device cpu`` with a small ``--state-gb``
runs the same code on a laptop, to check the script itself). One process, one GPU, one rank of a
real process group: NCCL for the training group (the per-step agreement), gloo for checkpoint
coordination, as under torchrun on a node. Everything is measured in the same run on the same disk
and reported beside its baseline, as ratios:

* ``periodic``: how much wall time the training loop loses to one periodic save, from the save's start
  until it is committed (the loop keeps training meanwhile): gpucloud's asynchronous save (pinned
  staging buffers reused from save to save, parameters copied while the next forward/backward runs)
  against ``torch.distributed.checkpoint.async_save`` with its cached pinned staging
  (``FileSystemWriter(cache_staged_state_dict=True)``) and a synchronous ``dcp.save``. Each method
  saves once to warm its buffers, then once measured. Stall = loop time over the save's window minus
  the same number of steps at the median step time without a save.
* ``emergency``: the notice's synchronous save from GPU memory (``TrainingSession.save_now``: DCP
  files, XXH3 of every byte, manifest, LATEST, all fsync'ed) in GB/s against a raw sequential write of
  the same number of bytes (buffered + fsync, and O_DIRECT) and against ``torch.save`` + fsync.
* ``restore``: a new session's ``restore()`` (manifest verified, tensors back on the GPU) against a
  raw sequential read of the same files and DCP's own ``dcp.load``, with the page cache dropped first
  where the host allows it (else each file is evicted with ``posix_fadvise(DONTNEED)``).
* ``agreement``: ``step_done`` on the NCCL group (one all_reduce + reading its result) in microseconds,
  and a training step with and without a ``TrainingSession``, on a small and on the full model.

Every phase is written to ``--out`` as soon as it ends, so a run cut short still reports what it did.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import mmap
import os
import platform
import shutil
import socket
import statistics
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import FileSystemReader, FileSystemWriter
from torch.distributed.checkpoint.state_dict import get_state_dict

from gpucloud import control
from gpucloud.checkpoint import TrainingSession

GB = 1e9
WRITE_CHUNK = 64 * 1024 * 1024  # raw write/read block: large enough that syscalls cost nothing
PHASES = ("agreement", "emergency", "restore", "periodic", "periodic_causes")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--state-gb", type=float, default=10.0, help="parameters + AdamW moments, GB")
    parser.add_argument("--width", type=int, default=8192, help="width of the square Linear layers")
    parser.add_argument("--batch", type=int, default=16, help="rows per training step")
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    parser.add_argument("--dir", type=Path, default=Path("/tmp/gpucloud-bench-gpu"), help="local disk directory")
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "results" / "gpu.json")
    parser.add_argument("--threads", type=int, default=8, help="writer threads for gpucloud and DCP alike")
    parser.add_argument(
        "--phases", default="agreement,emergency,restore,periodic", help="in this order (restore needs emergency)"
    )
    args = parser.parse_args(argv)
    phases = args.phases.split(",")
    unknown = [p for p in phases if p not in PHASES]
    if unknown:
        parser.error(f"--phases: unknown phase {unknown[0]!r}; choose from {', '.join(PHASES)}")

    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print("no CUDA device: run on a GPU host, or pass --device cpu for a dry run", file=sys.stderr)
        return 2
    shutil.rmtree(args.dir, ignore_errors=True)
    args.dir.mkdir(parents=True)
    report: dict[str, Any] = {"machine": machine(device, args.dir), "config": vars(args) | {"dir": str(args.dir)}}
    report["config"]["out"] = str(args.out)

    def record(name: str, fn: Callable[[], dict[str, Any]]) -> None:
        started = time.monotonic()
        try:
            report[name] = fn()
        except Exception as exc:  # noqa: BLE001 - one phase failing must not lose the others' figures
            report[name] = {"error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()}
        report[name]["phase_s"] = round(time.monotonic() - started, 2)
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(report, indent=2, default=str) + "\n")
        print(f"[{name}] {json.dumps(summary(report[name]), default=str)}", flush=True)

    init_process_group(device)
    bench = Bench(args, device)
    report["state"] = bench.describe()
    for phase in phases:
        record(phase, getattr(bench, phase))
    shutil.rmtree(args.dir, ignore_errors=True)
    dist.destroy_process_group()
    print(json.dumps({k: summary(v) for k, v in report.items() if isinstance(v, dict)}, indent=1, default=str))
    return 0


def summary(phase: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in phase.items() if k != "traceback" and not isinstance(v, (list, dict))}


def machine(device: torch.device, directory: Path) -> dict[str, Any]:
    info: dict[str, Any] = {
        "host": platform.node(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cpus": os.cpu_count(),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "disk": shutil.disk_usage(directory)._asdict(),
        "filesystem": _filesystem_of(directory),
    }
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        info |= {"gpu": props.name, "gpu_memory_gib": round(props.total_memory / 2**30, 1)}
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            smi = subprocess.run(
                ["nvidia-smi", "--query-gpu=driver_version,pci.bus_id", "--format=csv,noheader"],
                capture_output=True,
                text=True,
                timeout=30,
            )
            info["driver"], info["pci_bus_id"] = (s.strip() for s in smi.stdout.strip().split(",", 1))
        info["nccl"] = ".".join(str(v) for v in torch.cuda.nccl.version())
    return info


def _filesystem_of(directory: Path) -> str:
    best = ("", "")
    with contextlib.suppress(OSError):
        for line in Path("/proc/mounts").read_text().splitlines():
            fields = line.split()
            if len(fields) > 2 and str(directory).startswith(fields[1]) and len(fields[1]) >= len(best[0]):
                best = (fields[1], f"{fields[2]} on {fields[1]} ({fields[0]})")
    return best[1]


def init_process_group(device: torch.device) -> None:
    """One rank of a real process group: NCCL on a GPU (the backend torchrun jobs use), gloo otherwise."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK="0", WORLD_SIZE="1", LOCAL_RANK="0")
    if device.type == "cuda":
        torch.cuda.set_device(0)
        dist.init_process_group("nccl", device_id=torch.device("cuda", 0))
    else:
        dist.init_process_group("gloo")


class Bench:
    def __init__(self, args: argparse.Namespace, device: torch.device) -> None:
        self.args = args
        self.device = device
        self.cuda = device.type == "cuda"
        width = args.width
        per_layer = width * width * 4 * 3  # fp32 weights + AdamW's two fp32 moments
        layers = max(1, round(args.state_gb * GB / per_layer))
        torch.manual_seed(0)
        self.model = torch.nn.Sequential(
            *[torch.nn.Linear(width, width, bias=False, device=device) for _ in range(layers)]
        )
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=1e-6, fused=self.cuda)
        self.inputs = torch.randn(args.batch, width, device=device)
        self.step()  # materialises AdamW's moments
        self.sync()
        self.nbytes = sum(t.numel() * t.element_size() for t in self.tensors())
        # Checkpoint coordination runs on gloo, as TrainingSession's own group does.
        self.gloo = dist.new_group(backend="gloo")
        self.baseline_s = self.median_step(steps=20)

    def describe(self) -> dict[str, Any]:
        return {
            "layers": len(self.model),
            "width": self.args.width,
            "parameters": sum(p.numel() for p in self.model.parameters()),
            "bytes": self.nbytes,
            "gb": round(self.nbytes / GB, 3),
            "dtype": "fp32 weights and AdamW moments, bf16 autocast forward" if self.cuda else "fp32",
            "median_step_ms": round(self.baseline_s * 1e3, 3),
        }

    # ------------------------------------------------------------------ training
    def tensors(self) -> list[torch.Tensor]:
        out = [p.detach() for p in self.model.parameters()]
        for st in self.optimizer.state.values():
            out += [v for v in st.values() if isinstance(v, torch.Tensor) and v.dim() > 0]
        return out

    def step(self) -> None:
        with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.cuda):
            loss = self.model(self.inputs).float().pow(2).mean()
        loss.backward()
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)

    def sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize()

    def median_step(self, *, steps: int, after: Callable[[int], None] | None = None) -> float:
        times = []
        for i in range(steps):
            t0 = time.perf_counter()
            self.step()
            if after is not None:
                after(i)
            self.sync()
            times.append(time.perf_counter() - t0)
        return statistics.median(times)

    def session(self, job: str, **kwargs: Any) -> TrainingSession:
        sess = TrainingSession(
            self.model,
            self.optimizer,
            checkpoint_uri=str(self.args.dir / "durable"),
            job_id=job,
            control_dir=str(self.args.dir / f"control-{job}"),
            writer_threads=self.args.threads,
            keep_last=1,
            **kwargs,
        )
        Path(sess.control_dir or "").mkdir(parents=True, exist_ok=True)
        return sess

    def dcp_state(self) -> dict[str, Any]:
        model_sd, optim_sd = get_state_dict(self.model, self.optimizer)
        return {"model": model_sd, "optim": optim_sd}

    def window(self, start: Callable[[], None], done: Callable[[], bool], baseline: float, *, between=None) -> dict:
        """Start a save, keep training until it is committed (and 3 steps more); the time lost."""
        self.sync()
        t0 = time.perf_counter()
        start()
        steps = 0
        finished_at = None
        while finished_at is None or steps < 3:
            self.step()
            if between is not None:
                between(steps)
            self.sync()
            steps += 1
            if finished_at is None and done():
                finished_at = time.perf_counter()
            if steps > 100_000:
                raise RuntimeError("the save never finished")
        total = time.perf_counter() - t0
        return {
            "stall_s": round(max(0.0, total - steps * baseline), 4),
            "save_s": round((finished_at or total) - t0, 3),
            "steps_during": steps,
        }

    # ------------------------------------------------------------------ periodic
    def periodic(self) -> dict[str, Any]:
        out: dict[str, Any] = {"bytes": self.nbytes}
        out["gpucloud_async"] = self._periodic_gpucloud()
        out["dcp_async_cached_pinned"] = self._periodic_dcp_async()
        out["dcp_sync"] = self._periodic_dcp_sync()
        sync_stall = out["dcp_sync"]["stall_s"]
        for name in ("gpucloud_async", "dcp_async_cached_pinned"):
            if "stall_s" in out[name] and sync_stall:
                out[f"{name}_stall_vs_sync"] = round(out[name]["stall_s"] / sync_stall, 4)
        if out["dcp_async_cached_pinned"].get("stall_s"):
            out["gpucloud_stall_vs_dcp_async"] = round(
                out["gpucloud_async"]["stall_s"] / out["dcp_async_cached_pinned"]["stall_s"], 4
            )
        return out

    def _periodic_gpucloud(self) -> dict[str, Any]:
        saves = _SessionSaves(self, "periodic")
        measured = []
        for _ in range(2):  # the first save allocates the pinned buffers; the second reuses them
            measured.append(saves.save(per_step=True))
            measured[-1]["session_stall_s"] = round(saves.sess.history.stall_seconds or 0.0, 4)
        saves.sess.finish()
        shutil.rmtree(self.args.dir / "durable" / "periodic", ignore_errors=True)
        return {"first": measured[0], **measured[1], "baseline_step_ms": round(saves.baseline * 1e3, 3)}

    def _periodic_dcp_async(self) -> dict[str, Any]:
        # DCP's cached staging pins its buffers, which needs a GPU; on a CPU dry run it stages uncached.
        writer = FileSystemWriter(
            self.args.dir / "dcp-async-0", thread_count=self.args.threads, cache_staged_state_dict=self.cuda
        )
        state = self.dcp_state()
        measured = []
        for i in range(2):
            future: list[Any] = []
            path = self.args.dir / f"dcp-async-{i}"

            def start(path: Path = path, future: list[Any] = future) -> None:
                future.append(dcp.async_save(state, checkpoint_id=path, storage_writer=writer, process_group=self.gloo))

            measured.append(self.window(start, lambda future=future: _done(future[0]), self.baseline_s))
            _result(future[0])
        for i in range(2):
            shutil.rmtree(self.args.dir / f"dcp-async-{i}", ignore_errors=True)
        return {"first": measured[0], **measured[1]}

    def _periodic_dcp_sync(self) -> dict[str, Any]:
        state = self.dcp_state()
        path = self.args.dir / "dcp-sync"

        def start() -> None:
            dcp.save(
                state,
                storage_writer=FileSystemWriter(path, thread_count=self.args.threads),
                process_group=self.gloo,
            )

        result = self.window(start, lambda: True, self.baseline_s)
        shutil.rmtree(path, ignore_errors=True)
        return result

    def periodic_causes(self) -> dict[str, Any]:
        """Where the training time lost to gpucloud's periodic save goes: the same session's measured
        save as shipped, then with one suspect removed at a time (per-step step_done, the inline hash,
        the writer threads); DCP's async save beside it."""
        from gpucloud.checkpoint import dcp_io

        saves = _SessionSaves(self, "causes")
        sess, save, step = saves.sess, saves.save, saves.step
        baseline_with = saves.baseline

        out: dict[str, Any] = {"warm_up": save(per_step=True)}
        out["shipped"] = save(per_step=True)
        out["no_step_done_during_save"] = save(per_step=False)
        real_hasher = dcp_io.new_hasher
        dcp_io.new_hasher = _NoHash  # type: ignore[assignment]
        try:
            out["no_hash"] = save(per_step=True)
        finally:
            dcp_io.new_hasher = real_hasher  # type: ignore[assignment]
        sess.writer_threads = 1
        out["one_writer_thread"] = save(per_step=True)
        sess.writer_threads = self.args.threads
        # The notice's save once periodic saves have warmed the pinned buffers (the common case).
        self.step()
        self.sync()
        t0 = time.perf_counter()
        manifest = sess.save_now(step[0] + 1)
        seconds = time.perf_counter() - t0
        assert manifest is not None
        out["emergency_warm_staging"] = {"s": round(seconds, 3), "gbps": round(manifest.total_bytes / seconds / GB, 3)}
        out["raw_write_buffered"] = self._raw_write(self.args.dir / "raw.bin", direct=False)
        (self.args.dir / "raw.bin").unlink()
        out["emergency_warm_vs_raw"] = round(
            out["emergency_warm_staging"]["gbps"] / out["raw_write_buffered"]["gbps"], 3
        )
        sess.finish()
        shutil.rmtree(self.args.dir / "durable" / "causes", ignore_errors=True)
        out["dcp_async_cached_pinned"] = self._periodic_dcp_async()
        out["baseline_step_ms"] = round(self.baseline_s * 1e3, 3)
        out["baseline_with_step_done_ms"] = round(baseline_with * 1e3, 3)
        return out

    # ------------------------------------------------------------------ emergency
    def emergency(self) -> dict[str, Any]:
        out: dict[str, Any] = {"bytes": self.nbytes}
        out["raw_write_buffered"] = self._raw_write(self.args.dir / "raw.bin", direct=False)
        with contextlib.suppress(OSError):
            out["raw_write_o_direct"] = self._raw_write(self.args.dir / "raw-direct.bin", direct=True)
        out["dd"] = self._dd(self.args.dir / "dd.bin")
        sess = self.session("emergency", every_steps=10**9)
        sess.restore()
        self.step()
        self.sync()
        t0 = time.perf_counter()
        manifest = sess.save_now(1)  # what a notice runs: synchronous, from GPU memory, durable commit
        seconds = time.perf_counter() - t0
        sess.finish()
        assert manifest is not None
        out["gpucloud_save_now"] = {"s": round(seconds, 3), "gbps": round(manifest.total_bytes / seconds / GB, 3)}
        out["gpucloud_bytes"] = manifest.total_bytes
        state = self.dcp_state()
        t0 = time.perf_counter()
        with open(self.args.dir / "torch-save.pt", "wb") as f:
            torch.save(state, f)
            f.flush()
            os.fsync(f.fileno())
        seconds = time.perf_counter() - t0
        out["torch_save"] = {"s": round(seconds, 3), "gbps": round(self.nbytes / seconds / GB, 3)}
        raw = out["raw_write_buffered"]["gbps"]
        best_raw = max(raw, out.get("raw_write_o_direct", {}).get("gbps", 0.0))
        out["gpucloud_vs_raw"] = round(out["gpucloud_save_now"]["gbps"] / raw, 3)
        out["gpucloud_vs_best_raw"] = round(out["gpucloud_save_now"]["gbps"] / best_raw, 3)
        out["torch_save_vs_raw"] = round(out["torch_save"]["gbps"] / raw, 3)
        out["gpucloud_vs_torch_save"] = round(out["gpucloud_save_now"]["gbps"] / out["torch_save"]["gbps"], 3)
        for name in ("raw.bin", "raw-direct.bin", "dd.bin"):
            (self.args.dir / name).unlink(missing_ok=True)
        return out

    def _raw_write(self, path: Path, *, direct: bool) -> dict[str, Any]:
        block = mmap.mmap(-1, WRITE_CHUNK)  # page-aligned, as O_DIRECT needs
        block.write(os.urandom(1 << 20) * (WRITE_CHUNK >> 20))
        flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | (os.O_DIRECT if direct else 0)
        fd = os.open(path, flags, 0o644)
        t0 = time.perf_counter()
        try:
            written = 0
            while written < self.nbytes:
                written += os.write(fd, block)
            os.fsync(fd)
        finally:
            os.close(fd)
        seconds = time.perf_counter() - t0
        return {"s": round(seconds, 3), "gbps": round(written / seconds / GB, 3)}

    def _dd(self, path: Path) -> dict[str, Any]:
        count = max(1, round(self.nbytes / WRITE_CHUNK))
        t0 = time.perf_counter()
        proc = subprocess.run(
            ["dd", "if=/dev/zero", f"of={path}", "bs=64M", f"count={count}", "oflag=direct", "conv=fsync"],
            capture_output=True,
            text=True,
        )
        seconds = time.perf_counter() - t0
        if proc.returncode != 0:
            return {"error": proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else f"exit {proc.returncode}"}
        return {"s": round(seconds, 3), "gbps": round(count * WRITE_CHUNK / seconds / GB, 3), "source": "/dev/zero"}

    # ------------------------------------------------------------------ restore
    def restore(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        job_dir = self.args.dir / "durable" / "emergency"
        if not job_dir.exists():
            raise RuntimeError("restore needs the emergency phase's checkpoint (run it first)")
        files = sorted(p for p in job_dir.rglob("*") if p.is_file())
        out["cache_drop"] = drop_caches(files)
        out["raw_read"] = self._raw_read(files)
        out["cache_drop"] = drop_caches(files)
        sess = self.session("emergency", every_steps=10**9)
        for p in self.model.parameters():  # the restore must really put the bytes back
            p.data.zero_()
        t0 = time.perf_counter()
        step = sess.restore()
        self.sync()
        seconds = time.perf_counter() - t0
        sess.finish()
        nbytes = sum(p.stat().st_size for p in files)
        out["gpucloud_restore"] = {"s": round(seconds, 3), "gbps": round(nbytes / seconds / GB, 3), "step": step}
        out["restored_nonzero"] = bool(any(p.detach().abs().sum().item() > 0 for p in self.model.parameters()))
        # DCP's own load of the same files (the step directory is a DCP checkpoint), caches dropped again
        step_dir = next(p for p in job_dir.iterdir() if p.is_dir() and p.name.startswith("step-"))
        drop_caches(files)
        state = self.dcp_state()
        t0 = time.perf_counter()
        dcp.load(state, storage_reader=FileSystemReader(step_dir), process_group=self.gloo)
        self.sync()
        seconds = time.perf_counter() - t0
        out["dcp_load"] = {"s": round(seconds, 3), "gbps": round(nbytes / seconds / GB, 3)}
        torch_file = self.args.dir / "torch-save.pt"
        if torch_file.exists():
            drop_caches([torch_file])
            t0 = time.perf_counter()
            loaded = torch.load(torch_file, map_location=self.device, weights_only=True)
            self.sync()
            seconds = time.perf_counter() - t0
            del loaded
            out["torch_load"] = {"s": round(seconds, 3), "gbps": round(torch_file.stat().st_size / seconds / GB, 3)}
            torch_file.unlink()
        raw = out["raw_read"]["gbps"]
        out["gpucloud_vs_raw_read"] = round(out["gpucloud_restore"]["gbps"] / raw, 3)
        out["gpucloud_vs_dcp_load"] = round(out["gpucloud_restore"]["gbps"] / out["dcp_load"]["gbps"], 3)
        out["bytes"] = nbytes
        shutil.rmtree(self.args.dir / "durable", ignore_errors=True)
        return out

    def _raw_read(self, files: list[Path]) -> dict[str, Any]:
        block = bytearray(WRITE_CHUNK)
        view = memoryview(block)
        total = 0
        t0 = time.perf_counter()
        for path in files:
            with open(path, "rb", buffering=0) as f:
                while n := f.readinto(view):
                    total += n
        seconds = time.perf_counter() - t0
        return {"s": round(seconds, 3), "gbps": round(total / seconds / GB, 3), "bytes": total}

    # ------------------------------------------------------------------ agreement
    def agreement(self) -> dict[str, Any]:
        out: dict[str, Any] = {"backend": str(dist.get_backend())}
        sess = self.session("agreement", every_steps=10**9)
        sess.restore()
        n = 2000
        for i in range(50):
            sess.step_done(i + 1)
        self.sync()
        t0 = time.perf_counter()
        for i in range(n):
            sess.step_done(51 + i)
        self.sync()
        out["step_done_us"] = round((time.perf_counter() - t0) / n * 1e6, 2)
        counter = [51 + n]

        def with_session() -> None:
            counter[0] += 1
            sess.step_done(counter[0])

        small = torch.nn.Linear(1024, 1024).to(self.device)
        small_opt = torch.optim.AdamW(small.parameters(), lr=1e-6)
        small_x = torch.randn(64, 1024, device=self.device)

        def small_step() -> None:
            small(small_x).pow(2).mean().backward()
            small_opt.step()
            small_opt.zero_grad(set_to_none=True)

        out["small_model"] = self._with_without(small_step, with_session, steps=500)
        out["full_model"] = self._with_without(self.step, with_session, steps=30)
        sess.finish()
        return out

    def _with_without(self, step: Callable[[], None], step_done: Callable[[], None], *, steps: int) -> dict:
        """Loop time per step with no synchronisation inside the loop (as real loops run), median of 3."""

        def timed(extra: Callable[[], None] | None) -> float:
            for _ in range(5):
                step()
            self.sync()
            t0 = time.perf_counter()
            for _ in range(steps):
                step()
                if extra is not None:
                    extra()
            self.sync()
            return (time.perf_counter() - t0) / steps

        without = statistics.median(timed(None) for _ in range(3))
        with_ = statistics.median(timed(step_done) for _ in range(3))
        return {
            "without_us": round(without * 1e6, 1),
            "with_us": round(with_ * 1e6, 1),
            "overhead_us": round((with_ - without) * 1e6, 1),
            "ratio": round(with_ / without, 4),
        }


class _SessionSaves:
    """A TrainingSession trained step by step (``step_done`` after each), and its periodic saves started
    on demand (the supervisor's ``save`` request, as a rebalance recommendation starts one)."""

    def __init__(self, bench: Bench, job: str) -> None:
        self.bench = bench
        self.sess = bench.session(job, every_steps=10**9)
        self.sess.restore()
        self.step = [0]
        self.baseline = bench.median_step(steps=10, after=self.after)  # steps with step_done, no save due

    def after(self, _: int) -> None:
        self.step[0] += 1
        self.sess.step_done(self.step[0])

    def save(self, *, per_step: bool) -> dict[str, Any]:
        """One save's window; ``per_step=False`` trains without ``step_done`` until it is committed."""
        sess, target = self.sess, self.step[0] + 1

        def start() -> None:
            control.write(sess.control_dir or "", control.SAVE, {"reason": "benchmark"})
            self.bench.step()
            self.step[0] = target
            sess.step_done(target)

        if per_step:
            return self.bench.window(start, lambda: sess.last_committed == target, self.baseline, between=self.after)
        pending = sess._pending  # the benchmark watches the save it started

        def done() -> bool:
            nonlocal pending
            pending = pending or sess._pending
            return pending is not None and pending.future is not None and pending.future.done()

        result = self.bench.window(start, done, self.bench.baseline_s)
        sess.wait()
        return result


class _NoHash:
    """Stands in for XXH3 in the ``periodic_causes`` phase only (the manifest it writes is not valid)."""

    def update(self, data: Any) -> None:
        pass

    def hexdigest(self) -> str:
        return "0" * 16


def _done(future: Any) -> bool:
    inner = getattr(future, "upload_completion", future)
    return bool(inner.done())


def _result(future: Any) -> Any:
    return getattr(future, "upload_completion", future).result()


def drop_caches(files: list[Path]) -> str:
    """Empty the page cache (root on a host that allows it), else evict each file."""
    os.sync()
    try:
        Path("/proc/sys/vm/drop_caches").write_text("3\n")
        return "drop_caches"
    except OSError:
        for path in files:
            fd = os.open(path, os.O_RDONLY)
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)
        return "posix_fadvise"


if __name__ == "__main__":
    sys.exit(main())
