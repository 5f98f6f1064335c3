"""A node unpacking a job's snapshot: the hash is verified, a hostile or damaged
archive (path traversal, absolute names, links out of the tree, chains of links, members under a
link, devices and hard links, an archive bigger than recorded, a corrupt gzip) is one line and
leaves nothing behind, and a tree is unpacked once per node per hash."""

from __future__ import annotations

import io
import os
import tarfile
from pathlib import Path

import pytest

from gpucloud.jobs.code.snapshot import TreeHash, build
from gpucloud.jobs.code.store import CodeUnavailable
from gpucloud.jobs.code.unpack import cached_tree, copy_tree, unpack

Member = tuple[str, str, bytes | str]  # (name, "file" | "link" | "dir" | "hardlink" | "fifo", data or target)


def archive(path: Path, members: list[Member]) -> Path:
    with tarfile.open(path, "w:gz", format=tarfile.PAX_FORMAT) as tar:
        for name, kind, payload in members:
            info = tarfile.TarInfo(name)
            info.mode = 0o644
            if kind == "file":
                data = payload if isinstance(payload, bytes) else payload.encode()
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
                continue
            info.type = {"link": tarfile.SYMTYPE, "dir": tarfile.DIRTYPE, "hardlink": tarfile.LNKTYPE}.get(
                kind, tarfile.FIFOTYPE
            )
            info.linkname = str(payload)
            tar.addfile(info)
    return path


def tree_hash(members: list[Member]) -> str:
    tree = TreeHash()
    for name, kind, payload in members:
        if kind == "link":
            tree.add_link(name, str(payload))
        else:
            tree.add_file(name, 0o644, payload if isinstance(payload, bytes) else payload.encode())
    return tree.hexdigest()


def refused(tmp_path: Path, members: list[Member], *, size: int = 10_000, sha: str | None = None) -> str:
    path = archive(tmp_path / "hostile.tar.gz", members)
    dest = tmp_path / "dest"
    with pytest.raises(CodeUnavailable) as err:
        unpack(path, dest, sha256=sha or tree_hash(sorted(members)), size_bytes=size, name="s3://b/code/x.tar.gz")
    line = str(err.value)
    assert "\n" not in line and line.startswith("the job's code s3://b/code/x.tar.gz ")
    return line


def test_a_genuine_snapshot_unpacks_to_the_same_tree(tmp_path: Path) -> None:
    src = tmp_path / "src"
    (src / "pkg").mkdir(parents=True)
    (src / "pkg/run.sh").write_text("#!/bin/sh\necho hi\n")
    os.chmod(src / "pkg/run.sh", 0o755)
    (src / "train.py").write_text("print(1)\n")
    os.symlink("pkg/run.sh", src / "run")
    snap = build(src, tmp_path / "out")
    dest = tmp_path / "dest"
    unpack(snap.archive, dest, sha256=snap.sha256, size_bytes=snap.size_bytes, name="x")
    assert (dest / "train.py").read_text() == "print(1)\n"
    assert os.readlink(dest / "run") == "pkg/run.sh" and (dest / "run").read_text().endswith("echo hi\n")
    assert os.stat(dest / "pkg/run.sh").st_mode & 0o777 == 0o755
    assert os.stat(dest / "train.py").st_mode & 0o777 == 0o644


@pytest.mark.parametrize(
    ("members", "says"),
    [
        ([("../evil.py", "file", "x")], "named '../evil.py', outside its tree"),
        ([("a/../../evil.py", "file", "x")], "outside its tree"),
        ([("/etc/cron.d/evil", "file", "x")], "named '/etc/cron.d/evil', outside its tree"),
        ([("./train.py", "file", "x")], "outside its tree"),  # not canonical: never written by build()
        ([("up", "link", "../..")], "a link 'up' -> '../..' out of its tree"),
        ([("abs", "link", "/etc/passwd")], "a link 'abs' -> '/etc/passwd' out of its tree"),
        ([("l", "link", "d"), ("l/x.py", "file", "x")], "'l/x.py' under the link 'l'"),
        ([("hard", "hardlink", "/etc/passwd")], "'hard', which is neither a file nor a link"),
        ([("fifo", "fifo", "")], "'fifo', which is neither a file nor a link"),
        ([("d", "dir", "")], "'d', which is neither a file nor a link"),
        ([("a.py", "file", "1"), ("a.py", "file", "2")], "holds 'a.py' twice"),
        ([("b.py", "file", "1"), ("a.py", "file", "2")], "not a gpucloud snapshot (members out of order)"),
    ],
)
def test_a_hostile_member_is_refused_in_one_line(tmp_path: Path, members: list[Member], says: str) -> None:
    assert says in refused(tmp_path, members, sha="0" * 64)


def test_a_chain_of_links_that_leads_out_is_refused_on_the_disk(tmp_path: Path) -> None:
    # Each target looks inside on paper; followed on the disk, x/y/s/.. is the tree's parent.
    members: list[Member] = [("a", "link", "x/y/s/.."), ("x/y/s", "link", "../.."), ("x/y/z.py", "file", "")]
    line = refused(tmp_path, members)
    assert "a link 'a' -> 'x/y/s/..' that leads out of it" in line


def test_content_that_does_not_match_the_recorded_hash_is_refused(tmp_path: Path) -> None:
    genuine = [("train.py", "file", "print('hello')\n")]
    tampered = [("train.py", "file", "import os; os.system('curl evil')\n")]
    line = refused(tmp_path, tampered, sha=tree_hash(genuine), size=100)
    assert "does not match the hash the job recorded" in line and "changed or damaged after submit" in line


def test_an_archive_bigger_than_recorded_is_refused_before_it_fills_the_disk(tmp_path: Path) -> None:
    line = refused(tmp_path, [("a.bin", "file", b"\0" * 5000)], size=4096)
    assert "unpacks to more than the 4.0 KiB the job recorded" in line


def test_a_corrupt_archive_is_one_line(tmp_path: Path) -> None:
    path = tmp_path / "x.tar.gz"
    path.write_bytes(b"\x1f\x8b\x08\x00garbage" * 20)
    with pytest.raises(CodeUnavailable) as err:
        unpack(path, tmp_path / "dest", sha256="0" * 64, size_bytes=100, name="x.tar.gz")
    assert str(err.value).startswith("the job's code x.tar.gz is not a readable archive: ")
    assert "\n" not in str(err.value)


def test_a_tree_is_unpacked_once_per_node_and_copied_per_attempt(tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    (src / "train.py").write_text("print(1)\n")
    snap = build(src, tmp_path / "store")
    cache = tmp_path / "cache"
    tree, cached = cached_tree(str(snap.archive), snap.sha256, snap.size_bytes, cache)
    assert not cached and (tree / "train.py").read_text() == "print(1)\n"
    snap.archive.unlink()  # the store is gone: the node's cache still serves the same hash
    again, cached = cached_tree(str(snap.archive), snap.sha256, snap.size_bytes, cache)
    assert cached and again == tree
    first, second = tmp_path / "attempt-1", tmp_path / "attempt-2"
    copy_tree(tree, first)
    copy_tree(tree, second)
    (first / "train.py").write_text("changed by attempt 1\n")  # a copy: neither the cache nor attempt 2 sees it
    assert (tree / "train.py").read_text() == (second / "train.py").read_text() == "print(1)\n"


def test_a_failed_unpack_leaves_nothing_in_the_cache(tmp_path: Path) -> None:
    bad = archive(tmp_path / "bad.tar.gz", [("../x", "file", "x")])
    cache = tmp_path / "cache"
    with pytest.raises(CodeUnavailable):
        cached_tree(str(bad), "1" * 64, 100, cache)
    assert not (cache / "code" / ("1" * 64)).exists()
    with pytest.raises(CodeUnavailable, match=r"^cannot read the job's code .*missing\.tar\.gz: No such file"):
        cached_tree(str(tmp_path / "missing.tar.gz"), "2" * 64, 100, cache)
