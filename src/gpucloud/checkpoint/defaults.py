"""A job's durable checkpoint tier when it names none, resolved on the machine that reads it.

On a cluster node, the cluster's bucket (from ``node.env``: ``checkpoint/placement.py`` says why);
else ``$GPUCLOUD_HOME/checkpoints``. ``submit`` refuses a location the next attempt could not read.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from gpucloud.checkpoint.layout import parse_uri
from gpucloud.checkpoint.placement import ClusterStorage, queue_spans_hosts, refusal, unreadable_reason
from gpucloud.errors import UserError
from gpucloud.home import gpucloud_home


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
    spans_hosts = queue_spans_hosts(queue_uri)
    if given is None:
        return None if spans_hosts else default_checkpoint_uri()
    parse_uri(given)  # a malformed URI or unknown scheme: its own one-line error
    storage = ClusterStorage.from_env(os.environ)
    reason = unreadable_reason(given, spans_hosts=spans_hosts, nodes=nodes, storage=storage)
    if reason is not None:
        raise UserError(refusal(given, reason, storage))
    return given
