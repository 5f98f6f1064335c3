"""Jobs that share a node's cached `--setup` env cannot change it for each other: each attempt runs
in a private copy, and a cache changed behind gpucloud's back (a planted `.pth`, an edited or
replaced file) is set up again, not used. A table of the ways a job A tried to reach job B."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpucloud.jobs.code.setup_env import EnvChanged, private_copy, seal
from jobs.test_cli import run

PLANT = 'import builtins; builtins.PLANTED = "by job A"\n'

ATTACK = f"""
import glob, os, sys, sysconfig
mode = sys.argv[1]
plant = {PLANT!r}
cache = glob.glob(os.path.join(os.environ["GPUCLOUD_HOME"], "cache", "envs", "*", "lib", "python*", "site-packages"))
assert cache, "no cached env"
if mode == "own env":
    open(os.path.join(sysconfig.get_paths()["purelib"], "zz_planted.pth"), "w").write(plant)
for site in cache:
    base = os.path.join(site, "_gpucloud_image_site.pth")
    if mode == "add a .pth to the cache":
        open(os.path.join(site, "zz_planted.pth"), "w").write(plant)
    elif mode == "edit a cached file":
        os.chmod(base, 0o644)
        open(base, "a").write(plant)
    elif mode == "replace a cached file with a link":
        evil = os.path.join(os.environ["GPUCLOUD_HOME"], "evil.pth")
        open(evil, "w").write(open(base).read() + plant)
        os.unlink(base)
        os.symlink(evil, base)
    elif mode == "remove a cached file":
        os.unlink(base)
"""

VICTIM = """
import builtins, json, sys, xxhash
json.dump({"planted": getattr(builtins, "PLANTED", None), "prefix": sys.prefix}, open(sys.argv[1], "w"))
"""


@pytest.mark.parametrize("mode", ["own env", "add a .pth to the cache", "edit a cached file"])
def test_what_job_a_writes_never_reaches_job_b(tmp_path, gpucloud_home, capsys, mode):
    work = tmp_path / "project"
    work.mkdir()
    (work / "requirements.txt").write_text("# nothing to install\n")
    (work / "attack.py").write_text(ATTACK)
    (work / "victim.py").write_text(VICTIM)
    setup = "echo setting up"
    report = tmp_path / "victim.json"
    for argv in (["python", "attack.py", mode], ["python", "victim.py", str(report)]):
        code, _, err = run(capsys, "submit", "--workdir", str(work), "--setup", setup, "--", *argv)
        assert code == 0, err
        code, out, err = run(capsys, "worker", "--no-imds", "--once", "--output", "json")
        assert code == 0, err
        assert json.loads(out)["jobs"][0]["state"] == "finished", out
    seen = json.loads(report.read_text())
    assert seen["planted"] is None, f"{mode}: job B ran what job A planted"
    assert Path(seen["prefix"]).name == "venv"  # the image's packages (xxhash) still import


def _env(root: Path) -> Path:
    (root / "bin").mkdir(parents=True)
    (root / "bin" / "pip").write_text(f"#!{root}/bin/python\nimport pip\n")
    (root / "bin" / "python").symlink_to("/usr/bin/python3")
    site = root / "lib" / "python3" / "site-packages"
    site.mkdir(parents=True)
    (site / "_gpucloud_image_site.pth").write_text("/opt/site\n")
    (site / "pkg").mkdir()
    (site / "pkg" / "__init__.py").write_text("VALUE = 1\n")
    return root


def _chmod_w(path: Path) -> None:
    path.chmod(0o644)


CHANGES = {
    "a .pth added": lambda s: (s / "zz.pth").write_text("import os\n"),
    "a module added": lambda s: (s / "pkg" / "evil.py").write_text("x = 1\n"),
    "a directory added": lambda s: (s / "newpkg").mkdir(),
    "a file edited": lambda s: (_chmod_w(s / "pkg" / "__init__.py"), (s / "pkg" / "__init__.py").write_text("V=2\n")),
    "a file emptied": lambda s: (_chmod_w(s / "pkg" / "__init__.py"), (s / "pkg" / "__init__.py").write_text("")),
    "a file replaced by a link": lambda s: (
        (s / "pkg" / "__init__.py").unlink(),
        (s / "pkg" / "__init__.py").symlink_to("/etc/hostname"),
    ),
    "a file removed": lambda s: (s / "_gpucloud_image_site.pth").unlink(),
    "a directory removed": lambda s: ((s / "pkg" / "__init__.py").unlink(), (s / "pkg").rmdir()),
    "a link retargeted": lambda s: (
        (s.parents[2] / "bin" / "python").unlink(),
        (s.parents[2] / "bin" / "python").symlink_to("/tmp/x"),
    ),
    "a FIFO added": lambda s: __import__("os").mkfifo(s / "fifo.pth"),
}


@pytest.mark.parametrize("change", sorted(CHANGES))
def test_a_cached_env_changed_after_it_was_sealed_is_never_copied(tmp_path, change):
    venv = _env(tmp_path / "envs" / "k")
    manifest = tmp_path / "envs" / "k.manifest.json"
    seal(venv, manifest)
    assert not (venv / "lib" / "python3" / "site-packages" / "pkg" / "__init__.py").stat().st_mode & 0o222
    copy = private_copy(venv, manifest, tmp_path / "attempt-1" / "venv")
    assert (copy / "bin" / "pip").read_text().startswith(f"#!{copy}/bin/python")  # the copy's scripts name it
    CHANGES[change](venv / "lib" / "python3" / "site-packages")
    with pytest.raises(EnvChanged):
        private_copy(venv, manifest, tmp_path / "attempt-2" / "venv")
