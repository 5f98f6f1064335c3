"""Printing helpers shared by CLI commands: JSON for machines, rich tables for humans."""

from __future__ import annotations

import json
import math
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
    """Strict JSON (RFC 8259): a NaN or infinity is a bug upstream, never printed as bare ``NaN``.
    Times are ISO 8601 UTC strings (``iso_times``)."""
    text = json.dumps(iso_times(data), indent=2, sort_keys=False, default=str, allow_nan=False)
    sys.stdout.write(text)
    sys.stdout.write("\n")


def json_line(data: Any) -> str:
    """One compact JSON object for JSON Lines output, times as in ``print_json``."""
    return json.dumps(iso_times(data), default=str, allow_nan=False)


def is_time_key(key: object) -> bool:
    """Our JSON names a point in time ``at`` or ``<something>_at`` (``created_at``, ``started_at``)."""
    return isinstance(key, str) and (key == "at" or key.endswith("_at"))


def iso_time(epoch: float) -> str:
    """Seconds since the epoch as ISO 8601 UTC with milliseconds: ``2026-11-24T05:40:00.123Z``."""
    import datetime

    moment = datetime.datetime.fromtimestamp(epoch, tz=datetime.timezone.utc)
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def iso_times(data: Any) -> Any:
    """``data`` with every epoch number under a time key (``is_time_key``) as an ISO 8601 UTC string;
    other values, and times already given as text, unchanged."""
    if isinstance(data, dict):
        return {k: _iso_if_time(k, v) for k, v in data.items()}
    if isinstance(data, (list, tuple)):
        return [iso_times(v) for v in data]
    return data


def _iso_if_time(key: object, value: Any) -> Any:
    numeric = isinstance(value, (int, float)) and not isinstance(value, bool)
    if is_time_key(key) and numeric and math.isfinite(value):
        return iso_time(value)
    return iso_times(value)


# Columns whose values must read whole at any terminal width: ids and states. Others fold onto more
# lines rather than being cut with "…".
KEY_COLUMNS = frozenset({"id", "job", "agent", "state", "ended", "#", "attempt", "slot", "exit code", "Status"})


def print_table(
    title: str | None, columns: Sequence[str], rows: Iterable[Sequence[Any]], *, console: Any = None
) -> None:
    """A rich table; values in ``KEY_COLUMNS`` are never cut or wrapped, the others fold."""
    from rich.console import Console
    from rich.table import Table

    cells = [["" if v is None else str(v) for v in row] for row in rows]
    table = Table(title=title, show_lines=False)
    for index, col in enumerate(columns):
        if col in KEY_COLUMNS:
            widest = max((_longest_line(row[index]) for row in cells if index < len(row)), default=0)
            table.add_column(col, no_wrap=True, min_width=max(widest, len(col)))
        else:
            table.add_column(col, overflow="fold")
    for row in cells:
        table.add_row(*row)
    (console or Console()).print(table)


def _longest_line(text: str) -> int:
    """Width of the longest line of a cell as the table shows it (markup such as ``[green]`` is styling)."""
    from rich.cells import cell_len
    from rich.errors import MarkupError
    from rich.text import Text

    try:
        plain = Text.from_markup(text).plain
    except MarkupError:
        plain = text
    return max((cell_len(line) for line in plain.splitlines()), default=0)
