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

On a cluster the file is also shipped to the checkpoint bucket while the attempt runs
(``LogShipper``), and `job logs` on an ``aws://`` queue reads it there (see below).
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
from pathlib import Path, PurePosixPath
from typing import Any

from gpucloud.errors import UserError
from gpucloud.jobs.process_group import OutputSink
from gpucloud.lifecycle.model import Attempt, AttemptState, Event, Job
from gpucloud.regular_files import open_regular

log = logging.getLogger("gpucloud.jobs")

SUPERVISOR_MARK = "[gpucloud"
END_MARKER = "end of attempt output"
_TIME_PREFIX = re.compile(r"^\[\d\d:\d\d:\d\d\] ")


def logs_root() -> Path:
    from gpucloud.home import gpucloud_home

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
        self.shipper: LogShipper | None = None
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

    def ship_to(self, bucket: str, prefix: str) -> None:
        self.shipper = LogShipper(self.path, bucket, prefix)

    @property
    def uri(self) -> str | None:
        """Where the log is shipped (``s3://...``), if it is."""
        return self.shipper.uri if self.shipper is not None else None

    def close(self) -> None:
        self.supervisor(END_MARKER)
        with self._lock:
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None
        if self.shipper is not None:
            self.shipper.close()


def open_attempt_log(job: Job, *, echo: OutputSink | None, root: Path | None = None) -> AttemptLog:
    """The log of ``job``'s current attempt; gang members mark their lines with their node. Where
    the job's checkpoints go to a bucket (``log_bucket``), the log is also shipped there."""
    label = f"{socket.gethostname()}:{os.getpid()}" if job.spec.nodes > 1 else None
    output = AttemptLog(attempt_log_path(job.id, job.attempt, root), echo=echo, label=label)
    bucket = log_bucket(job.spec.checkpoint_uri)
    if bucket is not None and output.writable:
        output.ship_to(bucket, log_key_prefix(job.id, job.attempt, f"{socket.gethostname()}-{os.getpid()}"))
    return output


# ------------------------------------------------------------------------------ to the bucket
# On a cluster the file stays on the node that ran the attempt, so the supervisor also ships it to
# the checkpoint bucket: every SHIP_EVERY_S the bytes added since the last shipment become one new
# object (S3 objects cannot be appended to; a part per shipment never rewrites what is there), and
# the rest when the attempt ends. Keys: s3://BUCKET/logs/<job-id>/attempt-<n>/<node>/part-<seq>.
# PutObject of a new key is strongly consistent for a following List and Get
# (https://docs.aws.amazon.com/AmazonS3/latest/userguide/Welcome.html#ConsistencyModel).

SHIP_EVERY_S = 30.0
CLOSE_WAIT_S = 30.0  # the last shipment, at the attempt's end
LOGS_PREFIX = "logs"


def log_bucket(checkpoint_uri: str | None) -> str | None:
    """The bucket an attempt's log is shipped to: its checkpoint URI's, else the cluster's
    (``GPUCLOUD_CHECKPOINT_BUCKET`` in ``node.env``); None off a cluster with local checkpoints."""
    from gpucloud.checkpoint.placement import ClusterStorage

    if checkpoint_uri and checkpoint_uri.startswith("s3://"):
        return checkpoint_uri[len("s3://") :].split("/", 1)[0] or None
    return ClusterStorage.from_env(os.environ).bucket


def log_key_prefix(job_id: str, attempt: int, node: str) -> str:
    safe = re.sub(r"[^A-Za-z0-9._-]", "-", node)
    return f"{LOGS_PREFIX}/{job_id}/attempt-{attempt}/{safe}/"


def _s3_client() -> Any:
    import boto3  # honours AWS_ENDPOINT_URL (moto in tests)
    from botocore.config import Config

    # Short timeouts: a log shipment is retried with the next one anyway.
    return boto3.client(
        "s3", config=Config(connect_timeout=5, read_timeout=30, retries={"mode": "standard", "max_attempts": 3})
    )


class LogShipper:
    """Ships the new bytes of one log file to ``s3://bucket/prefix`` part by part, from a thread."""

    def __init__(self, path: Path, bucket: str, prefix: str, *, every_s: float | None = None) -> None:
        self.path, self.bucket, self.prefix = path, bucket, prefix
        self.uri = f"s3://{bucket}/{prefix}"
        self.every_s = SHIP_EVERY_S if every_s is None else every_s
        self._offset = 0
        self._seq = 0
        self._failed: str | None = None
        self._stop = threading.Event()
        self._client: Any = None
        self._thread = threading.Thread(target=self._run, name=f"log-shipper-{path.name}", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.every_s):
            self.ship()
        self.ship()  # the rest, end marker included

    def ship(self) -> None:
        """One shipment of what is new; a failure costs one warning per distinct error, and the
        bytes are shipped with the next one."""
        try:
            with open(self.path, "rb") as fh:
                fh.seek(self._offset)
                data = fh.read()
            if not data:
                return
            self._client = self._client or _s3_client()
            self._client.put_object(Bucket=self.bucket, Key=f"{self.prefix}part-{self._seq:06d}", Body=data)
        except Exception as err:  # noqa: BLE001 - shipping a log must never stop the training
            line = " ".join(str(err).split()) or type(err).__name__
            if line != self._failed:
                log.warning("shipping the attempt's log to %s failed: %s; retrying", self.uri, line)
            self._failed = line
            return
        self._failed = None
        self._offset += len(data)
        self._seq += 1

    def close(self) -> None:
        """Ship the rest, waiting at most CLOSE_WAIT_S: an unreachable bucket must not hold the
        node's next attempt (the thread goes on trying in the background)."""
        self._stop.set()
        self._thread.join(timeout=CLOSE_WAIT_S)


# ------------------------------------------------------------------------------------- reading


@dataclasses.dataclass(frozen=True)
class AttemptSource:
    """Where one attempt's output is, as its ``started`` events recorded it (``exit``, for a command
    that could not start)."""

    attempt: Attempt
    paths: tuple[str, ...]  # empty: the attempt never started (or predates kept logs)
    refused: tuple[str, ...] = ()  # recorded paths that are not this attempt's log (``log_location_ok``)


def log_location_ok(path: str, job_id: str, attempt: int) -> bool:
    """Whether an event's ``log`` (or ``log_uri``) names where gpucloud writes this attempt's log:
    an absolute ``.../logs/<job-id>/attempt-<n>.log``, or ``s3://BUCKET/logs/<job-id>/attempt-<n>/...``.
    The timeline is read from a shared queue; without this check, `job logs` would print whatever
    file or object a row named (``/etc/hostname``, another job's bucket) to whoever asked."""
    if path.startswith("s3://"):
        _, _, key = path[len("s3://") :].partition("/")
        parts = key.split("/")
        return key.startswith(f"{LOGS_PREFIX}/{job_id}/attempt-{attempt}/") and ".." not in parts
    local = PurePosixPath(path)
    return (
        local.is_absolute()
        and ".." not in local.parts
        and local.name == f"attempt-{attempt}.log"
        and local.parent.name == job_id
        and local.parent.parent.name == "logs"
    )


def sources(attempts: Iterable[Attempt], events: Iterable[Event], *, remote: bool = False) -> list[AttemptSource]:
    """Each attempt's log files. ``remote`` (a queue whose attempts ran on other hosts): the copies
    shipped to the bucket where there are (every member's), else the files, which may be here."""
    local: dict[int, list[str]] = {}
    shipped: dict[int, list[str]] = {}
    refused: dict[int, list[str]] = {}
    for event in events:
        if event.kind not in ("started", "exit"):
            continue
        for field, found in (("log", local), ("log_uri", shipped)):
            path = event.data.get(field)
            if not isinstance(path, str):
                continue
            if not log_location_ok(path, event.job_id, event.attempt):
                found = refused
            if path not in found.setdefault(event.attempt, []):
                found[event.attempt].append(path)
    return [
        AttemptSource(a, tuple(_chosen(local, shipped, a.number, remote)), tuple(refused.get(a.number, [])))
        for a in attempts
    ]


def _chosen(local: dict[int, list[str]], shipped: dict[int, list[str]], number: int, remote: bool) -> list[str]:
    if remote and shipped.get(number):
        return shipped[number]
    return local.get(number, [])


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
        self._client: Any = None

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
        if path.startswith("s3://"):
            return self._read_new_parts(path)
        offset = self._offsets.get(path, 0)
        try:  # a regular file, never through a link: the job could have replaced its log with one
            with open_regular(path, follow_links=False) as fh:
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

    def _read_new_parts(self, uri: str) -> str | None:
        """The parts shipped under ``uri`` since the last read (``LogShipper``), in order."""
        from botocore.exceptions import BotoCoreError, ClientError

        bucket, _, prefix = uri[len("s3://") :].partition("/")
        done = self._offsets.get(uri, 0)
        try:
            self._client = self._client or _s3_client()
            pages = self._client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
            keys = sorted(o["Key"] for page in pages for o in page.get("Contents", []))[done:]
            data = b"".join(self._client.get_object(Bucket=bucket, Key=k)["Body"].read() for k in keys)
        except (BotoCoreError, ClientError) as err:
            raise UserError(f"cannot read the log {uri}: {' '.join(str(err).split())}") from err
        if not keys:
            return None
        self._offsets[uri] = done + len(keys)
        decoder = self._decoders.setdefault(uri, codecs.getincrementaldecoder("utf-8")("replace"))
        return decoder.decode(data)

    def _header(self, source: AttemptSource) -> None:
        number = source.attempt.number
        if self.headers and number not in self._headed:
            self._headed.add(number)
            self.out(f"==> attempt {number} ({source.attempt.state.value}) <==\n")


def missing_note(source: AttemptSource) -> str | None:
    """Why an attempt shows no output, or None when its files exist here."""
    attempt = source.attempt
    if not source.paths and source.refused:
        return (
            f"attempt {attempt.number}'s log is recorded as {source.refused[0][:200]!r}, which is not where gpucloud "
            f"keeps it (.../logs/{attempt.job_id}/attempt-{attempt.number}.log); not read"
        )
    if not source.paths:
        if attempt.state is AttemptState.QUEUED:
            return f"attempt {attempt.number} has not started yet"
        if attempt.started_at is None:
            return f"attempt {attempt.number} never started ({attempt.state.value})"
        return f"attempt {attempt.number} kept no log (it ran before gpucloud kept attempt logs)"
    absent = [p for p in source.paths if not p.startswith("s3://") and not os.path.exists(p)]
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
        remote = str(getattr(queue, "uri", "")).startswith("aws://")
        found = pick_attempt(job, sources(queue.attempts(job.id), queue.events(job.id), remote=remote), attempt)
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
