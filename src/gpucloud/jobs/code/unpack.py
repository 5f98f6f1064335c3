"""A node's side of a snapshot: fetch it, unpack it safely, verify its hash, cache it, copy it per attempt.

The archive comes from the job's record, written by whoever could submit, so it is treated as
hostile: every member must be a regular file or a link with a canonical relative name (no ``..``,
no absolute path, nothing under a link, no repeats, in sorted order, as ``snapshot.build`` writes
them), links must resolve inside the tree (checked on the disk once all exist, so a chain of links
cannot leave it), the content may not exceed what the job recorded, and the tree's hash must be the
one the job recorded. Anything else is ``CodeUnavailable`` with one line: the attempt fails with it
as its reason, and nothing is left half-unpacked in the cache.

Cache: ``<cache>/code/<hash>/tree`` is unpacked once per node per hash (a lock file serialises
the members of a gang that share a host). Each attempt gets a *copy* of it, not hard links: jobs
run as root on the nodes, where a file opened for writing through a hard link would change the
cached tree for every later attempt.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import posixpath
import shutil
import tarfile
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path

from gpucloud.jobs.code.snapshot import TreeHash, file_mode, human_size
from gpucloud.jobs.code.store import CodeUnavailable, archive_limit, fetch

READY = "ready"  # written last: a cached tree without it is a leftover, unpacked again
_MAX_MEMBERS = 200_000
# A GNU long name or a PAX header is read whole into memory, at whatever size its header declares:
# a 1.5 MB archive could declare 1.5 GiB. snapshot.build writes PAX headers of a path or two.
MAX_HEADER_BYTES = 64 << 10
_HEADER_TYPES = (
    tarfile.GNUTYPE_LONGNAME,
    tarfile.GNUTYPE_LONGLINK,
    tarfile.XHDTYPE,
    tarfile.XGLTYPE,
    tarfile.SOLARIS_XHDTYPE,
)
_FILE_TYPES = (tarfile.REGTYPE, tarfile.AREGTYPE)  # not sparse, not contiguous: build() writes neither


class _HeaderTooLarge(Exception):
    pass


class _BoundedInfo(tarfile.TarInfo):
    """A member header whose long-name or PAX data is refused above ``MAX_HEADER_BYTES`` before
    tarfile reads it (``TarFile(tarinfo=...)`` is the documented way to give tarfile its own class)."""

    def _proc_member(self, tarfile: tarfile.TarFile) -> tarfile.TarInfo:
        if self.type in _HEADER_TYPES and self.size > MAX_HEADER_BYTES:
            raise _HeaderTooLarge(f"a header of {human_size(self.size)} (at most {human_size(MAX_HEADER_BYTES)})")
        return super()._proc_member(tarfile)  # type: ignore[misc]


@contextlib.contextmanager
def node_lock(path: Path) -> Iterator[None]:
    """An exclusive lock on ``path`` between the processes of this node (released when closed)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        yield


def cached_tree(uri: str, sha256: str, size_bytes: int, cache: Path) -> tuple[Path, bool]:
    """The verified tree of snapshot ``sha256`` in this node's cache; (path, whether it was cached)."""
    base = cache / "code" / sha256
    tree = base / "tree"
    if (base / READY).exists():
        return tree, True
    with node_lock(cache / "code" / f"{sha256}.lock"):
        if (base / READY).exists():
            return tree, True
        shutil.rmtree(base, ignore_errors=True)
        base.mkdir(parents=True)
        try:
            archive = base / "archive.tar.gz"
            fetch(uri, archive, max_bytes=archive_limit(size_bytes))
            unpack(archive, tree, sha256=sha256, size_bytes=size_bytes, name=uri)
            archive.unlink()
            (base / READY).write_text(sha256 + "\n")
        except BaseException:
            shutil.rmtree(base, ignore_errors=True)
            raise
    return tree, False


def copy_tree(tree: Path, dest: Path) -> None:
    """The attempt's own copy (links copied as links)."""
    if dest.exists():
        shutil.rmtree(dest)
    shutil.copytree(tree, dest, symlinks=True)


def unpack(archive: Path, dest: Path, *, sha256: str, size_bytes: int, name: str) -> None:
    """Unpack ``archive`` into the new directory ``dest`` and verify it, or raise ``CodeUnavailable``."""
    dest.mkdir(parents=True)
    try:
        digest = _extract(archive, dest, size_bytes, name)
    except _HeaderTooLarge as err:
        raise CodeUnavailable(f"the job's code {name} declares {err} (refused)") from None
    except (tarfile.TarError, EOFError, zlib.error, OSError) as err:
        detail = getattr(err, "strerror", None) or " ".join(str(err).split()) or type(err).__name__
        raise CodeUnavailable(f"the job's code {name} is not a readable archive: {detail}") from None
    if digest != sha256:
        raise CodeUnavailable(
            f"the job's code {name} does not match the hash the job recorded (got {digest[:12]}, "
            f"expected {sha256[:12]}): it was changed or damaged after submit"
        )


def _extract(archive: Path, dest: Path, size_bytes: int, name: str) -> str:
    tree = TreeHash()
    seen: set[str] = set()
    links: list[tuple[str, str]] = []
    total = 0
    with tarfile.open(archive, mode="r:gz", tarinfo=_BoundedInfo) as tar:
        for count, member in enumerate(tar, start=1):
            path = member.name
            if count > _MAX_MEMBERS:
                raise CodeUnavailable(f"the job's code {name} has over {_MAX_MEMBERS} members")
            _check_name(path, seen, links, name)
            seen.add(path)
            if member.issym():
                _check_link_target(path, member.linkname, name)
                links.append((path, member.linkname))
                _hash_in_order(tree.add_link, name, path, member.linkname)
                continue
            if member.type not in _FILE_TYPES:
                raise CodeUnavailable(
                    f"the job's code {name} holds {path!r}, which is neither a file nor a link (refused)"
                )
            total += member.size
            if total > size_bytes:
                raise CodeUnavailable(
                    f"the job's code {name} unpacks to more than the {human_size(size_bytes)} the job recorded"
                )
            source = tar.extractfile(member)
            data = source.read() if source is not None else b""
            mode = file_mode(member.mode)
            _hash_in_order(tree.add_file, name, path, mode, data)
            written = dest / path
            written.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(written, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, mode)
            with os.fdopen(fd, "wb") as out:
                out.write(data)
            os.chmod(written, mode)  # the umask must not change what the job sees
    for path, target in links:  # after every file: no file is ever written through a link
        link = dest / path
        link.parent.mkdir(parents=True, exist_ok=True)
        os.symlink(target, link)
    root = dest.resolve()
    for path, target in links:  # on the disk, so a chain of links cannot lead out either
        try:
            resolved = (dest / path).resolve(strict=False)
        except (RuntimeError, OSError):  # "Symlink loop" (RuntimeError before Python 3.13), ELOOP
            raise CodeUnavailable(f"the job's code {name} holds a link {path!r} -> {target!r} in a loop") from None
        if not resolved.is_relative_to(root):
            raise CodeUnavailable(f"the job's code {name} holds a link {path!r} -> {target!r} that leads out of it")
    return tree.hexdigest()


def _hash_in_order(add: Callable[..., None], name: str, *args: object) -> None:
    try:
        add(*args)
    except ValueError:  # TreeHash: not in the sorted order build() writes
        raise CodeUnavailable(f"the job's code {name} is not a gpucloud snapshot (members out of order)") from None


def _check_name(path: str, seen: set[str], links: list[tuple[str, str]], name: str) -> None:
    canonical = posixpath.normpath(path)
    if (
        not path
        or path != canonical
        or posixpath.isabs(path)
        or path in (".", "..")
        or path.startswith("../")
        or "\\" in path
        or "\x00" in path
    ):
        raise CodeUnavailable(f"the job's code {name} holds a member named {path[:80]!r}, outside its tree (refused)")
    if path in seen:
        raise CodeUnavailable(f"the job's code {name} holds {path!r} twice (refused)")
    for link, _ in links:
        if path.startswith(link + "/"):
            raise CodeUnavailable(f"the job's code {name} holds {path!r} under the link {link!r} (refused)")


def _check_link_target(path: str, target: str, name: str) -> None:
    lexical = posixpath.normpath(posixpath.join(posixpath.dirname(path), target))
    if not target or posixpath.isabs(target) or lexical == ".." or lexical.startswith("../"):
        raise CodeUnavailable(f"the job's code {name} holds a link {path!r} -> {target!r} out of its tree (refused)")
