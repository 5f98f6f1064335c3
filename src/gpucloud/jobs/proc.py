"""Reading ``/proc``: process state, parent and group, for the supervisor and the guard.

Kept apart from ``process_group`` so the guard (``guard.py``) imports it once at start: a module
imported for the first time inside a signal handler can meet itself half-initialised.
"""

from __future__ import annotations

import collections
from pathlib import Path

PROC = Path("/proc")


def stat_fields(pid: int) -> list[str] | None:
    try:
        raw = (PROC / str(pid) / "stat").read_text()
    except (FileNotFoundError, ProcessLookupError, PermissionError, NotADirectoryError):
        return None
    # The command name (field 2) may contain spaces and parentheses; split after the last ')'.
    rest = raw[raw.rfind(")") + 2 :].split()
    return rest  # rest[0] = state, rest[1] = ppid, rest[2] = pgrp, rest[19] = starttime


def state(pid: int) -> str | None:
    stat = stat_fields(pid)
    return stat[0] if stat else None


def same_process(pid: int, start: str) -> bool:
    stat = stat_fields(pid)
    return stat is not None and stat[19] == start and stat[0] != "Z"


def pids_in_group(pgid: int) -> list[int]:
    found = []
    for entry in PROC.iterdir():
        if entry.name.isdigit():
            stat = stat_fields(int(entry.name))
            if stat and int(stat[2]) == pgid:
                found.append(int(entry.name))
    return found


def descendants(root: int) -> dict[int, str]:
    if not PROC.exists():
        return {}
    children: dict[int, list[int]] = collections.defaultdict(list)
    starts: dict[int, str] = {}
    for entry in PROC.iterdir():
        if not entry.name.isdigit():
            continue
        stat = stat_fields(int(entry.name))
        if stat is None:
            continue
        children[int(stat[1])].append(int(entry.name))
        starts[int(entry.name)] = stat[19]
    found: dict[int, str] = {}
    stack = list(children.get(root, []))
    while stack:
        pid = stack.pop()
        if pid in found or pid not in starts:
            continue
        found[pid] = starts[pid]
        stack.extend(children.get(pid, []))
    return found
