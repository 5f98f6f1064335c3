"""Options that several commands share, defined once so their names and help never drift apart."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from gpucloud.errors import UserError

QUEUE_HELP = (
    "Job queue (default: $GPUCLOUD_QUEUE, else the node's AWS queue from "
    "GPUCLOUD_REGION/GPUCLOUD_JOB_TABLE/GPUCLOUD_JOB_QUEUE_URL, else sqlite:///$GPUCLOUD_HOME/queue.db)."
)


def queue_option() -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """``--queue URI``, passed to the command as ``queue_uri``."""
    return click.option("--queue", "queue_uri", metavar="URI", help=QUEUE_HELP)


_STACK_FILE_NAME = re.compile(r"^Pulumi\.(?P<name>.+)\.ya?ml$")


def stack_options() -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """``--stack NAME`` (a shipped stack) or ``--stack-file PATH``, passed as ``stack`` and ``stack_file``;
    ``chosen_stack`` turns them into the stack's name and file."""

    def decorate(command: Callable[..., Any]) -> Callable[..., Any]:
        command = click.option(
            "--stack-file",
            "stack_file",
            metavar="PATH",
            type=click.Path(dir_okay=False, path_type=Path),
            help="Any stack file (Pulumi.<name>.yaml format) instead of --stack; the stack name is taken from "
            "the file name.",
        )(command)
        return click.option("--stack", "-s", "stack", metavar="NAME", help="A shipped stack: stacks/Pulumi.NAME.yaml.")(
            command
        )

    return decorate


def chosen_stack(stack: str | None, stack_file: Path | None) -> tuple[str, Path]:
    """The stack's name and file from ``--stack`` or ``--stack-file``: exactly one must be given."""
    from gpucloud.spec import stack_file_for
    from gpucloud.spec.loading import available_stacks

    if stack is not None and stack_file is None:
        return stack, stack_file_for(stack)
    if stack_file is not None and stack is None:
        match = _STACK_FILE_NAME.match(stack_file.name)
        return (match.group("name") if match else stack_file.stem), stack_file
    raise UserError(
        "give exactly one of --stack NAME or --stack-file PATH; shipped stacks: " + ", ".join(available_stacks())
    )


def catalog_file_option() -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """``--catalog-file PATH``, passed as ``catalog_file`` (None: the bundled catalog)."""
    return click.option(
        "--catalog-file",
        "catalog_file",
        metavar="PATH",
        type=click.Path(dir_okay=False, path_type=Path),
        help="Instance catalog JSON for validation, EFA layouts and prices, e.g. one written by "
        "`gpucloud catalog refresh --output-file` (default: the bundled catalog).",
    )
