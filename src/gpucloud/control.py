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
import os
import tempfile
import time
from pathlib import Path
from typing import Any

PREEMPT = "preempt"
SAVE = "save"
ACK = "ack"
COMMITTED = "committed"
RESUMED = "resumed"
PROGRESS = "progress"
FINISHED = "finished"

ALL_FILES = (PREEMPT, SAVE, ACK, COMMITTED, RESUMED, PROGRESS, FINISHED)


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
    """The JSON in ``control_dir/name``, or None when it is absent (or unreadable mid-replace)."""
    if not control_dir:
        return None
    try:
        with open(Path(control_dir) / name) as fh:
            data = json.load(fh)
    except (FileNotFoundError, json.JSONDecodeError, IsADirectoryError):
        return None
    return data if isinstance(data, dict) else None


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
