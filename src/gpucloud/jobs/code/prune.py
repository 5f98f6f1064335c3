"""Pruning a node's code cache: what ``--workdir`` snapshots and ``--setup`` venvs leave on its disk.

Every snapshot hash and every setup key a node prepares stays in ``<cache>`` (``attempt.node_cache_dir``)
after its attempt; a long-lived on-demand or capacity-block node would fill its disk with them and
then fail every job. So before each attempt is prepared, the supervisor prunes:

* by age: an entry nobody used for ``max_age_s`` (a week by default) goes;
* by free space: while the cache's filesystem has less than ``min_free_fraction`` of its size free
  (a tenth by default), the least recently used entries go, oldest first, until it has again;
* never an entry in use: a running attempt holds each entry it prepared (``hold``: a shared
  ``flock`` on ``<entry>.inuse``, released when the attempt ends, or when its process dies), and an
  entry being made holds its maker's exclusive ``<entry>.lock``. The pruner takes both, exclusively
  and without waiting, or leaves the entry alone.

The layout is read, not assumed: an entry is any directory one level under a directory of
``<cache>`` (``code/<sha256>``, ``envs/<key>``, or whatever else the cache holds), its last use the
newest modification time of the entry and of its ``.used`` file (``hold`` touches it). A pruned
entry is first renamed to ``.pruned-<name>`` in its directory, so a reader that holds it after the
rename finds it gone and prepares it again, never half of it; read-only directories inside it are
made writable to be removed. The empty ``.lock`` and ``.inuse`` files stay (a lock file removed
while another process opens it would let two makers in at once); the files that describe the entry
(its ``.used`` stamp, a sealed env's ``.manifest.json``) go with it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import fcntl
import logging
import os
import shutil
import stat
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import IO, Any

log = logging.getLogger("gpucloud.jobs")

IN_USE = ".inuse"
USED = ".used"  # touched by every hold: the entry's last use (the pruner never touches it)
MADE_UNDER = ".lock"  # unpack.node_lock's file beside each entry, held while the entry is made
PRUNED = ".pruned-"
DAY = 86400.0


@dataclasses.dataclass(frozen=True)
class PrunePolicy:
    max_age_s: float = 7 * DAY
    min_free_fraction: float = 0.10


@dataclasses.dataclass(frozen=True)
class Entry:
    path: Path
    last_used: float


@dataclasses.dataclass(frozen=True)
class Pruned:
    aged: list[Path]  # unused for longer than the policy's age
    for_space: list[Path]  # removed, least recently used first, to free the disk
    short_of_space: bool  # still under the free-space floor (everything else is in use)

    def describe(self, cache: Path, policy: PrunePolicy) -> str | None:
        """The supervisor's line about it; None when nothing was pruned and space is fine."""
        floor = f"{policy.min_free_fraction:.0%}"
        parts = []
        if self.aged:
            parts.append(f"pruned {len(self.aged)} unused for over {policy.max_age_s / DAY:g} days")
        if self.for_space:
            parts.append(f"pruned {len(self.for_space)} least recently used, to keep {floor} of the disk free")
        if self.short_of_space:
            parts.append(f"the disk is still under {floor} free, and what is left is in use")
        return f"node cache {cache}: " + "; ".join(parts) if parts else None


def entry_order(entries: Sequence[Entry], *, now: float, max_age_s: float) -> tuple[list[Entry], list[Entry]]:
    """(entries past the age, the others least recently used first): the pruner's order (pure)."""
    ordered = sorted(entries, key=lambda e: (e.last_used, str(e.path)))
    aged = [e for e in ordered if now - e.last_used > max_age_s]
    return aged, [e for e in ordered if now - e.last_used <= max_age_s]


def free_enough(usage: Any, fraction: float) -> bool:
    """``usage``: ``shutil.disk_usage``'s answer (total, used, free)."""
    return usage.free >= fraction * usage.total


def entries(cache: Path) -> list[Entry]:
    """Every entry of the cache, whatever its layout (see the module's docstring)."""
    found = []
    for kind in _dirs(cache):
        for path in _dirs(kind):
            if path.name.startswith("."):
                continue
            found.append(Entry(path, _last_used(path)))
    return found


def prune(
    cache: Path,
    policy: PrunePolicy = PrunePolicy(),
    *,
    now: float | None = None,
    disk_usage: Callable[[Path], Any] = shutil.disk_usage,
) -> Pruned:
    """Remove what the policy says from ``cache``, never an entry in use; what was removed."""
    if not cache.is_dir():
        return Pruned([], [], False)
    for kind in _dirs(cache):  # a prune that died half-way left these; nobody can hold them
        for leftover in kind.glob(f"{PRUNED}*"):
            _remove_tree(leftover)
    now = time.time() if now is None else now
    aged, recent = entry_order(entries(cache), now=now, max_age_s=policy.max_age_s)
    removed_aged = [e.path for e in aged if _remove_unless_held(e.path)]
    removed_for_space: list[Path] = []
    short = not free_enough(disk_usage(cache), policy.min_free_fraction)
    for entry in recent if short else []:
        if _remove_unless_held(entry.path):
            removed_for_space.append(entry.path)
        if free_enough(disk_usage(cache), policy.min_free_fraction):
            short = False
            break
    return Pruned(removed_aged, removed_for_space, short)


@contextlib.contextmanager
def _held_by_nobody(entry: Path) -> Iterator[bool]:
    """True (and both locks held until the end) when no process holds ``entry`` or is making it."""
    with contextlib.ExitStack() as locks:
        for suffix in (IN_USE, MADE_UNDER):
            handle = locks.enter_context(open(entry.with_name(entry.name + suffix), "a"))
            if not _try_lock(handle, fcntl.LOCK_EX):
                yield False
                return
        yield True


def _remove_unless_held(entry: Path) -> bool:
    # A name of its own: another pruner may still be removing an earlier copy of this entry.
    doomed = entry.with_name(f"{PRUNED}{entry.name}-{os.getpid()}-{time.monotonic_ns()}")
    try:
        with _held_by_nobody(entry) as free:
            if not free or not entry.is_dir():
                return False
            os.replace(entry, doomed)
            for sidecar in _sidecars(entry):
                with contextlib.suppress(FileNotFoundError):
                    sidecar.unlink()
    except OSError as err:  # a disk that is read-only or gone: the attempt's own preparation reports it
        log.warning("cannot prune %s from the node cache: %s", entry, err)
        return False
    _remove_tree(doomed)
    return True


def _sidecars(entry: Path) -> list[Path]:
    """The files beside ``entry`` that describe it (``<entry>.used``, a sealed env's
    ``<entry>.manifest.json``), which go with it; never its ``.lock`` and ``.inuse`` files."""
    keep = {entry.name + MADE_UNDER, entry.name + IN_USE}
    prefix = entry.name + "."
    return [p for p in entry.parent.iterdir() if p.name.startswith(prefix) and p.name not in keep and p.is_file()]


def hold(entry: Path, holds: contextlib.ExitStack) -> bool:
    """Mark ``entry`` in use until ``holds`` closes (a shared lock the pruner cannot take), and
    record this use. False when the entry is gone (pruned just before): prepare it again."""
    handle = holds.enter_context(open(entry.with_name(entry.name + IN_USE), "a"))  # noqa: SIM115 - closed by holds
    fcntl.flock(handle, fcntl.LOCK_SH)  # waits only while a pruner is deciding on this very entry
    if not entry.is_dir():
        return False
    entry.with_name(entry.name + USED).touch()
    return True


def _try_lock(handle: IO[str], how: int) -> bool:
    try:
        fcntl.flock(handle, how | fcntl.LOCK_NB)
    except OSError as err:
        if err.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
            return False
        raise
    return True


def _dirs(path: Path) -> list[Path]:
    try:
        return sorted(p for p in path.iterdir() if p.is_dir() and not p.is_symlink())
    except OSError:
        return []


def _last_used(entry: Path) -> float:
    times = []
    for path in (entry, entry.with_name(entry.name + USED)):
        with contextlib.suppress(OSError):
            times.append(path.stat().st_mtime)
    return max(times, default=0.0)


def _remove_tree(path: Path) -> None:
    try:
        shutil.rmtree(path)
        return
    except OSError:
        if not path.exists():
            return  # another pruner removed it meanwhile
    # Read-only directories (a cache made read-only against the jobs that run from it) cannot have
    # their entries removed until they are writable again.
    for directory in [path, *(Path(root) / name for root, dirs, _ in os.walk(path) for name in dirs)]:
        with contextlib.suppress(OSError):
            if not directory.is_symlink():
                os.chmod(directory, stat.S_IMODE(directory.lstat().st_mode) | stat.S_IRWXU)
    try:
        shutil.rmtree(path)
    except OSError as err:
        if path.exists():
            log.warning("cannot remove %s from the node cache: %s", path, err)
