"""Run a command in its own process group, and make sure all of it is gone when we stop it.

The command (typically ``torchrun``) is started as a new session, so signals for the supervisor
(a terminal's Ctrl-C) do not reach it directly and one ``killpg`` reaches the whole group. torchrun
starts each worker in a session of its own, though, so a ``killpg`` alone would orphan the ranks
when torchrun dies first; we therefore also remember every descendant we have seen (from
``/proc``, refreshed on each poll) and signal their groups too. The command's stdout and stderr
both go to ``sink`` (our stderr by default: our own stdout is reserved for ``--output json``),
and the last lines are kept for the failure reason.
"""

from __future__ import annotations

import collections
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Protocol

TAIL_LINES = 20
_PROC = Path("/proc")


class OutputSink(Protocol):
    """Where the command's output goes: a text file, or anything that writes and flushes text."""

    def write(self, text: str, /) -> int: ...
    def flush(self) -> None: ...


class ProcessGroup:
    def __init__(
        self,
        argv: list[str],
        *,
        env: dict[str, str],
        cwd: str | os.PathLike[str] | None = None,
        sink: OutputSink | None = None,
    ) -> None:
        self.argv = list(argv)
        self._sink = sink
        self._tail: collections.deque[str] = collections.deque(maxlen=TAIL_LINES)
        try:
            self._proc = subprocess.Popen(
                self.argv,
                env=env,
                cwd=cwd,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                text=True,
                errors="replace",
                bufsize=1,
            )
        except FileNotFoundError as err:
            raise CommandNotFound(f"command not found: {self.argv[0]!r} ({err.strerror})") from err
        except PermissionError as err:
            raise CommandNotFound(f"command not executable: {self.argv[0]!r} ({err.strerror})") from err
        self.pid = self._proc.pid
        self.pgid = self.pid  # start_new_session: the leader's pid is the group id
        self._seen: dict[int, str] = {}  # pid -> /proc start time (guards against pid reuse)
        self._pump = threading.Thread(target=self._forward_output, name=f"output-{self.pid}", daemon=True)
        self._pump.start()
        self.refresh_descendants()

    # -- output -----------------------------------------------------------------------------

    def _forward_output(self) -> None:
        assert self._proc.stdout is not None
        for line in self._proc.stdout:
            self._tail.append(line.rstrip("\n"))
            sink = self._sink or sys.stderr
            try:
                sink.write(line)
                sink.flush()
            except ValueError:  # sink closed under us (shutdown); keep draining so the child never blocks
                pass

    def tail(self) -> list[str]:
        return list(self._tail)

    # -- state ------------------------------------------------------------------------------

    def poll(self) -> int | None:
        """The leader's exit code (negative: killed by that signal), or None while it runs."""
        return self._proc.poll()

    def wait(self, timeout: float | None = None) -> int:
        code = self._proc.wait(timeout)
        self._pump.join(timeout=5)
        return code

    def refresh_descendants(self) -> None:
        """Remember every live descendant of the leader (cheap: one pass over /proc)."""
        for pid, start in _descendants(self.pid).items():
            self._seen.setdefault(pid, start)

    def alive(self) -> bool:
        """Whether anything we started still runs (the group, or a descendant in another session)."""
        if self._proc.poll() is None:
            return True
        if _group_exists(self.pgid):
            return True
        return any(_same_process(pid, start) for pid, start in self._seen.items())

    # -- stopping ---------------------------------------------------------------------------

    def send(self, sig: signal.Signals) -> None:
        """Send ``sig`` to our group and to the group of every descendant we have seen."""
        self.refresh_descendants()
        own = os.getpgrp()
        groups = {self.pgid}
        for pid, start in self._seen.items():
            if _same_process(pid, start):
                try:
                    groups.add(os.getpgid(pid))
                except ProcessLookupError:
                    pass
        for pgid in groups:
            if pgid == own or pgid <= 1:  # never signal ourselves or init
                continue
            try:
                os.killpg(pgid, sig)
            except (ProcessLookupError, PermissionError):
                pass

    def close(self) -> None:
        if self._proc.stdout is not None and not self._pump.is_alive():
            self._proc.stdout.close()


class CommandNotFound(Exception):
    """The command could not be started at all."""


def _group_exists(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # Zombies count for killpg; a group made only of zombies is gone for our purposes.
    return any(_state(pid) not in (None, "Z") for pid in _pids_in_group(pgid)) if _PROC.exists() else True


def _stat(pid: int) -> list[str] | None:
    try:
        raw = (_PROC / str(pid) / "stat").read_text()
    except (FileNotFoundError, ProcessLookupError, PermissionError, NotADirectoryError):
        return None
    # The command name (field 2) may contain spaces and parentheses; split after the last ')'.
    rest = raw[raw.rfind(")") + 2 :].split()
    return rest  # rest[0] = state, rest[1] = ppid, rest[2] = pgrp, rest[19] = starttime


def _state(pid: int) -> str | None:
    stat = _stat(pid)
    return stat[0] if stat else None


def _same_process(pid: int, start: str) -> bool:
    stat = _stat(pid)
    return stat is not None and stat[19] == start and stat[0] != "Z"


def _pids_in_group(pgid: int) -> list[int]:
    found = []
    for entry in _PROC.iterdir():
        if entry.name.isdigit():
            stat = _stat(int(entry.name))
            if stat and int(stat[2]) == pgid:
                found.append(int(entry.name))
    return found


def _descendants(root: int) -> dict[int, str]:
    if not _PROC.exists():
        return {}
    children: dict[int, list[int]] = collections.defaultdict(list)
    starts: dict[int, str] = {}
    for entry in _PROC.iterdir():
        if not entry.name.isdigit():
            continue
        stat = _stat(int(entry.name))
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
