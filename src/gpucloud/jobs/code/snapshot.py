"""A snapshot of a job's working directory: which files, their content hash, a reproducible archive.

What goes in: every regular file and symbolic link under the directory, except what its
``.gitignore`` files exclude (every level's, and those of the git repository it is in from the
repository's top down, with git's precedence: a deeper file's match wins, a ``!`` pattern
re-includes; an excluded directory is not entered, as git does not), and never
``.git`` (the repository's history is not code the job runs). Empty directories are left out, as
git leaves them out. A link must stay inside the directory (a relative target that resolves inside
it): the node unpacks the tree on a disk of its own, where a link to the submitter's
``/home/me/data`` means nothing.

The hash (``TreeHash``) is over the sorted relative paths, each entry's kind and mode (files are
0644 or 0755, as git records them) and its content or link target: the same tree gives the same
hash on any machine, whatever its mtimes, owners or umask. The archive (``<hash>.tar.gz``) is
deterministic too (sorted members, mtime 0, uid/gid 0, no user names, gzip header without name or
time), so the same tree is uploaded once and a node can verify what it unpacked against the hash.
"""

from __future__ import annotations

import dataclasses
import gzip
import hashlib
import io
import os
import posixpath
import stat
import tarfile
import tempfile
from pathlib import Path
from typing import Literal

from gpucloud.errors import UserError

DEFAULT_LIMIT_BYTES = 100 * 2**20  # uncompressed content; code, not data: data belongs in S3 or FSx
ARCHIVE_SUFFIX = ".tar.gz"
LIMIT_FLAG = "--max-workdir-size"
_HASH_VERSION = b"gpucloud-tree-v1\n"
_BIGGEST_NAMED = 3

EntryKind = Literal["file", "link"]


@dataclasses.dataclass(frozen=True)
class Entry:
    """One file or link of the tree: ``path`` is relative, '/'-separated."""

    path: str
    kind: EntryKind
    mode: int  # 0o644 or 0o755 for a file; 0o777 for a link
    size: int  # bytes of a file's content (0 for a link)
    target: str | None = None  # a link's target, relative


@dataclasses.dataclass(frozen=True)
class Snapshot:
    """What ``build`` made: the archive at ``archive``, named by the tree's hash."""

    sha256: str
    files: int
    size_bytes: int  # uncompressed content
    archive: Path

    @property
    def name(self) -> str:
        return archive_name(self.sha256)


def archive_name(sha256: str) -> str:
    return f"{sha256}{ARCHIVE_SUFFIX}"


def file_mode(st_mode: int) -> int:
    """Git's two file modes: executable by anyone, or not."""
    return 0o755 if st_mode & 0o111 else 0o644


class TreeHash:
    """The tree's content hash, fed entry by entry in path order (``build`` and the node's unpack
    both feed it, so both sides agree on what the hash means)."""

    def __init__(self) -> None:
        self._sha = hashlib.sha256(_HASH_VERSION)
        self._last: str | None = None

    def _header(self, kind: str, mode: int, path: str) -> None:
        if self._last is not None and path <= self._last:
            raise ValueError(f"entries out of order or repeated: {path!r} after {self._last!r}")
        self._last = path
        raw = path.encode()
        self._sha.update(f"{kind} {mode:o} {len(raw)}:".encode() + raw + b"\n")

    def add_file(self, path: str, mode: int, data: bytes) -> None:
        self._header("file", mode, path)
        self._sha.update(f"{len(data)}\n".encode())
        self._sha.update(data)

    def add_link(self, path: str, target: str) -> None:
        self._header("link", 0o777, path)
        raw = target.encode()
        self._sha.update(f"{len(raw)}:".encode() + raw + b"\n")

    def hexdigest(self) -> str:
        return self._sha.hexdigest()


# ------------------------------------------------------------------------------------ collecting


class _Ignores:
    """The ``.gitignore`` files that apply, outermost first. Paths are matched relative to ``top``:
    the repository the workdir is in (its nearest ancestor with a ``.git``), else the workdir."""

    def __init__(self, top: Path, offset: str, layers: tuple[tuple[str, object], ...] = ()) -> None:
        self.top, self.offset, self.layers = top, offset, layers

    def _full(self, rel: str) -> str:
        return f"{self.offset}/{rel}" if self.offset and rel else (self.offset or rel)

    def entering(self, rel_dir: str) -> _Ignores:
        """With the ``.gitignore`` of ``rel_dir`` (relative to the workdir) added, if it has one."""
        return self._adding(self._full(rel_dir))

    def _adding(self, base: str) -> _Ignores:
        found = self.top / base / ".gitignore" if base else self.top / ".gitignore"
        if not found.is_file():
            return self
        import pathspec

        try:
            lines = found.read_text(errors="replace").splitlines()
        except OSError as err:
            raise UserError(f"cannot read {found}: {err.strerror}") from None
        return _Ignores(self.top, self.offset, (*self.layers, (base, pathspec.GitIgnoreSpec.from_lines(lines))))

    def ignored(self, rel: str, is_dir: bool) -> bool:
        full = self._full(rel)
        for base, spec in reversed(self.layers):  # the deepest file that says anything decides
            sub = full[len(base) + 1 :] if base else full
            result = spec.check_file(sub + "/" if is_dir else sub)  # type: ignore[attr-defined]
            if result.include is not None:
                return bool(result.include)
        return False

    @classmethod
    def for_workdir(cls, root: Path) -> _Ignores:
        """The repository's ``.gitignore`` files from its top down to ``root``'s, as git applies them to
        ``root``'s files (``root`` itself is shipped even if an outer file ignores it: it was asked for)."""
        top = next((d for d in (root, *root.parents) if (d / ".git").exists()), root)
        offset = root.relative_to(top).as_posix() if top != root else ""
        ignores = cls(top, offset)
        parts = offset.split("/") if offset else []
        for depth in range(len(parts)):  # the repository's top, then each directory above root
            ignores = ignores._adding("/".join(parts[:depth]))
        return ignores.entering("")


def collect(root: Path) -> list[Entry]:
    """The tree's entries in path order, or a one-line ``UserError`` (unreadable, link out of it)."""
    root = root.resolve()
    if not root.is_dir():
        raise UserError(f"--workdir {root} is not a directory")
    entries: list[Entry] = []
    _walk(root, "", _Ignores.for_workdir(root), entries)
    return sorted(entries, key=lambda e: e.path)


def _walk(root: Path, rel_dir: str, ignores: _Ignores, out: list[Entry]) -> None:
    where = root / rel_dir if rel_dir else root
    try:
        children = sorted(os.scandir(where), key=lambda d: d.name)
    except OSError as err:
        raise UserError(f"cannot read the directory {where}: {err.strerror}") from None
    for child in children:
        if child.name == ".git":  # the repository (a directory, or a worktree's/submodule's file)
            continue
        rel = f"{rel_dir}/{child.name}" if rel_dir else child.name
        st = child.stat(follow_symlinks=False)
        is_dir = stat.S_ISDIR(st.st_mode)
        if ignores.ignored(rel, is_dir):
            continue
        _check_utf8(rel, "name")
        if is_dir:
            _walk(root, rel, ignores.entering(rel), out)
        elif stat.S_ISLNK(st.st_mode):
            out.append(Entry(rel, "link", 0o777, 0, _inside_target(root, rel, Path(child.path))))
        elif stat.S_ISREG(st.st_mode):
            out.append(Entry(rel, "file", file_mode(st.st_mode), st.st_size))
        # sockets, FIFOs and devices are no code: left out


def _check_utf8(rel: str, what: str, text: str | None = None) -> None:
    """A name the archive, the tree hash and every node can hold: UTF-8 (os.scandir hands back the
    bytes of any other name as lone surrogates, which no encoder writes)."""
    try:
        (rel if text is None else text).encode("utf-8")
    except UnicodeEncodeError:
        shown = os.fsencode(rel)
        raise UserError(
            f"--workdir: {shown!r} has a {what} that is not UTF-8; rename it, or add it to .gitignore"
        ) from None


def _inside_target(root: Path, rel: str, link: Path) -> str:
    target = os.readlink(link)
    _check_utf8(rel, "link target", target)
    lexical = posixpath.normpath(posixpath.join(posixpath.dirname(rel), target))
    try:
        resolved = link.resolve()
    except (RuntimeError, OSError):  # "Symlink loop" (RuntimeError before Python 3.13), ELOOP
        raise UserError(
            f"--workdir: {rel} is a link to {target}, in a loop of links; remove it, or add {rel} to .gitignore"
        ) from None
    if posixpath.isabs(target) or lexical.startswith("../") or lexical == ".." or not resolved.is_relative_to(root):
        raise UserError(
            f"--workdir: {rel} is a link to {target}, outside {root}; a snapshot keeps only links inside it "
            f"(copy what it points to in, or add {rel} to .gitignore)"
        )
    return target


def check_size(root: Path, entries: list[Entry], limit: int) -> int:
    """The content's total size, or a one-line ``UserError`` naming the biggest files when over ``limit``."""
    total = sum(e.size for e in entries)
    if total <= limit:
        return total
    biggest = sorted(entries, key=lambda e: (-e.size, e.path))[:_BIGGEST_NAMED]
    named = ", ".join(f"{e.path} ({human_size(e.size)})" for e in biggest)
    raise UserError(
        f"--workdir {root} holds {human_size(total)} to ship, over the {human_size(limit)} limit; biggest: {named}; "
        f"add what the job does not need to .gitignore (data belongs in S3 or FSx), or raise {LIMIT_FLAG}"
    )


def human_size(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


def parse_size(text: str) -> int:
    """'100MiB', '1.5 GiB', '500M', '2048' (bytes) -> bytes, or a one-line ``UserError``."""
    units = {"": 1, "b": 1, "k": 2**10, "kib": 2**10, "m": 2**20, "mib": 2**20, "g": 2**30, "gib": 2**30}
    raw = text.strip().lower().replace(" ", "")
    number = raw.rstrip("kmgib")
    unit = raw[len(number) :]
    try:
        value = float(number)
    except ValueError:
        value = -1.0
    if unit not in units or not value > 0 or value == float("inf"):
        raise UserError(f"{LIMIT_FLAG} {text!r} is not a size; give e.g. 100MiB, 1.5GiB, 500K or a number of bytes")
    return int(value * units[unit])


# -------------------------------------------------------------------------------------- archiving


def build(root: Path, out_dir: Path, *, limit: int = DEFAULT_LIMIT_BYTES) -> Snapshot:
    """Snapshot ``root`` into ``out_dir/<hash>.tar.gz`` (kept if it is already there)."""
    root = root.resolve()
    entries = collect(root)
    check_size(root, entries, limit)  # before reading anything: the sizes on the disk
    out_dir.mkdir(parents=True, exist_ok=True)
    tree = TreeHash()
    fd, tmp_name = tempfile.mkstemp(prefix=".snapshot-", suffix=ARCHIVE_SUFFIX, dir=out_dir)
    tmp = Path(tmp_name)
    try:
        with (
            os.fdopen(fd, "wb") as raw,
            gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0) as gz,
            tarfile.open(fileobj=gz, mode="w", format=tarfile.PAX_FORMAT) as tar,
        ):
            # The sizes read, not the ones listed: a file that grew meanwhile is what the node gets
            # (and checks against the recorded size), and must still fit the limit.
            read = [dataclasses.replace(e, size=_add(tar, tree, root, e)) for e in entries]
        total = check_size(root, read, limit)
        snapshot = Snapshot(tree.hexdigest(), sum(e.kind == "file" for e in entries), total, out_dir)
        final = out_dir / snapshot.name
        if final.exists():
            tmp.unlink()
        else:
            tmp.replace(final)
        return dataclasses.replace(snapshot, archive=final)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def _add(tar: tarfile.TarFile, tree: TreeHash, root: Path, entry: Entry) -> int:
    """Add ``entry`` to the archive and the hash; the bytes of content it added."""
    info = tarfile.TarInfo(entry.path)
    info.mtime, info.uid, info.gid, info.uname, info.gname = 0, 0, 0, "", ""
    info.mode = entry.mode
    if entry.kind == "link":
        assert entry.target is not None
        info.type, info.linkname = tarfile.SYMTYPE, entry.target
        tree.add_link(entry.path, entry.target)
        tar.addfile(info)
        return 0
    try:
        data = (root / entry.path).read_bytes()  # read once: the hash and the archive see the same bytes
    except OSError as err:
        raise UserError(f"--workdir: cannot read {entry.path}: {err.strerror}") from None
    info.size = len(data)
    tree.add_file(entry.path, entry.mode, data)
    tar.addfile(info, io.BytesIO(data))
    return len(data)
