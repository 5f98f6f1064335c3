"""A stored code archive built to hurt the node that unpacks it: link loops, headers that declare
gigabytes, a store entry that never ends. Each is one line (CodeUnavailable), at bounded memory,
and leaves nothing in the cache, so a job that holds one fails instead of killing every worker
that takes it."""

from __future__ import annotations

import gzip
import io
import os
import tarfile
import tracemalloc
from pathlib import Path

import boto3
import pytest

from gpucloud.jobs.code.store import CodeUnavailable, archive_limit
from gpucloud.jobs.code.unpack import cached_tree, unpack
from jobs.test_workdir_unpack import archive, tree_hash

LOOPS = {
    "a link to itself": [("a", "link", "a")],
    "two links to each other": [("a", "link", "b"), ("b", "link", "a")],
    "a loop through a directory": [("d/x", "link", "../e"), ("e", "link", "d/x")],
    "three links in a ring": [("a", "link", "b"), ("b", "link", "c"), ("c", "link", "a")],
    "a loop beside a file": [("f.txt", "file", "data"), ("z", "link", "z")],
}


@pytest.mark.parametrize("name", sorted(LOOPS))
def test_a_link_loop_is_one_line_not_a_crash(tmp_path: Path, name: str) -> None:
    members = sorted(LOOPS[name])
    path = archive(tmp_path / "loop.tar.gz", members)
    with pytest.raises(CodeUnavailable, match=r"in a loop|leads out of it"):
        unpack(path, tmp_path / "dest", sha256=tree_hash(members), size_bytes=10_000, name="s3://b/code/x.tar.gz")


def _header_bomb(path: Path, kind: bytes, declared: int) -> Path:
    """A gzip'd tar whose first header (GNU long name ``L``, long link ``K``, PAX ``x``/``g``)
    declares ``declared`` bytes of header data, then that many zeros: small on the disk."""
    info = tarfile.TarInfo("././@LongLink")
    info.type = kind
    info.size = declared
    block = info.tobuf(format=tarfile.GNU_FORMAT if kind in (b"L", b"K") else tarfile.USTAR_FORMAT)
    with gzip.open(path, "wb", compresslevel=1) as gz:
        gz.write(block)
        zeros = bytes(1 << 20)
        left = declared + (-declared % 512)
        while left > 0:
            gz.write(zeros[: min(left, len(zeros))])
            left -= len(zeros)
        body = io.BytesIO()
        with tarfile.open(fileobj=body, mode="w", format=tarfile.USTAR_FORMAT) as tar:
            member = tarfile.TarInfo("a.txt")
            member.size = 1
            tar.addfile(member, io.BytesIO(b"x"))
        gz.write(body.getvalue())
    return path


@pytest.mark.parametrize("kind", [tarfile.GNUTYPE_LONGNAME, tarfile.GNUTYPE_LONGLINK, tarfile.XHDTYPE, tarfile.XGLTYPE])
def test_a_header_that_declares_a_huge_size_is_refused_before_it_is_read(tmp_path: Path, kind: bytes) -> None:
    declared = 48 << 20
    path = _header_bomb(tmp_path / "bomb.tar.gz", kind, declared)
    assert path.stat().st_size < declared // 100  # small on the disk, large once read
    tracemalloc.start()
    try:
        with pytest.raises(CodeUnavailable, match=r"declares a header of"):
            unpack(path, tmp_path / "dest", sha256="0" * 64, size_bytes=10_000, name="s3://b/code/x.tar.gz")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 8 << 20, f"unpack held {peak >> 20} MiB for a refused header"


def _dev_zero(tmp_path: Path) -> str:
    return "/dev/zero"


def _link_to_dev_zero(tmp_path: Path) -> str:
    (tmp_path / "code.tar.gz").symlink_to("/dev/zero")
    return str(tmp_path / "code.tar.gz")


def _fifo(tmp_path: Path) -> str:
    os.mkfifo(tmp_path / "code.tar.gz")
    return str(tmp_path / "code.tar.gz")


def _sparse_and_huge(tmp_path: Path) -> str:
    path = tmp_path / "code.tar.gz"
    with open(path, "wb") as fh:
        fh.truncate(archive_limit(1000) + 1)  # a hole: nothing written, yet larger than allowed
    return str(path)


def _a_directory(tmp_path: Path) -> str:
    (tmp_path / "code.tar.gz").mkdir()
    return str(tmp_path / "code.tar.gz")


SOURCES = {
    "/dev/zero": _dev_zero,
    "a link to /dev/zero": _link_to_dev_zero,
    "a FIFO": _fifo,
    "a file larger than the record allows": _sparse_and_huge,
    "a directory": _a_directory,
}


@pytest.mark.parametrize("name", sorted(SOURCES))
def test_a_store_entry_is_fetched_no_further_than_the_recorded_size_allows(tmp_path: Path, name: str) -> None:
    uri = SOURCES[name](tmp_path)
    cache = tmp_path / "cache"
    with pytest.raises(CodeUnavailable) as err:
        cached_tree(uri, "a" * 64, 1000, cache)
    line = str(err.value)
    assert "\n" not in line and uri in line
    assert "not a regular file" in line or "recorded size allows" in line, line  # stopped at the fetch
    assert [p.name for p in (cache / "code").iterdir() if not p.name.endswith(".lock")] == []


def test_an_s3_object_larger_than_the_record_allows_is_not_downloaded(fresh_aws_account, tmp_path: Path) -> None:
    s3 = boto3.client("s3", region_name="us-east-1")
    s3.create_bucket(Bucket="ckpt")
    s3.put_object(Bucket="ckpt", Key="code/x.tar.gz", Body=bytes(archive_limit(10) + 1))
    with pytest.raises(CodeUnavailable, match=r"larger than the \d+ bytes its recorded size allows"):
        cached_tree("s3://ckpt/code/x.tar.gz", "b" * 64, 10, tmp_path / "cache")
