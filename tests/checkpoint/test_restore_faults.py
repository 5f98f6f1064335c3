"""Restore in a hostile file system: each fault falls back to the previous committed step, or is a
one-line UserError when nothing valid is left or the problem is the user's to fix."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from gpucloud.errors import UserError

PROBE = Path(__file__).with_name("restore_probe.py")
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def committed_job(tmp_path_factory, tiny_job_module):
    """A pristine job directory with committed steps 3, 6, 9 (LATEST names 9), copied per test."""
    base = tmp_path_factory.mktemp("pristine")
    tiny_job_module(str(base / "ck"), every_steps=3, keep_last=5).run(9)
    return base / "ck"


@pytest.fixture(scope="module")
def tiny_job_module():
    from helpers.tiny_job import TinyJob

    return TinyJob


def _copy(committed_job: Path, dst: Path) -> tuple[str, Path]:
    shutil.copytree(committed_job, dst)
    os.chmod(dst, 0o755)
    return str(dst), dst / "job"


def _shard(step_dir: Path) -> Path:
    return max(step_dir.glob("*.distcp"), key=lambda p: p.stat().st_size)


def _restore(tiny_job_module, uri: str) -> int:
    return tiny_job_module(uri).session.restore()


# -- faults that root can stage in-process ---------------------------------------------------------
def _manifest_is_a_directory(job_dir: Path) -> None:
    (job_dir / "step-9" / "manifest.json").unlink()
    (job_dir / "step-9" / "manifest.json").mkdir()


def _shard_symlink_loop(job_dir: Path) -> None:
    shard = _shard(job_dir / "step-9")
    shard.unlink()
    shard.symlink_to(shard.name)


def _manifest_entry_dotdot(job_dir: Path) -> None:
    path = job_dir / "step-9" / "manifest.json"
    manifest = json.loads(path.read_text())
    # Sized like the directory it names, so only opening it can tell.
    manifest["files"][0].update(name="..", size=job_dir.stat().st_size)
    path.write_text(json.dumps(manifest))


@pytest.mark.parametrize(
    "fault", [_manifest_is_a_directory, _shard_symlink_loop, _manifest_entry_dotdot], ids=lambda f: f.__name__[1:]
)
def test_damaged_newest_step_falls_back(committed_job, tmp_path, tiny_job_module, fault):
    uri, job_dir = _copy(committed_job, tmp_path / "ck")
    fault(job_dir)
    assert _restore(tiny_job_module, uri) == 6


def _latest_is_a_directory(job_dir: Path) -> None:
    (job_dir / "LATEST").unlink()
    (job_dir / "LATEST").mkdir()


def _latest_not_utf8(job_dir: Path) -> None:
    (job_dir / "LATEST").write_bytes(b"step-\xff\xfe9\n")


def _latest_5000_digits(job_dir: Path) -> None:
    (job_dir / "LATEST").write_text("step-" + "9" * 5000 + "\n")


def _job_dir_is_a_file(job_dir: Path) -> None:
    shutil.rmtree(job_dir)
    job_dir.write_text("not a directory")


@pytest.mark.parametrize(
    "fault, message",
    [
        (_latest_is_a_directory, r"LATEST is a directory"),
        (_latest_not_utf8, r"LATEST is corrupt \(contains 'step-\\\\xff\\\\xfe9'\)"),
        (_latest_5000_digits, r"LATEST is corrupt \(contains 'step-9999999999"),
        (_job_dir_is_a_file, r"ck/job is a file; the checkpoints of job job must be a directory"),
    ],
    ids=lambda f: f.__name__[1:] if callable(f) else "",
)
def test_unusable_latest_or_job_dir_is_a_one_line_user_error(committed_job, tmp_path, tiny_job_module, fault, message):
    uri, job_dir = _copy(committed_job, tmp_path / "ck")
    fault(job_dir)
    with pytest.raises(UserError, match=message) as info:
        _restore(tiny_job_module, uri)
    assert "\n" not in str(info.value)


# -- permission denied: root ignores file modes, so the restore runs without that override --------
def _without_root_override() -> list[str]:
    """A command prefix that runs without CAP_DAC_OVERRIDE / CAP_DAC_READ_SEARCH, so that file
    modes apply even to root; nothing when not root (modes apply anyway)."""
    if os.geteuid() != 0:
        return []
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        pytest.skip("running as root without setpriv: cannot make a permission check fail for root")
    return [setpriv, "--bounding-set=-dac_override,-dac_read_search"]


def test_permission_denied_anywhere(committed_job, tmp_path):
    os.chmod(tmp_path, 0o755)
    cases = {
        "shard": (lambda j: _shard(j / "step-9").chmod(0), {"step": 6}),
        "manifest": (lambda j: (j / "step-9" / "manifest.json").chmod(0), {"step": 6}),
        "step_dir": (lambda j: (j / "step-9").chmod(0), {"step": 6}),
        "latest": (lambda j: (j / "LATEST").chmod(0), None),
    }
    uris = []
    for name, (fault, _) in cases.items():
        uri, job_dir = _copy(committed_job, tmp_path / name)
        fault(job_dir)
        uris.append(uri)
    python_path = [p for p in (os.environ.get("PYTHONPATH"), str(REPO / "src")) if p]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(python_path), PYTHONWARNINGS="ignore")
    run = subprocess.run(
        [*_without_root_override(), sys.executable, str(PROBE), *uris],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    results = [json.loads(line) for line in run.stdout.splitlines() if line.startswith("{")]
    assert len(results) == len(cases), run.stdout + run.stderr
    got = dict(zip(cases, results, strict=True))
    print(got)
    for name, (_, expected) in cases.items():
        if expected is not None:
            assert got[name] == expected, name
    assert set(got["latest"]) == {"user_error"}, got["latest"]
    assert "cannot read" in got["latest"]["user_error"] and "LATEST: permission denied" in got["latest"]["user_error"]
    assert "\n" not in got["latest"]["user_error"]
