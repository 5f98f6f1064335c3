"""Opening a file that someone else controls (a job's control files, its log, a checkpoint's LATEST).

Such a path can name a FIFO (opening it blocks until a writer comes: forever), a device (``/dev/zero``
never ends), a directory, or a file far larger than the few bytes expected. ``open_regular`` opens
without blocking (``O_NONBLOCK``, which changes nothing for a regular file) and refuses anything but a
regular file; ``read_regular`` also refuses one larger than the caller's limit, and never reads more
than that limit plus one byte, even from a file that grows while it is read.

Both raise ``NotRegularFile`` (an ``OSError``, so callers that already handle an unreadable file
handle these too) naming the path and what it is.
"""

from __future__ import annotations

import errno
import os
import stat
from typing import BinaryIO

_KINDS = (
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISFIFO, "a FIFO"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
    (stat.S_ISLNK, "a symbolic link"),
)


class NotRegularFile(OSError):
    """The path is not a regular file, or one larger than allowed."""


def _kind(mode: int) -> str:
    return next((name for test, name in _KINDS if test(mode)), "not a regular file")


def open_regular(path: str | os.PathLike[str], *, follow_links: bool = True) -> BinaryIO:
    """``path`` opened for binary reading, only if it is a regular file (``follow_links=False``: and
    not a symbolic link). FileNotFoundError as usual for a missing one."""
    flags = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)
    if not follow_links:
        flags |= os.O_NOFOLLOW
    try:
        fd = os.open(path, flags)
    except OSError as err:
        if err.errno == errno.ELOOP and not follow_links:
            raise NotRegularFile(errno.ELOOP, "a symbolic link, not a regular file", str(path)) from None
        if err.errno == errno.ENXIO:  # a socket (or a FIFO opened for writing): cannot be opened at all
            mode = os.stat(path).st_mode
            raise NotRegularFile(errno.ENXIO, f"{_kind(mode)}, not a regular file", str(path)) from None
        raise
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise NotRegularFile(errno.EINVAL, f"{_kind(mode)}, not a regular file", str(path))
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def read_regular(path: str | os.PathLike[str], limit: int, *, follow_links: bool = True) -> bytes:
    """The bytes of the regular file ``path``, at most ``limit`` of them (NotRegularFile beyond)."""
    with open_regular(path, follow_links=follow_links) as fh:
        data = fh.read(limit + 1)
    if len(data) > limit:
        raise NotRegularFile(errno.EFBIG, f"larger than the {limit} bytes allowed", str(path))
    return data
