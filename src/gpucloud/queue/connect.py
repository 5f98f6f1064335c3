"""The queue a command uses, and how a queue URI becomes a queue.

The default: ``$GPUCLOUD_QUEUE``; else, on a cluster node, the AWS queue the stack's environment
names (``GPUCLOUD_REGION``, ``GPUCLOUD_JOB_TABLE``, ``GPUCLOUD_JOB_QUEUE_URL``); else the embedded
SQLite file in ``$GPUCLOUD_HOME``.
"""

from __future__ import annotations

import os
from pathlib import Path

from gpucloud.errors import UserError
from gpucloud.home import gpucloud_home
from gpucloud.queue.aws.uri import FORM as AWS_FORM
from gpucloud.queue.aws.uri import parse_aws_uri, uri_from_env
from gpucloud.queue.gang import GangQueue

QUEUE_ENV = "GPUCLOUD_QUEUE"
QUEUE_SCHEMES = ("sqlite:///PATH", AWS_FORM)


def default_queue_uri() -> str:
    return os.environ.get(QUEUE_ENV) or uri_from_env(os.environ) or f"sqlite:///{gpucloud_home() / 'queue.db'}"


def open_queue(uri: str | None = None, *, supervising: bool = False) -> GangQueue:
    """The queue named by ``uri`` (default: ``default_queue_uri()``).

    ``supervising``: the caller runs attempts (worker, agent, spot-train). An embedded queue
    write-locked by another process is then waited for as long as it takes (with backoff, one log
    line), never an error: a supervisor that died of it would leave its training unwatched and its
    attempt to be taken over. Other commands say the queue is busy after ``BUSY_TIMEOUT_S``."""
    uri = uri or default_queue_uri()
    if uri.startswith("sqlite:///"):
        path = uri[len("sqlite:///") :]
        if not path:
            raise UserError(
                f"queue URI {uri!r} names no file; use sqlite:///PATH, e.g. sqlite:///{gpucloud_home() / 'queue.db'}"
            )
        from gpucloud.queue.sqlite import BUSY_TIMEOUT_S, SqliteQueue

        return SqliteQueue(Path(path).expanduser(), uri=uri, lock_patience_s=None if supervising else BUSY_TIMEOUT_S)
    if uri.startswith("aws://"):
        address = parse_aws_uri(uri)
        from gpucloud.queue.aws.backend import AwsQueue

        return AwsQueue(address, uri=uri)
    raise UserError(f"unsupported queue URI {uri!r}; allowed: {', '.join(QUEUE_SCHEMES)}")
