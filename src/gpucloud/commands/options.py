"""Options that several commands share, defined once so their names and help never drift apart."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import click

QUEUE_HELP = (
    "Job queue (default: $GPUCLOUD_QUEUE, else the node's AWS queue from "
    "GPUCLOUD_REGION/GPUCLOUD_JOB_TABLE/GPUCLOUD_JOB_QUEUE_URL, else sqlite:///$GPUCLOUD_HOME/queue.db)."
)


def queue_option() -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """``--queue URI``, passed to the command as ``queue_uri``."""
    return click.option("--queue", "queue_uri", metavar="URI", help=QUEUE_HELP)
