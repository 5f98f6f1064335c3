"""Checkpoint benchmarks: save and restore against the disk, DCP and torch.save; async stall.

    .venv/bin/python benchmarks/bench_checkpoint.py [--size-mb 1000] [--reps 3] [--dir DIR]
        [--skip-async] [--profile]

Everything is measured in the same run on the same disk, and reported as ratios (absolute GB/s
on a shared virtual disk are noisy; ratios against a baseline taken minutes apart are not).
Writers and readers are interleaved within each repetition so that all see the same disk.

Save (every file fsync'ed by every writer):

* ``raw``: the tensors' bytes written sequentially to one file with one ``write`` loop, then
  ``fsync`` (``dd conv=fsync``); ``raw_writeback``: the same with each tensor's writeback started
  as it is written (what gpucloud's writer does), to show how much of the gain is that alone.
* ``gpucloud``: a full checkpoint save (DCP write + inline XXH3 + manifest + rename + LATEST);
  ``dcp_t1`` / ``dcp_t8``: DCP's ``FileSystemWriter`` with 1 (its default) / 8 threads;
  ``torch_save``: ``torch.save`` of the state dict to one file, then ``fsync``.
  ``save_vs_raw`` = raw seconds / gpucloud seconds (medians). Goal >= 0.95.

Restore (each reader's files evicted from the page cache first, ``posix_fadvise(DONTNEED)``):

* ``raw_read``: the raw file read sequentially; ``dcp``: ``dcp.load`` with DCP's
  ``FileSystemReader``; ``torch_load``: ``torch.load`` of the ``torch.save`` file (skipped above
  4 GB: it allocates a second copy of the state);
* ``gpucloud_verified``: ``gpucloud.checkpoint.load`` (LATEST, manifest, every file's XXH3, then
  the tensors); ``gpucloud_unverified``: the same step loaded without the XXH3 checks.
  ``restore_vs_dcp`` = DCP seconds / gpucloud verified seconds. Goal >= 1.

``stall_vs_sync``: how long an asynchronous periodic save blocks the training loop (inside
``step_done`` plus any wait in ``optimizer.step()`` for the background copy) against the time a
synchronous save of the same state takes. Goal <= 0.01.

``--profile`` adds where a gpucloud save's time goes (summed over writer threads: torch.save
framing, write(), hash, fsync; and the commit's phases), against the same raw write.

Writes ``benchmarks/results/checkpoint.json`` (``checkpoint-<size>mb.json`` with ``--size-mb``).
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed.checkpoint as dcp

from gpucloud.checkpoint import TrainingSession, dcp_io
from gpucloud.checkpoint import load as gpucloud_load
from gpucloud.checkpoint.store import CheckpointStore

RESULTS_DIR = Path(__file__).resolve().parent / "results"
TORCH_LOAD_MAX_BYTES = 4 * 10**9


def build(size_mb: int) -> tuple[torch.nn.Module, torch.optim.Optimizer, int]:
    """A model whose parameters + AdamW moments total about ``size_mb`` MB."""
    width = 2048
    params_wanted = size_mb * 1e6 / 4 / 3  # fp32 weights + two fp32 moments
    layers = max(1, round(params_wanted / (width * width)))
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(width, width) for _ in range(layers)])
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    train_step(model, optimizer)  # materialise the optimizer state
    optimizer.zero_grad(set_to_none=True)  # the gradients are not part of a checkpoint
    nbytes = sum(t.numel() * t.element_size() for t in _tensors(model, optimizer))
    return model, optimizer, nbytes


def _tensors(model, optimizer) -> list[torch.Tensor]:
    out = [p.detach() for p in model.parameters()]
    for st in optimizer.state.values():
        out += [v for v in st.values() if isinstance(v, torch.Tensor)]
    return out


def train_step(model, optimizer) -> None:
    x = torch.randn(32, model[0].in_features)
    loss = model(x).pow(2).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()


def raw_write(tensors: list[torch.Tensor], path: Path, *, writeback: bool = False) -> float:
    """Sequentially write the tensors' bytes to one file and fsync: the disk's baseline."""
    start = time.perf_counter()
    with open(path, "wb", buffering=0) as fh:
        offset = 0
        for t in tensors:
            view = memoryview(t.contiguous().reshape(-1).view(torch.uint8).numpy())
            fh.write(view)
            if writeback:
                _start_writeback(fh.fileno(), offset, view.nbytes)
            offset += view.nbytes
        os.fsync(fh.fileno())
    return time.perf_counter() - start


def _start_writeback(fd: int, offset: int, nbytes: int) -> None:
    # getattr: the same script profiles the code before the writer started writeback early.
    start = getattr(dcp_io, "start_writeback", None)
    if start is not None:
        start(fd, offset, nbytes)


def raw_read(path: Path) -> float:
    buf = bytearray(16 * 1024 * 1024)
    start = time.perf_counter()
    with open(path, "rb", buffering=0) as fh:
        while fh.readinto(buf):
            pass
    return time.perf_counter() - start


def evict(path: Path) -> None:
    """Drop a file's (or a directory's files') clean pages from the page cache, so the next read
    comes from the disk. Needs no privileges, unlike drop_caches."""
    files = [path] if path.is_file() else [p for p in path.rglob("*") if p.is_file()]
    for file in files:
        fd = os.open(file, os.O_RDONLY)
        try:
            os.fdatasync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def timed(fn: Callable[[], Any]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def median(xs: list[float]) -> float:
    return statistics.median(xs)


def state_dict_of(model, optimizer) -> dict[str, Any]:
    return {"model": model.state_dict(), "optim": optimizer.state_dict()}


class SaveProfile:
    """Where a gpucloud save's time goes: wraps the writer's stream and the commit's phases."""

    def __init__(self) -> None:
        self.acc: dict[str, float] = collections.defaultdict(float)
        self._lock = threading.Lock()
        self._undo: list[Callable[[], None]] = []

    def _add(self, key: str, seconds: float) -> None:
        with self._lock:
            self.acc[key] += seconds

    def wrap(self, owner: Any, name: str, key: str) -> None:
        original = getattr(owner, name)

        def timed_call(*args, **kwargs):
            start = time.perf_counter()
            try:
                return original(*args, **kwargs)
            finally:
                self._add(key, time.perf_counter() - start)

        setattr(owner, name, timed_call)
        self._undo.append(lambda: setattr(owner, name, original))

    def __enter__(self) -> SaveProfile:
        import torch.distributed.checkpoint.filesystem as dcp_fs

        from gpucloud.checkpoint import commit, manifest, store

        stream = dcp_io._ChecksummingStream
        original_write = stream.write

        def write(stream_self, b):
            view = memoryview(b)
            start = time.perf_counter()
            written = stream_self._raw.write(view)
            wrote = time.perf_counter()
            if view.nbytes >= getattr(dcp_io, "_WRITEBACK_MIN_BYTES", float("inf")):
                _start_writeback(stream_self._raw.fileno(), stream_self._size, view.nbytes)
            kicked = time.perf_counter()
            stream_self._hasher.update(view)
            self._add("threads: write() into the page cache", wrote - start)
            self._add("threads: start writeback", kicked - wrote)
            self._add("threads: XXH3 hash", time.perf_counter() - kicked)
            stream_self._size += view.nbytes
            return written if written is not None else view.nbytes

        stream.write = write  # type: ignore[method-assign]
        self._undo.append(lambda: setattr(stream, "write", original_write))
        self.wrap(torch, "save", "threads: torch.save (all of it)")
        self.wrap(os, "fsync", "all fsync() calls (threads + commit)")
        self.wrap(dcp_fs._FileSystemWriter, "write_data", "wall: DCP write_data (the threads)")
        self.wrap(dcp_fs._FileSystemWriter, "finish", "wall: DCP .metadata")
        self.wrap(commit, "commit", "wall: commit (manifest, rename, LATEST)")
        self.wrap(manifest, "write_bytes_atomic", "wall: write_bytes_atomic (manifest, LATEST)")
        self.wrap(store.CheckpointStore, "apply_retention", "wall: retention")
        return self

    def __exit__(self, *exc) -> None:
        for undo in reversed(self._undo):
            undo()


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size-mb", type=int, default=None, help="checkpoint size (weights + AdamW state), MB; 1000")
    ap.add_argument("--reps", type=int, default=3, help="repetitions per measurement (median reported)")
    ap.add_argument("--dir", default=None, help="directory on the disk to measure (default: a temp dir)")
    ap.add_argument("--threads", type=int, default=dcp_io.DEFAULT_WRITER_THREADS, help="gpucloud writer threads")
    ap.add_argument("--skip-async", action="store_true", help="leave out the async stall (it needs a 2nd copy)")
    ap.add_argument("--profile", action="store_true", help="also break one more gpucloud save down")
    args = ap.parse_args(argv)
    size_mb = args.size_mb or 1000
    results = RESULTS_DIR / ("checkpoint.json" if args.size_mb is None else f"checkpoint-{size_mb}mb.json")

    root = Path(args.dir or tempfile.mkdtemp(prefix="gpucloud-bench-"))
    root.mkdir(parents=True, exist_ok=True)
    model, optimizer, nbytes = build(size_mb)
    tensors = _tensors(model, optimizer)
    print(f"state: {nbytes / 1e6:.0f} MB in {len(tensors)} tensors; disk: {root}; {args.reps} reps")

    def fresh(name: str) -> Path:
        path = root / name
        shutil.rmtree(path, ignore_errors=True)
        if path.is_file():
            path.unlink()
        os.sync()
        return path

    report: dict[str, Any] = {
        "state_bytes": nbytes,
        "reps": args.reps,
        "dir": str(root),
        "host": platform.node(),
        "cpus": os.cpu_count(),
        "torch": torch.__version__,
        "writer_threads": args.threads,
    }
    try:
        saves, loads = _measure(args, model, optimizer, tensors, fresh, root)
        if args.profile:
            report["save_profile"] = _profile(args, model, optimizer, tensors, fresh, nbytes)
        if not args.skip_async:
            report["async"] = _async_stall(args, model, optimizer, fresh, median(saves["gpucloud"]))
    finally:
        shutil.rmtree(root, ignore_errors=True) if not args.dir else _clean(root)

    def summary(times: dict[str, list[float]]) -> dict[str, Any]:
        return {
            k: {"seconds": median(v), "gb_per_s": nbytes / median(v) / 1e9, "all_seconds": v} for k, v in times.items()
        }

    report["save"] = summary(saves)
    report["load"] = summary(loads)
    raw_s = median(saves["raw"])
    for r in report["save"].values():
        r["vs_raw"] = raw_s / r["seconds"]
    dcp_load = median(loads["dcp"])
    for r in report["load"].values():
        r["vs_dcp"] = dcp_load / r["seconds"]
    report["save_vs_raw"] = raw_s / median(saves["gpucloud"])
    report["save_vs_raw_writeback"] = median(saves["raw_writeback"]) / median(saves["gpucloud"])
    report["save_vs_raw_best_of_reps"] = min(saves["raw"]) / min(saves["gpucloud"])
    report["restore_vs_dcp"] = dcp_load / median(loads["gpucloud_verified"])
    report["restore_unverified_vs_dcp"] = dcp_load / median(loads["gpucloud_unverified"])
    goals = {"save_vs_raw >= 0.95": report["save_vs_raw"] >= 0.95, "restore_vs_dcp >= 1": report["restore_vs_dcp"] >= 1}
    if "async" in report:
        report["stall_vs_sync"] = report["async"]["stall_seconds"] / report["async"]["sync_save_seconds"]
        goals["stall_vs_sync <= 0.01"] = report["stall_vs_sync"] <= 0.01
    report["goals"] = goals

    results.parent.mkdir(parents=True, exist_ok=True)
    results.write_text(json.dumps(report, indent=2) + "\n")
    print("save (fsync'ed), median GB/s and x raw write:")
    for name, r in report["save"].items():
        print(f"  {name:16s} {r['gb_per_s']:6.2f} GB/s  {r['vs_raw']:.2f}x raw  ({r['seconds']:.3f} s)")
    print("restore (page cache evicted first), median GB/s and x DCP's load:")
    for name, r in report["load"].items():
        print(f"  {name:20s} {r['gb_per_s']:6.2f} GB/s  {r['vs_dcp']:.2f}x DCP  ({r['seconds']:.3f} s)")
    print(
        f"save_vs_raw {report['save_vs_raw']:.2f} (goal >= 0.95; vs raw with writeback "
        f"{report['save_vs_raw_writeback']:.2f}; fastest vs fastest {report['save_vs_raw_best_of_reps']:.2f}); "
        f"restore_vs_dcp {report['restore_vs_dcp']:.2f} verified, {report['restore_unverified_vs_dcp']:.2f} "
        "unverified (goal >= 1)"
    )
    if "async" in report:
        a = report["async"]
        print(
            f"async stall {a['stall_seconds'] * 1000:.1f} ms vs sync save {a['sync_save_seconds'] * 1000:.0f} ms: "
            f"{report['stall_vs_sync']:.4f}  (goal <= 0.01)"
        )
    if "save_profile" in report:
        p = report["save_profile"]
        print(f"save profile (one save, {p['save_seconds']:.3f} s; raw write {p['raw_seconds']:.3f} s):")
        for key, seconds in p["seconds"].items():
            print(f"  {key:45s} {seconds:.3f} s")
    print(f"wrote {results}")
    return 0


def _clean(root: Path) -> None:
    for child in root.iterdir():
        shutil.rmtree(child, ignore_errors=True) if child.is_dir() else child.unlink()


def _measure(args, model, optimizer, tensors, fresh, root) -> tuple[dict[str, list[float]], dict[str, list[float]]]:
    saves: dict[str, list[float]] = collections.defaultdict(list)
    loads: dict[str, list[float]] = collections.defaultdict(list)
    nbytes = sum(t.numel() * t.element_size() for t in tensors)
    for rep in range(args.reps):
        # -- save: every writer on a fresh path, interleaved
        raw = fresh("raw.bin")
        saves["raw"].append(raw_write(tensors, raw))
        wb = fresh("raw-writeback.bin")
        saves["raw_writeback"].append(raw_write(tensors, wb, writeback=True))
        wb.unlink()
        uri = fresh("gpucloud")
        sess = TrainingSession(
            model, optimizer, checkpoint_uri=str(uri), job_id="bench", keep_last=1, writer_threads=args.threads
        )
        sess.restore()  # a fresh URI: nothing to load; saves are refused before restore()
        saves["gpucloud"].append(timed(lambda s=sess, r=rep: s.save_now(r + 1)))
        sess.finish()
        for threads in (1, 8):
            path = fresh(f"dcp-t{threads}")
            writer = dcp.FileSystemWriter(path, thread_count=threads, sync_files=True)
            sd = state_dict_of(model, optimizer)
            saves[f"dcp_t{threads}"].append(timed(lambda w=writer, s=sd: dcp.save(s, storage_writer=w, no_dist=True)))
            if threads == 1:
                shutil.rmtree(path)
        ts_path = fresh("torch.pt")

        def torch_save(path: Path = ts_path) -> None:
            with open(path, "wb") as fh:
                torch.save(state_dict_of(model, optimizer), fh)
                fh.flush()
                os.fsync(fh.fileno())

        saves["torch_save"].append(timed(torch_save))

        # -- restore: the files just written, evicted from the page cache before each read
        evict(raw)
        loads["raw_read"].append(raw_read(raw))
        raw.unlink()
        target = state_dict_of(model, optimizer)
        evict(root / "dcp-t8")
        loads["dcp"].append(
            timed(lambda t=target: dcp.load(t, storage_reader=dcp.FileSystemReader(root / "dcp-t8"), no_dist=True))
        )
        shutil.rmtree(root / "dcp-t8")
        if nbytes <= TORCH_LOAD_MAX_BYTES:
            evict(ts_path)
            loads["torch_load"].append(timed(lambda p=ts_path: torch.load(p, weights_only=True)))
        ts_path.unlink()
        job = uri / "bench"
        evict(job)
        loads["gpucloud_verified"].append(timed(lambda j=job: gpucloud_load(str(j), model, optimizer)))
        evict(job)
        loads["gpucloud_unverified"].append(timed(lambda u=uri: _load_unverified(str(u), model, optimizer)))
        shutil.rmtree(uri)
    return saves, loads


def _load_unverified(uri: str, model, optimizer) -> None:
    """The restore path without the XXH3 checks: LATEST and the manifest's listing and sizes only."""
    from gpucloud.checkpoint import state

    resolved = CheckpointStore(uri, "bench").resolve(verify_checksums=False)
    assert resolved is not None
    target = state.capture(model, optimizer, {}, rank=0, step=0)
    target.pop("rng")
    target.pop("extra")
    dcp_io.load(target, resolved.directory)
    state.apply_weights(target, model, optimizer, {}, source_rank=0)


def _profile(args, model, optimizer, tensors, fresh, nbytes) -> dict[str, Any]:
    raw_s = raw_write(tensors, fresh("raw.bin"))
    fresh("raw.bin").unlink(missing_ok=True)
    uri = fresh("profiled")
    sess = TrainingSession(model, optimizer, checkpoint_uri=str(uri), job_id="bench", keep_last=1)
    sess.restore()
    with SaveProfile() as prof:
        save_s = timed(lambda: sess.save_now(1))
    sess.finish()
    shutil.rmtree(uri)
    seconds = dict(sorted(prof.acc.items()))
    inside = sum(v for k, v in seconds.items() if k.startswith("threads:") and "torch.save" not in k)
    # What torch.save spends besides our stream's write: its zip framing and (unless switched off)
    # the CRC-32 of every record.
    seconds["threads: torch.save minus the stream's write (CRC-32, zip)"] = (
        seconds.get("threads: torch.save (all of it)", 0.0) - inside
    )
    return {"raw_seconds": raw_s, "save_seconds": save_s, "seconds": seconds}


def _async_stall(args, model, optimizer, fresh, sync_s: float) -> dict[str, Any]:
    # A save every 2nd step. The step after a save runs its forward/backward while the background
    # thread copies parameters; its optimizer.step() waits if the copy is not done, and that wait
    # counts as stall. The background persist then finishes before the next save (as with any
    # sane interval), so waiting for it is not counted.
    uri = fresh("async")
    sess = TrainingSession(
        model,
        optimizer,
        checkpoint_uri=str(uri),
        job_id="bench",
        keep_last=1,
        every_steps=2,
        writer_threads=args.threads,
    )
    sess.restore()
    stalls: list[float] = []
    for step in range(1, 2 * (args.reps + 1) + 1):
        train_step(model, optimizer)
        sess.step_done(step)
        if step % 2 == 1:
            continue
        sess.wait()
        if step > 2:  # the first save allocates the staging buffers (a one-time cost)
            stalls.append(sess.history.stall_seconds or 0.0)
    sess.finish()
    optimizer.zero_grad(set_to_none=True)
    shutil.rmtree(uri, ignore_errors=True)
    return {"stall_seconds": median(stalls), "all_stall_seconds": stalls, "sync_save_seconds": sync_s}


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
