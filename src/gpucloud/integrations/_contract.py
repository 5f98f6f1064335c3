"""The spot-train contract for frameworks that build their own optimizer and checkpoints.

HF Trainer and Lightning create the optimizer inside ``train()`` / ``fit()`` and already know how
to save and resume *everything* (model, optimizer, scheduler, RNG, data position). So the
callbacks keep the framework's own checkpoint format and add what ``TrainingSession`` promises:

* the notice is the ``preempt`` flag in ``GPUCLOUD_CONTROL_DIR`` (``gpucloud.control``, as the
  session reads it), and every rank agrees on the step with the session's one all_reduce
  (``gpucloud.checkpoint.ranks.Ranks.agree_max``);
* a checkpoint counts only once it is complete on every rank and fsync'ed: then rank 0 replaces
  ``<dir>/LATEST`` atomically (temp file, fsync, rename); resume reads only what ``LATEST``
  names, never a directory a killed writer left half-written;
* the supervisor hears of it through the same control files (resumed, progress, ack,
  committed, finished) and the process exits 75, so ``spot-train`` requeues the job.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from pathlib import Path
from typing import Any

from gpucloud import control, jobenv
from gpucloud.checkpoint.layout import LocalLocation, parse_uri, validate_job_id
from gpucloud.errors import UserError

POINTER = "LATEST"
_PROGRESS_EVERY_S = 1.0


def checkpoint_dir(framework: str, *, checkpoint_uri: str | None = None, job_id: str | None = None) -> Path:
    """Where a framework's checkpoints of this job live: ``<checkpoint-uri>/<job-id>/<framework>``.

    The frameworks write files with their own code, so the checkpoint URI must be a shared file
    system path (FSx for Lustre, NFS, ``file://``); S3 is refused in one line."""
    uri = checkpoint_uri or os.environ.get(jobenv.CHECKPOINT_URI)
    if not uri:
        raise UserError(
            f"no checkpoint location: pass checkpoint_uri= or set {jobenv.CHECKPOINT_URI} (gpucloud spot-train sets it)"
        )
    job = job_id or os.environ.get(jobenv.JOB_ID)
    if not job:
        raise UserError(f"no job id: pass job_id= or set {jobenv.JOB_ID} (gpucloud spot-train sets it)")
    location = parse_uri(uri)
    if not isinstance(location, LocalLocation):
        raise UserError(
            f"checkpoint URI {uri!r}: {framework} writes its checkpoints with its own file code, which needs a "
            "shared file system path (FSx for Lustre, NFS, file:///dir), not S3; submit with such a --checkpoint-uri"
        )
    return location.root / validate_job_id(job) / framework


def committed_checkpoint(directory: str | os.PathLike[str]) -> Path | None:
    """The checkpoint ``<directory>/LATEST`` names (a directory or file inside ``directory``), or
    None when nothing was committed yet. A pointer we did not write is a one-line UserError."""
    pointer = Path(directory) / POINTER
    try:
        raw = pointer.read_bytes()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise UserError(f"{pointer} cannot be read ({exc.strerror}); fix or delete it (deleting starts over)") from None
    try:
        name = json.loads(raw)["checkpoint"]
    except (ValueError, KeyError, TypeError):
        name = None
    if not isinstance(name, str) or not name or "/" in name or name in (".", ".."):
        raise UserError(f"{pointer} is not a pointer gpucloud wrote; fix or delete it (deleting starts over)")
    target = Path(directory) / name
    if not target.exists():
        raise UserError(f"{pointer} names {name}, which is missing; restore it or delete {pointer} to start over")
    return target


def commit(directory: str | os.PathLike[str], name: str, step: int) -> None:
    """Make ``<directory>/<name>`` the committed checkpoint: fsync its files, then replace LATEST.
    Call on the one rank that writes LATEST, after every rank finished writing."""
    target = Path(directory) / name
    _fsync_tree(target)
    body = json.dumps({"checkpoint": name, "step": step, "attempt": attempt(), "written_at": time.time()})
    fd, tmp = tempfile.mkstemp(prefix=f".{POINTER}.", dir=directory)
    try:
        with os.fdopen(fd, "w") as fh:
            fh.write(body)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, Path(directory) / POINTER)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    _fsync_dir(Path(directory))


def _fsync_tree(path: Path) -> None:
    files = [path] if path.is_file() else [p for p in sorted(path.rglob("*")) if p.is_file()]
    for file in files:
        fd = os.open(file, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    for directory in {f.parent for f in files} | ({path} if path.is_dir() else set()):
        _fsync_dir(directory)


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def attempt() -> int:
    """This attempt's number (``GPUCLOUD_ATTEMPT``), 0 outside spot-train; validated as the session does."""
    return jobenv.attempt() or 0


class SpotContract:
    """One rank's side of the contract; the framework callbacks call it at their hooks."""

    def __init__(self, control_dir: str | None = None) -> None:
        self.control_dir = control_dir or os.environ.get(jobenv.CONTROL_DIR) or None
        self.attempt = attempt()
        self._ranks: Any = None
        self._last_progress = 0.0
        self.stopping_at: int | None = None

    def start(self, step: int, *, data_position: str) -> None:
        """At the start of training (every rank): set up the agreement, tell the supervisor the step."""
        from gpucloud.checkpoint.ranks import Ranks

        self._ranks = Ranks()  # after the framework initialized the process group
        if self._leader:
            control.write(
                self.control_dir,  # type: ignore[arg-type]
                control.RESUMED,
                {
                    "step": step,
                    "source_tier": "durable" if step else None,
                    "attempt": self.attempt,
                    "data_position": data_position,
                },
            )

    def preempt_agreed(self, step: int) -> bool:
        """At a step boundary (every rank): True on every rank when any rank saw the notice."""
        assert self._ranks is not None, "start() first"
        seen = control.exists(self.control_dir, control.PREEMPT)
        (agreed,) = self._ranks.agree_max([int(seen)])
        now = time.monotonic()
        if self._leader and now - self._last_progress >= _PROGRESS_EVERY_S:
            self._last_progress = now
            control.write(self.control_dir, control.PROGRESS, {"step": step})  # type: ignore[arg-type]
        if agreed and self.stopping_at is None:
            self.stopping_at = step
            notice = control.read(self.control_dir, control.PREEMPT) or {}
            if self._leader:
                control.write(
                    self.control_dir,  # type: ignore[arg-type]
                    control.ACK,
                    {"step": step, "notice_kind": notice.get("kind")},
                )
        return bool(agreed)

    def saved(self, directory: Path, name: str, step: int) -> None:
        """After the framework wrote ``name`` on every rank: commit it; on a notice, exit 75."""
        assert self._ranks is not None, "start() first"
        self._ranks.barrier()  # every rank's files are written
        if self._ranks.rank == 0:
            commit(directory, name, step)
        self._ranks.barrier()  # LATEST names it before any rank reports or exits
        if self.stopping_at is None:
            return
        if self._leader:
            control.write(
                self.control_dir,  # type: ignore[arg-type]
                control.COMMITTED,
                {"step": step, "uri": str(directory / name)},
            )
        raise SystemExit(jobenv.EXIT_REQUEUED)

    def finished(self, step: int) -> None:
        if self._leader:
            control.write(self.control_dir, control.FINISHED, {"step": step})  # type: ignore[arg-type]

    @property
    def _leader(self) -> bool:
        return bool(self.control_dir) and self._ranks is not None and self._ranks.is_node_leader
