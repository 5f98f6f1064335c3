"""Where the embedded defaults live, and how a queue URI becomes a queue.

``GPUCLOUD_HOME`` (default ``~/.gpucloud``) holds the default queue (``queue.db``), the durable
checkpoint tier (``checkpoints/``) and per-attempt control and local-tier directories (``run/``).
"""

from __future__ import annotations

import os
from pathlib import Path

from gpucloud.errors import UserError
from gpucloud.jobs.queue import JobQueue

HOME_ENV = "GPUCLOUD_HOME"
QUEUE_ENV = "GPUCLOUD_QUEUE"
QUEUE_SCHEMES = ("sqlite:///PATH",)


def gpucloud_home() -> Path:
    return Path(os.environ.get(HOME_ENV) or Path.home() / ".gpucloud").expanduser()


def default_queue_uri() -> str:
    return os.environ.get(QUEUE_ENV) or f"sqlite:///{gpucloud_home() / 'queue.db'}"


def default_checkpoint_uri() -> str:
    return str(gpucloud_home() / "checkpoints")


def run_dir(job_id: str, attempt: int) -> Path:
    """This node's scratch directory for one attempt (control files, local checkpoint tier)."""
    return gpucloud_home() / "run" / job_id / f"attempt-{attempt}"


def open_queue(uri: str | None = None) -> JobQueue:
    """The queue named by ``uri`` (default: ``$GPUCLOUD_QUEUE`` or the embedded SQLite file)."""
    uri = uri or default_queue_uri()
    if uri.startswith("sqlite:///"):
        path = uri[len("sqlite:///") :]
        if not path:
            raise UserError(f"queue URI {uri!r} names no file; use sqlite:///PATH, e.g. sqlite:///{gpucloud_home() / 'queue.db'}")
        from gpucloud.jobs.sqlite_queue import SqliteQueue

        return SqliteQueue(Path(path).expanduser(), uri=uri)
    if uri.startswith("aws://"):
        raise UserError(
            f"queue URI {uri!r}: the AWS queue backend is not available in this version; use sqlite:///PATH"
        )
    raise UserError(f"unsupported queue URI {uri!r}; allowed: {', '.join(QUEUE_SCHEMES)}")
