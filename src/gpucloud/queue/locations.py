"""Where the embedded defaults live, and how a queue URI becomes a queue.

``GPUCLOUD_HOME`` (default ``~/.gpucloud``) holds the default queue (``queue.db``), the embedded
durable checkpoint tier (``checkpoints/``) and per-attempt control and local-tier directories (``run/``).

The default checkpoint location: on a cluster node, the cluster's bucket (resolved on the node that
runs the attempt, from ``node.env``: ``checkpoint/placement.py`` says why); else
``$GPUCLOUD_HOME/checkpoints``.

The default queue: ``$GPUCLOUD_QUEUE``; else, on a cluster node, the AWS queue the stack's
environment names (``GPUCLOUD_REGION``, ``GPUCLOUD_JOB_TABLE``, ``GPUCLOUD_JOB_QUEUE_URL``); else
the embedded SQLite file.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from gpucloud.checkpoint.placement import ClusterStorage, queue_spans_hosts, refusal, unreadable_reason
from gpucloud.errors import UserError
from gpucloud.queue.aws.uri import FORM as AWS_FORM
from gpucloud.queue.aws.uri import parse_aws_uri, uri_from_env
from gpucloud.queue.gang import GangQueue

HOME_ENV = "GPUCLOUD_HOME"
QUEUE_ENV = "GPUCLOUD_QUEUE"
QUEUE_SCHEMES = ("sqlite:///PATH", AWS_FORM)


def gpucloud_home() -> Path:
    return Path(os.environ.get(HOME_ENV) or Path.home() / ".gpucloud").expanduser()


def default_queue_uri() -> str:
    return os.environ.get(QUEUE_ENV) or uri_from_env(os.environ) or f"sqlite:///{gpucloud_home() / 'queue.db'}"


def default_checkpoint_uri(env: Mapping[str, str] | None = None) -> str:
    """The durable tier of a job that names none, as resolved where ``env`` (default: this process's) runs:
    the cluster's bucket on a node, else ``$GPUCLOUD_HOME/checkpoints``."""
    env = os.environ if env is None else env
    return ClusterStorage.from_env(env).default_uri() or str(gpucloud_home() / "checkpoints")


def checkpoint_uri_for(spec_uri: str | None) -> str:
    """The durable tier an attempt uses: the job's own URI, else this node's default."""
    return spec_uri or default_checkpoint_uri()


def checkpoint_uri_to_submit(given: str | None, *, queue_uri: str, nodes: int) -> str | None:
    """What ``submit`` records as the job's checkpoint URI, or a one-line ``UserError`` before anything is queued.

    No URI on a queue whose attempts run on other hosts (``aws://``): None, so each node resolves the
    cluster's default itself. No URI on an embedded queue: today's local default. A URI the next
    attempt could not read (``placement.unreadable_reason``) is refused, naming it and why."""
    from gpucloud.checkpoint.layout import parse_uri

    spans_hosts = queue_spans_hosts(queue_uri)
    if given is None:
        return None if spans_hosts else default_checkpoint_uri()
    parse_uri(given)  # a malformed URI or unknown scheme: its own one-line error
    storage = ClusterStorage.from_env(os.environ)
    reason = unreadable_reason(given, spans_hosts=spans_hosts, nodes=nodes, storage=storage)
    if reason is not None:
        raise UserError(refusal(given, reason, storage))
    return given


def run_dir(job_id: str, attempt: int) -> Path:
    """This node's scratch directory for one attempt (control files, local checkpoint tier)."""
    return gpucloud_home() / "run" / job_id / f"attempt-{attempt}"


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
