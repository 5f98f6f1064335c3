"""Run a command in its own process group, and make sure all of it is gone when we stop it.

The command (typically ``torchrun``) is started as a new session, so signals for the supervisor
(a terminal's Ctrl-C) do not reach it directly and one ``killpg`` reaches the whole group. torchrun
starts each worker in a session of its own, though, so a ``killpg`` alone would orphan the ranks
when torchrun dies first; we therefore also remember every descendant we have seen (from
``/proc``, refreshed on each poll) and signal their groups too. The command's stdout and stderr
both go to ``sink`` (our stderr by default: our own stdout is reserved for ``--output json``),
and the last lines are kept for the failure reason. torchrun's ``ChildFailedError`` report for
ranks that exited 75 (a requeue) is replaced by one line (``torchrun_output.py``).

On Linux the command runs under the guard (``guard.py``), the group's leader: it exits with the
command's status, and takes the whole tree (ranks in other sessions included) down with it when
this process dies, even of SIGKILL. ``PR_SET_PDEATHSIG`` follows the *thread* that started the
guard, so that thread must outlive the group (the runner's does: it waits for the group).
"""

from __future__ import annotations

import collections
import os
import shutil
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Protocol

from gpucloud.jobs import guard
from gpucloud.jobs.proc import PROC as _PROC
from gpucloud.jobs.proc import descendants as _descendants
from gpucloud.jobs.proc import pids_in_group as _pids_in_group
from gpucloud.jobs.proc import same_process as _same_process
from gpucloud.jobs.proc import state as _state
from gpucloud.jobs.torchrun_output import RequeueReportFilter

TAIL_LINES = 20


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
        save_grace: float = 0.0,
    ) -> None:
        """``save_grace``: if this process dies, the seconds the command gets to save and exit
        after its ranks are flagged, before the guard kills it (0: killed at once)."""
        self.argv = list(argv)
        self._sink = sink
        self._tail: collections.deque[str] = collections.deque(maxlen=TAIL_LINES)
        _check_startable(self.argv[0], cwd, env)
        try:
            self._proc = subprocess.Popen(
                _guarded(self.argv, save_grace),
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
        except (FileNotFoundError, NotADirectoryError, PermissionError) as err:
            raise CommandNotFound(_why_not_started(self.argv[0], cwd, err)) from err
        self.pid = self._proc.pid
        self.pgid = self.pid  # start_new_session: the leader's pid is the group id
        self._seen: dict[int, str] = {}  # pid -> /proc start time (guards against pid reuse)
        self._pump = threading.Thread(target=self._forward_output, name=f"output-{self.pid}", daemon=True)
        self._pump.start()
        self.refresh_descendants()

    # -- output -----------------------------------------------------------------------------

    def _forward_output(self) -> None:
        assert self._proc.stdout is not None
        requeue_report = RequeueReportFilter()  # torchrun's traceback for ranks that exited 75 is no error
        for line in self._proc.stdout:
            self._emit(requeue_report.feed(line))
        self._emit(requeue_report.close())

    def _emit(self, lines: list[str]) -> None:
        for line in lines:
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


# The guard imports the very gpucloud this process runs (a checkout on PYTHONPATH included), not
# whichever one ``-I`` would find installed.
_GUARD_ENTRY = (
    "import sys; sys.path.insert(0, sys.argv.pop(1)); from gpucloud.jobs.guard import main; main(sys.argv[1:])"
)


def _guarded(argv: list[str], save_grace: float) -> list[str]:
    """``argv`` run under the guard (``guard.py``), so the whole tree dies with this process.
    ``-I``: the job's PYTHON* variables must not change which gpucloud the guard imports."""
    if not guard.available():
        return argv
    grace = ["--save-grace", f"{save_grace:g}"] if save_grace > 0 else []
    package_root = str(Path(guard.__file__).resolve().parents[2])
    return [sys.executable, "-I", "-c", _GUARD_ENTRY, package_root, str(os.getpid()), *grace, "--", *argv]


def _check_startable(program: str, cwd: str | os.PathLike[str] | None, env: dict[str, str]) -> None:
    """Refuse, before anything starts, a working directory that is not there or a program that
    cannot be found the way ``execvp`` looks for it (the guard would only exit 127)."""
    if cwd is not None and not os.path.isdir(cwd):
        problem = "is not a directory" if os.path.exists(cwd) else "does not exist"
        raise CommandNotFound(
            f"working directory {os.fspath(cwd)!r} {problem} on this node; the command {program!r} was not started"
        )
    if "/" in program:
        path = os.path.join(cwd or ".", program)
        if not os.path.exists(path):
            raise CommandNotFound(f"command not found: {program!r} (No such file or directory)")
        if os.path.isdir(path) or not os.access(path, os.X_OK):
            raise CommandNotFound(f"command not executable: {program!r} (Permission denied)")
    elif shutil.which(program, path=env.get("PATH", os.defpath)) is None:
        raise CommandNotFound(f"command not found: {program!r} (not on the command's PATH)")


def _why_not_started(program: str, cwd: str | os.PathLike[str] | None, err: OSError) -> str:
    """Name what was missing: Popen reports a working directory it cannot enter with the same
    errors as a missing program (its ``filename`` is then the directory)."""
    if cwd is not None and err.filename is not None and os.fspath(err.filename) == os.fspath(cwd):
        problem = "does not exist" if isinstance(err, FileNotFoundError) else f"cannot be entered ({err.strerror})"
        return f"working directory {os.fspath(cwd)!r} {problem} on this node; the command {program!r} was not started"
    if isinstance(err, FileNotFoundError):
        return f"command not found: {program!r} ({err.strerror})"
    return f"command not executable: {program!r} ({err.strerror})"


def _group_exists(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # Zombies count for killpg; a group made only of zombies is gone for our purposes.
    return any(_state(pid) not in (None, "Z") for pid in _pids_in_group(pgid)) if _PROC.exists() else True
