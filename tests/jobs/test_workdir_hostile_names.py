"""`submit --workdir` over a tree no snapshot can hold (a loop of links, names that are not UTF-8):
one line naming the path and what to do, exit 2, nothing submitted."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path

import pytest

from cli_run import one_line_error
from cli_run import run_cli as run


def _self_loop(work: Path) -> None:
    (work / "me").symlink_to("me")


def _two_links(work: Path) -> None:
    (work / "a").symlink_to("b")
    (work / "b").symlink_to("a")


def _loop_in_a_subdir(work: Path) -> None:
    (work / "sub").mkdir()
    (work / "sub" / "x").symlink_to("../sub/y")
    (work / "sub" / "y").symlink_to("x")


def _latin1_file(work: Path) -> None:
    (work / os.fsdecode(b"caf\xe9.py")).write_text("print('x')\n")


def _latin1_dir(work: Path) -> None:
    folder = work / os.fsdecode(b"d\xff")
    folder.mkdir()
    (folder / "ok.py").write_text("x = 1\n")


def _latin1_link_target(work: Path) -> None:
    (work / os.fsdecode(b"t\xe9")).write_text("x\n")
    (work / "link").symlink_to(os.fsdecode(b"t\xe9"))


BAD: dict[str, tuple[Callable[[Path], None], str]] = {
    "a link to itself": (_self_loop, "in a loop of links"),
    "two links to each other": (_two_links, "in a loop of links"),
    "a loop in a subdirectory": (_loop_in_a_subdir, "in a loop of links"),
    "a file name in Latin-1": (_latin1_file, "not UTF-8"),
    "a directory name in Latin-1": (_latin1_dir, "not UTF-8"),
    "a link target in Latin-1": (_latin1_link_target, "not UTF-8"),
}


@pytest.mark.parametrize("name", sorted(BAD))
def test_a_workdir_no_snapshot_can_hold_is_one_line(capsys, tmp_path, gpucloud_home, name) -> None:
    work = tmp_path / "work"
    work.mkdir()
    (work / "train.py").write_text("print('train')\n")
    make, says = BAD[name]
    make(work)
    code, out, err = run(capsys, "submit", "--workdir", str(work), "--", "python", "train.py")
    assert code == 2 and out == "" and says in one_line_error(err)
    code, out, _ = run(capsys, "jobs", "-o", "json")
    assert json.loads(out) == []  # nothing submitted


def test_ignored_names_are_never_looked_at(capsys, tmp_path, gpucloud_home) -> None:
    work = tmp_path / "work"
    work.mkdir()
    (work / "train.py").write_text("print('train')\n")
    _self_loop(work)
    _latin1_file(work)
    (work / ".gitignore").write_text("me\ncaf*.py\n")
    code, _, err = run(capsys, "submit", "--workdir", str(work), "--", "python", "train.py")
    assert code == 0, err
