"""Printing helpers shared by CLI commands: JSON for machines, rich tables for humans."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterable, Sequence
from typing import Any

import click

OUTPUT_OPTION_HELP = "Output format: a human-readable table, or JSON for scripts."


def output_option(default: str = "table"):
    """The ``--output table|json`` option every listing command takes."""
    return click.option(
        "--output",
        "-o",
        type=click.Choice(["table", "json"]),
        default=default,
        show_default=True,
        help=OUTPUT_OPTION_HELP,
    )


def print_json(data: Any) -> None:
    """Strict JSON (RFC 8259): a NaN or infinity is a bug upstream, never printed as bare ``NaN``."""
    text = json.dumps(data, indent=2, sort_keys=False, default=str, allow_nan=False)
    sys.stdout.write(text)
    sys.stdout.write("\n")


def print_table(title: str | None, columns: Sequence[str], rows: Iterable[Sequence[Any]]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=title, show_lines=False)
    for col in columns:
        table.add_column(col)
    for row in rows:
        table.add_row(*("" if v is None else str(v) for v in row))
    Console().print(table)
