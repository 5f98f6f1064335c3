"""Every attempt's output, kept: the file the supervisor writes, and `gpucloud job logs` reading it.

Where: ``$GPUCLOUD_HOME/logs/<job-id>/attempt-<n>.log`` on the node that supervises the attempt
(beside ``run/``, but not under an agent's ``--run-root`` scratch, so `job logs` on that machine
finds it without knowing the agent's options). The path is recorded in the attempt's ``started``
event (``log``), and `job logs` reads it from there.

What: the command's stdout and stderr (one pipe, so their lines keep the order they were written
in; torchrun forwards every local rank's), verbatim, and the supervisor's own lines interleaved,
each marked ``[gpucloud <UTC time>]``. In a gang attempt every member appends to the same file
(``O_APPEND``, one ``write`` per line) and marks each line with its node (``[host:pid]``). The
file ends with ``END_MARKER`` once the supervisor is done with the attempt, so a follower knows no
more output comes (an attempt whose supervisor died has none: a follower stops when the queue says
the attempt ended and the file stopped growing).
"""

from __future__ import annotations

import codecs
import dataclasses
import logging
import os
import re
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from gpucloud.errors import UserError
from gpucloud.jobs.model import Attempt, AttemptState, Event, Job
from gpucloud.jobs.process_group import OutputSink

log = logging.getLogger("gpucloud.jobs")

SUPERVISOR_MARK = "[gpucloud"
END_MARKER = "end of attempt output"
_TIME_PREFIX = re.compile(r"^\[\d\d:\d\d:\d\d\] ")


def logs_root() -> Path:
    from gpucloud.queue.locations import gpucloud_home

    return gpucloud_home() / "logs"


def attempt_log_path(job_id: str, attempt: int, root: Path | None = None) -> Path:
    return (root or logs_root()) / job_id / f"attempt-{attempt}.log"


def utc_stamp(epoch: float) -> str:
    """ISO 8601 UTC with milliseconds, e.g. 2026-11-24T05:40:12.123Z."""
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(epoch)) + f".{int(epoch % 1 * 1000):03d}Z"


def supervisor_text(kind: str, data: dict[str, Any]) -> str | None:
    """The supervisor's line for a timeline event (None: not worth a line)."""
    from gpucloud.jobs.node import describe_event

    described = describe_event(kind, data)
    if described is not None:
        return _TIME_PREFIX.sub("", described)
    if kind == "exit":
        reason = f": {data['reason']}" if data.get("reason") else ""
        return f"command exited with code {data.get('exit_code')}{reason}"
    if kind == "crash":
        return f"attempt {data.get('attempt')} crashed: {data.get('reason')}"
    if kind == "cancelled":
        return "job cancelled"
    if kind == "stop-request":
        return f"stop requested ({data.get('source')})"
    return None


class AttemptLog:
    """The attempt's log file, written by the process group's output pump and the supervisor.

    Never fails the attempt: a log that cannot be written costs one warning, and the output still
    goes to ``echo`` (default: the supervisor's stderr, looked up at each line, as before)."""

    def __init__(self, path: Path, *, echo: OutputSink | None, label: str | None = None) -> None:
        self.path = path
        self._echo = echo
        self._label = f"[{label}] " if label else ""
        self._lock = threading.Lock()
        self._fd: int | None = None
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        except OSError as err:
            log.warning("cannot write the attempt's log %s (%s); its output goes to stderr only", path, err.strerror)

    @property
    def writable(self) -> bool:
        return self._fd is not None

    def _append(self, line: str) -> None:
        with self._lock:
            if self._fd is None:
                return
            try:
                os.write(self._fd, (self._label + line).encode("utf-8", "replace"))
            except OSError as err:  # a full disk must not stop the training
                log.warning("writing the attempt's log %s failed (%s); no more output is kept", self.path, err)
                os.close(self._fd)
                self._fd = None

    # -- the command's output (an ``OutputSink``) -------------------------------------------------

    def write(self, text: str, /) -> int:
        self._append(text if text.endswith("\n") else text + "\n")
        (self._echo or sys.stderr).write(text)
        return len(text)

    def flush(self) -> None:
        (self._echo or sys.stderr).flush()

    # -- the supervisor's own lines -------------------------------------------------------------

    def supervisor(self, text: str, at: float | None = None) -> None:
        stamp = utc_stamp(time.time() if at is None else at)
        for part in text.splitlines() or [""]:
            self._append(f"{SUPERVISOR_MARK} {stamp}] {part}\n")

    def event(self, kind: str, data: dict[str, Any]) -> None:
        text = supervisor_text(kind, data)
        if text is not None:
            self.supervisor(text, data.get("at"))

    def close(self) -> None:
        self.supervisor(END_MARKER)
        with self._lock:
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None


def open_attempt_log(job: Job, *, echo: OutputSink | None, root: Path | None = None) -> AttemptLog:
    """The log of ``job``'s current attempt; gang members mark their lines with their node."""
    label = f"{socket.gethostname()}:{os.getpid()}" if job.spec.nodes > 1 else None
    return AttemptLog(attempt_log_path(job.id, job.attempt, root), echo=echo, label=label)


# ------------------------------------------------------------------------------------- reading


@dataclasses.dataclass(frozen=True)
class AttemptSource:
    """Where one attempt's output is, as its ``started`` events recorded it (``exit``, for a command
    that could not start)."""

    attempt: Attempt
    paths: tuple[str, ...]  # empty: the attempt never started (or predates kept logs)


def sources(attempts: Iterable[Attempt], events: Iterable[Event]) -> list[AttemptSource]:
    by_attempt: dict[int, list[str]] = {}
    for event in events:
        path = event.data.get("log") if event.kind in ("started", "exit") else None
        if isinstance(path, str) and path not in by_attempt.setdefault(event.attempt, []):
            by_attempt[event.attempt].append(path)
    return [AttemptSource(a, tuple(by_attempt.get(a.number, ()))) for a in attempts]


def pick_attempt(job: Job, found: list[AttemptSource], wanted: int | None) -> list[AttemptSource]:
    """The attempts `job logs` shows: ``wanted``, or all; a one-line error for one that does not exist."""
    if wanted is None:
        return found
    chosen = [s for s in found if s.attempt.number == wanted]
    if not chosen:
        numbers = [s.attempt.number for s in found]
        have = f"attempts 1 to {max(numbers)}" if numbers and len(numbers) > 1 else "only attempt 1"
        raise UserError(f"job {job.id} has {have}; --attempt {wanted} is not one of them")
    return chosen


LIVE = (AttemptState.QUEUED, AttemptState.RUNNING)


class LogReader:
    """Reads the attempts' log files incrementally and writes what is new to ``out``."""

    def __init__(self, out: Callable[[str], None], *, headers: bool) -> None:
        self.out = out
        self.headers = headers
        self._offsets: dict[str, int] = {}
        self._pending: dict[str, str] = {}  # a line not finished yet (no newline)
        self._ended: set[str] = set()  # files that reached END_MARKER
        self._headed: set[int] = set()
        self._decoders: dict[str, codecs.IncrementalDecoder] = {}

    def done(self, source: AttemptSource) -> bool:
        """No more output will come for this attempt."""
        return bool(source.paths) and all(p in self._ended for p in source.paths)

    def pump(self, source: AttemptSource, *, final: bool = False) -> bool:
        """Write what is new in the attempt's files; True when something was. ``final``: also the
        last line without a newline (the attempt is over)."""
        wrote = False
        for path in source.paths:
            text = self._read_new(path)
            if text is None:
                continue
            text = self._pending.pop(path, "") + text
            if not final and not text.endswith("\n"):
                text, _, rest = text.rpartition("\n")
                self._pending[path] = rest
                text = text + "\n" if text else ""
            if not text:
                continue
            lines = [ln for ln in text.splitlines(keepends=True) if not self._is_end(path, ln)]
            if lines:
                self._header(source)
                self.out("".join(lines))
                wrote = True
        return wrote

    def _is_end(self, path: str, line: str) -> bool:
        if SUPERVISOR_MARK in line and line.rstrip("\n").endswith(END_MARKER):
            self._ended.add(path)
            return True
        return False

    def _read_new(self, path: str) -> str | None:
        offset = self._offsets.get(path, 0)
        try:
            with open(path, "rb") as fh:
                fh.seek(offset)
                data = fh.read()
        except FileNotFoundError:
            return None
        except OSError as err:
            raise UserError(f"cannot read the log {path}: {err.strerror}") from err
        if not data:
            return None
        self._offsets[path] = offset + len(data)
        # Incremental: a character split between two reads is decoded whole with the next one.
        decoder = self._decoders.setdefault(path, codecs.getincrementaldecoder("utf-8")("replace"))
        return decoder.decode(data)

    def _header(self, source: AttemptSource) -> None:
        number = source.attempt.number
        if self.headers and number not in self._headed:
            self._headed.add(number)
            self.out(f"==> attempt {number} ({source.attempt.state.value}) <==\n")


def missing_note(source: AttemptSource) -> str | None:
    """Why an attempt shows no output, or None when its files exist here."""
    attempt = source.attempt
    if not source.paths:
        if attempt.state is AttemptState.QUEUED:
            return f"attempt {attempt.number} has not started yet"
        if attempt.started_at is None:
            return f"attempt {attempt.number} never started ({attempt.state.value})"
        return f"attempt {attempt.number} kept no log (it ran before gpucloud kept attempt logs)"
    absent = [p for p in source.paths if not os.path.exists(p)]
    if len(absent) == len(source.paths):
        node = f" on node {attempt.node}" if attempt.node else ""
        return f"attempt {attempt.number} ran{node}; its log {absent[0]} is not on this machine"
    return None


def show_logs(
    queue: Any,
    job: Job,
    *,
    attempt: int | None,
    follow: bool,
    out: Callable[[str], None],
    poll_s: float = 0.5,
    end_grace_s: float = 10.0,
    sleep: Callable[[float], None] = time.sleep,
) -> list[str]:
    """Write the output of ``job``'s attempts (or attempt ``attempt``) to ``out``. With ``follow``,
    keep writing what the running attempt adds, and (without ``attempt``) the attempts after it,
    until no more can come: every attempt shown has ended and its log is complete (its end marker,
    or ``end_grace_s`` without growth after the queue said it ended: a supervisor that died writes
    no marker). Returns one line per attempt that shows nothing, saying why."""
    reader = LogReader(out, headers=attempt is None)
    over_since: dict[int, float] = {}
    while True:
        found = pick_attempt(job, sources(queue.attempts(job.id), queue.events(job.id)), attempt)
        settled = True
        for source in found:
            over = source.attempt.state not in LIVE
            if reader.pump(source, final=over):
                over_since.pop(source.attempt.number, None)  # still growing: wait for more
            if not over:
                settled = False
            elif source.paths and not reader.done(source):
                first_seen = over_since.setdefault(source.attempt.number, time.monotonic())
                settled = settled and time.monotonic() - first_seen >= end_grace_s
        if not follow or settled:
            return [note for source in found if (note := missing_note(source)) is not None]
        sleep(poll_s)
