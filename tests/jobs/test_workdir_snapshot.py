"""`submit --workdir` snapshots: what goes in (.gitignore at every level, never
.git, links only inside), the content hash and the archive (reproducible byte for byte), and the
size limit's one-line error naming the biggest files."""

from __future__ import annotations

import os
import tarfile
from pathlib import Path

import pytest

from gpucloud.errors import UserError
from gpucloud.jobs.code.snapshot import build, collect, parse_size


def tree(root: Path, files: dict[str, str | bytes]) -> Path:
    for rel, content in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(content.encode() if isinstance(content, str) else content)
    return root


def paths(root: Path) -> list[str]:
    return [e.path for e in collect(root)]


def test_gitignore_files_at_every_level_decide_with_gits_precedence(tmp_path: Path) -> None:
    root = tree(
        tmp_path / "w",
        {
            ".gitignore": "*.log\nbuild/\ndata\n!keep.log\n/top-only.txt\n",
            "train.py": "",
            "a.log": "",
            "keep.log": "",
            "top-only.txt": "",
            "build/out.o": "",
            "data/big.bin": "",
            "sub/.gitignore": "!debug.log\nlocal.cfg\n",
            "sub/debug.log": "",  # re-included by the deeper file
            "sub/other.log": "",  # still ignored by the top file
            "sub/local.cfg": "",
            "sub/top-only.txt": "",  # '/top-only.txt' is anchored to the top directory
            "sub/model.py": "",
        },
    )
    assert paths(root) == [
        ".gitignore",
        "keep.log",
        "sub/.gitignore",
        "sub/debug.log",
        "sub/model.py",
        "sub/top-only.txt",
        "train.py",
    ]


def test_an_ignored_directory_is_not_entered_and_git_is_never_shipped(tmp_path: Path) -> None:
    root = tree(
        tmp_path / "w",
        {
            ".gitignore": "cache/\n!cache/wanted.txt\n",  # as in git: a file of an excluded dir stays out
            "cache/wanted.txt": "",
            ".git/HEAD": "ref: refs/heads/main\n",
            "vendor/lib/.git": "gitdir: ../../.git/modules/lib\n",  # a submodule's .git file
            "vendor/lib/code.py": "",
            "run.py": "",
        },
    )
    assert paths(root) == [".gitignore", "run.py", "vendor/lib/code.py"]


def test_the_repositorys_gitignore_files_above_the_workdir_apply_as_git_applies_them(tmp_path: Path) -> None:
    repo = tree(
        tmp_path / "repo",
        {
            ".git/HEAD": "",
            ".gitignore": "__pycache__/\n*.ckpt\n/jobs/bert/local.txt\n",
            "jobs/.gitignore": "*.tmp\n",
            "jobs/bert/run.py": "",
            "jobs/bert/local.txt": "",  # anchored at the repository's top
            "jobs/bert/out.ckpt": "",
            "jobs/bert/scratch.tmp": "",
            "jobs/bert/__pycache__/run.cpython-311.pyc": "",
        },
    )
    assert paths(repo / "jobs" / "bert") == ["run.py"]
    plain = tree(tmp_path / "plain", {".gitignore": "*.ckpt\n", "inner/run.py": "", "inner/out.ckpt": ""})
    assert paths(plain / "inner") == ["out.ckpt", "run.py"]  # not a repository: git would not apply it either


def test_links_inside_are_kept_as_links_and_a_link_out_is_refused_in_one_line(tmp_path: Path) -> None:
    root = tree(tmp_path / "w", {"conf/base.yaml": "a: 1\n", "run.py": ""})
    os.symlink("conf/base.yaml", root / "config.yaml")
    [link] = [e for e in collect(root) if e.kind == "link"]
    assert (link.path, link.target) == ("config.yaml", "conf/base.yaml")
    (tmp_path / "secret").write_text("x")
    os.symlink("../secret", root / "leak")
    with pytest.raises(UserError) as err:
        collect(root)
    assert "leak is a link to ../secret, outside" in str(err.value) and "\n" not in str(err.value)


def test_the_hash_and_archive_depend_on_content_and_mode_only(tmp_path: Path) -> None:
    files = {"train.py": "print(1)\n", "pkg/__init__.py": "", "pkg/run.sh": "#!/bin/sh\n"}
    a = tree(tmp_path / "a", files)
    b = tree(tmp_path / "b", files)
    os.chmod(a / "pkg/run.sh", 0o755)
    os.chmod(b / "pkg/run.sh", 0o700)  # executable by its owner only: still git's 0755
    os.chmod(b / "train.py", 0o600)
    os.utime(b / "train.py", (1_000_000, 1_000_000))
    first = build(a, tmp_path / "out-a")
    second = build(b, tmp_path / "out-b")
    assert first.sha256 == second.sha256 and first.name == second.name
    assert first.archive.read_bytes() == second.archive.read_bytes()  # reproducible archive
    assert first.archive.read_bytes()[3:8] == b"\0" * 5  # gzip header: no file name flag, no time
    assert (first.files, first.size_bytes) == (3, len("print(1)\n#!/bin/sh\n"))
    with tarfile.open(first.archive) as tar:
        members = tar.getmembers()
    assert [m.name for m in members] == ["pkg/__init__.py", "pkg/run.sh", "train.py"]
    assert {(m.mtime, m.uid, m.gid, m.uname, m.gname) for m in members} == {(0, 0, 0, "", "")}
    assert [m.mode for m in members] == [0o644, 0o755, 0o644]

    (b / "train.py").write_text("print(2)\n")
    changed = build(b, tmp_path / "out-c")
    assert changed.sha256 != first.sha256
    os.chmod(a / "pkg/run.sh", 0o644)
    assert build(a, tmp_path / "out-d").sha256 != first.sha256  # the executable bit is part of the tree


def test_past_the_size_limit_one_line_names_the_biggest_files(tmp_path: Path) -> None:
    root = tree(
        tmp_path / "w",
        {"train.py": "x" * 10, "data/weights.bin": b"\0" * 3000, "data/extra.bin": b"\0" * 2000, "notes.md": "y" * 50},
    )
    with pytest.raises(UserError) as err:
        build(root, tmp_path / "out", limit=4096)
    line = str(err.value)
    assert "\n" not in line
    assert "4.9 KiB to ship, over the 4.0 KiB limit" in line
    assert "biggest: data/weights.bin (2.9 KiB), data/extra.bin (2.0 KiB), notes.md (50 B)" in line
    assert ".gitignore" in line and "--max-workdir-size" in line
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())  # nothing half-written
    (root / ".gitignore").write_text("data/\n")
    assert build(root, tmp_path / "out", limit=4096).files == 3  # ignored data no longer counts


@pytest.mark.parametrize(
    ("text", "expected"), [("100MiB", 100 * 2**20), ("1.5 GiB", int(1.5 * 2**30)), ("500K", 500 * 1024), ("2048", 2048)]
)
def test_sizes_parse(text: str, expected: int) -> None:
    assert parse_size(text) == expected


@pytest.mark.parametrize("text", ["", "lots", "-5MiB", "10TB", "0", "nan"])
def test_a_bad_size_is_one_line_naming_the_flag(text: str) -> None:
    with pytest.raises(UserError, match=r"^--max-workdir-size .* is not a size; give e\.g\. 100MiB"):
        parse_size(text)


def test_a_file_that_grows_while_it_is_snapshotted_is_recorded_and_limited_as_read(tmp_path, monkeypatch) -> None:
    from gpucloud.jobs.code import snapshot

    root = tree(tmp_path / "w", {"log.txt": "x" * 3000})
    listed = snapshot.collect(root)
    (root / "log.txt").write_text("x" * 6000)  # grows between the listing and the read
    monkeypatch.setattr(snapshot, "collect", lambda _root: listed)
    assert build(root, tmp_path / "out").size_bytes == 6000  # what the node will unpack, not the stale 3000
    with pytest.raises(UserError, match=r"holds 5\.9 KiB to ship, over the 4\.0 KiB limit"):
        build(root, tmp_path / "out2", limit=4096)
