"""Printing helpers shared by CLI commands: JSON for machines, rich tables for humans."""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Iterable, Sequence
from typing import Any

import click

OUTPUT_OPTION_HELP = "Output format: a human-readable table, or JSON for scripts."

# Characters a terminal acts on rather than shows: C0 controls (ESC starts the sequences that move
# the cursor, retitle the window or, with OSC 52, write the reader's clipboard), DEL, C1 controls
# (0x9b is a one-byte CSI on some terminals) and the Unicode bidirectional overrides that reorder
# what is read. Text from a job (its name, command, output, failure reason, event kinds) can hold
# any of them, and anyone reading a shared queue would run them.
_BIDI = "\u061c\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069"
_UNSAFE = frozenset([chr(c) for c in range(0x20)] + [chr(c) for c in range(0x7F, 0xA0)] + list(_BIDI))


def terminal_safe(text: str, keep: str = "") -> str:
    """``text`` with every character a terminal would act on shown as an escape (``\\x1b``,
    ``\\u202e``) instead; the characters in ``keep`` (e.g. newline) pass as they are. For what is
    printed to a person; files and JSON keep the raw text."""
    if not any(ch in _UNSAFE and ch not in keep for ch in text):
        return text
    out = []
    for ch in text:
        if ch in _UNSAFE and ch not in keep:
            out.append(f"\\x{ord(ch):02x}" if ord(ch) < 0x100 else f"\\u{ord(ch):04x}")
        else:
            out.append(ch)
    return "".join(out)


def plain_markup(text: object) -> str:
    """Untrusted text made safe to put inside a rich markup string: terminal controls escaped, and
    ``[`` escaped so that a name like ``[/x]`` is printed, not read as a (broken) style tag."""
    from rich.markup import escape

    return escape(terminal_safe(str(text), keep="\n"))


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
        try:
            return iso_time(value)
        except (OverflowError, ValueError, OSError):  # beyond year 9999 (a row edited to 1e308): the number
            return value
    return iso_times(value)


# Columns whose values must read whole at any terminal width: ids and states. Others fold onto more
# lines rather than being cut with "…"; when even folded they do not fit, the rightmost are left out
# (the caption names them; --output json has everything).
# "Type": an instance type (catalog show), a name to read whole
KEY_COLUMNS = frozenset({"id", "job", "agent", "state", "ended", "#", "attempt", "slot", "exit code", "Status", "Type"})
FOLD_FLOOR = 8  # narrowest a folding column is squeezed to before columns are left out


def print_table(
    title: str | None,
    columns: Sequence[str],
    rows: Iterable[Sequence[Any]],
    *,
    console: Any = None,
    markup: bool = True,
) -> None:
    """A rich table that fits the terminal without cutting a value of ``KEY_COLUMNS``. Terminal
    controls in cells are always shown escaped (``terminal_safe``); ``markup=False`` for cells that
    hold data rather than our own styling, so a ``[`` in them is printed as it is."""
    from rich.console import Console
    from rich.table import Table

    console = console or Console()
    cells = [["" if v is None else terminal_safe(str(v), keep="\n") for v in row] for row in rows]
    if not markup:
        from rich.markup import escape

        cells = [[escape(c) for c in row] for row in cells]
    natural = [
        max([len(col)] + [_longest_line(row[i]) for row in cells if i < len(row)]) for i, col in enumerate(columns)
    ]
    keys = [col in KEY_COLUMNS for col in columns]
    shown, widths = fit_columns(natural, keys, console.width)
    left_out = [col for i, col in enumerate(columns) if i not in shown]
    caption = (
        f"left out at {console.width} columns: {', '.join(left_out)} (--output json has them)" if left_out else None
    )
    table = Table(title=title, show_lines=False, caption=caption)
    for i in shown:
        if keys[i]:
            table.add_column(columns[i], no_wrap=True, min_width=natural[i])
        else:
            table.add_column(columns[i], overflow="fold", width=widths.get(i))
    for row in cells:
        table.add_row(*(row[i] if i < len(row) else "" for i in shown))
    console.print(table)


def fit_columns(natural: Sequence[int], keys: Sequence[bool], width: int) -> tuple[list[int], dict[int, int]]:
    """Which columns to show and the widths of the folding ones, so the table fits ``width``: key
    columns keep their natural width; folding ones share what is left (each at least ``FOLD_FLOOR``
    or its natural width), and the rightmost folding columns are left out when even that is too much."""
    shown = list(range(len(natural)))
    while True:
        chrome = 3 * len(shown) + 1  # a border per column and one more, a space of padding each side
        fixed = sum(natural[i] for i in shown if keys[i])
        folding = [i for i in shown if not keys[i]]
        if fixed + sum(natural[i] for i in folding) + chrome <= width:
            return shown, {}
        if not folding or fixed + sum(min(natural[i], FOLD_FLOOR) for i in folding) + chrome <= width:
            return shown, _share(width - chrome - fixed, {i: natural[i] for i in folding})
        shown.remove(folding[-1])


def _share(room: int, wanted: dict[int, int]) -> dict[int, int]:
    """Split ``room`` among columns: the narrow ones get all they want, the rest an equal share."""
    widths: dict[int, int] = {}
    for count, i in enumerate(sorted(wanted, key=wanted.__getitem__)):
        fair = max(1, (room - sum(widths.values())) // (len(wanted) - count))
        widths[i] = min(wanted[i], fair)
    return widths


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
