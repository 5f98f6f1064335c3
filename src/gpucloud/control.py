"""The control directory: how the supervisor and the training processes talk.

``spot-train`` gives every job attempt a directory (``GPUCLOUD_CONTROL_DIR``). Files in it, each a
small JSON document written atomically (temp file + rename, so a reader never sees half a file):

=============  ===========================  ==================================================
file           written by                   meaning
=============  ===========================  ==================================================
``preempt``    supervisor                   stop: the notice as JSON (kind, deadline, ...).
                                            The session saves at the next step boundary,
                                            commits, and the process exits 75.
``save``       supervisor                   checkpoint early, keep training (rebalance
                                            recommendation). The session deletes it when done.
``ack``        session (global rank 0)      the flag was seen; every rank agreed on ``step``.
``committed``  session (global rank 0)      the emergency checkpoint of ``step`` is committed
                                            (LATEST names it, on the durable tier).
``resumed``    session (global rank 0)      this attempt restored ``step`` (or started fresh).
``progress``   session (global rank 0)      the last completed step (rate-limited), the last
                                            save, and ``metrics``: the node's step, save and
                                            stall histograms (``training_metrics``) for the
                                            agent's /metrics.
``finished``   session (global rank 0)      the training loop finished; ``step`` is final.
=============  ===========================  ==================================================

Only this module knows the file names; both sides call the functions below.
"""

from __future__ import annotations

import json
import logging
import math
import os
import tempfile
import time
from pathlib import Path
from typing import Any

from gpucloud.payload import parse_json
from gpucloud.regular_files import read_regular

log = logging.getLogger("gpucloud.control")

PREEMPT = "preempt"
SAVE = "save"
ACK = "ack"
COMMITTED = "committed"
RESUMED = "resumed"
PROGRESS = "progress"
FINISHED = "finished"

ALL_FILES = (PREEMPT, SAVE, ACK, COMMITTED, RESUMED, PROGRESS, FINISHED)

# What a reader accepts. The files are written by the job's own processes, so a reader (the
# supervisor, the agent's /metrics, which hold locks while they read) must survive anything in them:
# the largest file gpucloud writes is the progress file with its histograms, a few KiB.
MAX_FILE_BYTES = 1 << 20
MAX_DEPTH = 16  # gpucloud's files nest 4 deep
INT_RANGE = (-(2**63), 2**63 - 1)  # what SQLite, DynamoDB and a float-based exporter can all hold


class UnreadableControlFile(ValueError):
    pass


_warned: set[str] = set()


def write(control_dir: str | os.PathLike[str], name: str, payload: dict[str, Any]) -> Path:
    """Atomically write ``payload`` (plus a ``written_at`` timestamp) as ``control_dir/name``."""
    if name not in ALL_FILES:
        raise ValueError(f"unknown control file {name!r}; expected one of {', '.join(ALL_FILES)}")
    directory = Path(control_dir)
    directory.mkdir(parents=True, exist_ok=True)
    body = dict(payload)
    body.setdefault("written_at", time.time())
    fd, tmp = tempfile.mkstemp(prefix=f".{name}.", dir=directory)
    try:
        with os.fdopen(fd, "w") as fh:
            json.dump(body, fh)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, directory / name)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    return directory / name


def read(control_dir: str | os.PathLike[str] | None, name: str) -> dict[str, Any] | None:
    """The JSON object in ``control_dir/name``, or None when it is absent or not one gpucloud could
    have written: not a regular file (a FIFO would block the reader), over ``MAX_FILE_BYTES``, not
    UTF-8 JSON, nested deeper than ``MAX_DEPTH``, or holding a number outside ``INT_RANGE`` or not
    finite. Such a file is logged once and otherwise ignored: one job's file never stops a reader."""
    if not control_dir:
        return None
    path = Path(control_dir) / name
    try:
        data = parse_json(read_regular(path, MAX_FILE_BYTES), f"control file {path}", UnreadableControlFile)
        if not isinstance(data, dict):
            raise UnreadableControlFile(f"control file {path} is JSON {type(data).__name__}, not an object")
        check_plain(data, f"control file {path}")
    except FileNotFoundError:
        return None
    except (OSError, UnreadableControlFile) as err:
        text = f"{path}: {err.strerror}" if isinstance(err, OSError) and err.strerror else str(err)
        if text not in _warned and len(_warned) < 1000:
            _warned.add(text)
            log.warning("ignoring %s", text[:300])
        return None
    return data


def check_plain(data: Any, what: str) -> None:
    """UnreadableControlFile unless ``data`` nests at most ``MAX_DEPTH`` deep and its numbers are
    integers in ``INT_RANGE`` or finite floats. Iterative: a deep document must not exhaust the stack."""
    stack: list[tuple[Any, int]] = [(data, 1)]
    while stack:
        value, depth = stack.pop()
        if isinstance(value, (dict, list)):
            if depth > MAX_DEPTH:
                raise UnreadableControlFile(f"{what} nests deeper than {MAX_DEPTH}")
            items = value.values() if isinstance(value, dict) else value
            stack.extend((item, depth + 1) for item in items)
        elif isinstance(value, bool) or value is None or isinstance(value, str):
            continue
        elif isinstance(value, int):
            if not INT_RANGE[0] <= value <= INT_RANGE[1]:
                raise UnreadableControlFile(f"{what} holds an integer outside the 64-bit range")
        elif isinstance(value, float) and not math.isfinite(value):
            raise UnreadableControlFile(f"{what} holds {value}, not a finite number")


def exists(control_dir: str | os.PathLike[str] | None, name: str) -> bool:
    return control_dir is not None and bool(control_dir) and (Path(control_dir) / name).exists()


def remove(control_dir: str | os.PathLike[str] | None, name: str) -> None:
    if not control_dir:
        return
    try:
        os.unlink(Path(control_dir) / name)
    except FileNotFoundError:
        pass


def clear(control_dir: str | os.PathLike[str]) -> None:
    """Remove every control file (a new attempt starts with a clean directory)."""
    for name in ALL_FILES:
        remove(control_dir, name)
