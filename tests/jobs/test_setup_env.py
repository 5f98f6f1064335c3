"""`submit --setup CMD`: a real virtualenv, layered on the interpreter running
gpucloud (the image's, with its torch), where CMD runs once per node and requirements hash; the
command sees the venv first on PATH, its own packages and the image's. Offline: the package comes
from a wheel built here and installed with --no-index."""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import json
import sys
import threading
import zipfile
from pathlib import Path

import pytest

from gpucloud.jobs.code.setup_env import env_key, requirement_files
from gpucloud.jobs.runner import supervise_job
from gpucloud.lifecycle.model import JobSpec
from gpucloud.queue.connect import open_queue
from helpers.notices import Inbox
from helpers.waiting import wait_for
from jobs.test_cli import run
from jobs.test_runner import FAST

REPORT = """\
import json, os, shutil, sys, pathlib
import gpucloud_tiny, xxhash
pathlib.Path(sys.argv[1]).write_text(json.dumps({
    "prefix": sys.prefix,
    "python": shutil.which("python"),
    "virtual_env": os.environ.get("VIRTUAL_ENV"),
    "tiny": gpucloud_tiny.VALUE,
    "xxhash_from": xxhash.__file__,
}))
"""


def tiny_wheel(folder: Path) -> Path:
    """A pure-Python wheel of 'gpucloud-tiny 1.0' (pip installs a wheel without building anything)."""
    folder.mkdir(parents=True, exist_ok=True)
    files = {
        "gpucloud_tiny.py": b'VALUE = "from the job\'s wheel"\n',
        "gpucloud_tiny-1.0.dist-info/METADATA": b"Metadata-Version: 2.1\nName: gpucloud-tiny\nVersion: 1.0\n",
        "gpucloud_tiny-1.0.dist-info/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\n"
        b"Tag: py3-none-any\n",
    }
    record = []
    for name, data in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.append(f"{name},sha256={digest},{len(data)}")
    record.append("gpucloud_tiny-1.0.dist-info/RECORD,,")
    path = folder / "gpucloud_tiny-1.0-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as whl:
        for name, data in files.items():
            whl.writestr(name, data)
        whl.writestr("gpucloud_tiny-1.0.dist-info/RECORD", "\n".join(record) + "\n")
    return path


def test_setup_runs_once_per_requirements_hash_and_the_command_sees_the_venv_first(tmp_path, gpucloud_home, capsys):
    work = tmp_path / "project"
    tiny_wheel(work / "wheels")
    (work / "requirements.txt").write_text("gpucloud-tiny==1.0\n")
    (work / "report.py").write_text(REPORT)
    marker = tmp_path / "setup-runs"
    setup = f"pip install --no-index --find-links wheels -r requirements.txt && echo ran >> {marker}"
    jobs = []
    for n in (1, 2):
        out_file = tmp_path / f"report-{n}.json"
        code, out, err = run(
            capsys, "submit", "--workdir", str(work), "--setup", setup, "--output", "json", "--",
            "python", "report.py", str(out_file),
        )  # fmt: skip
        assert code == 0, err
        jobs.append(json.loads(out)["job_id"])
        code, _, err = run(capsys, "worker", "--no-imds", "--once")
        assert code == 0, err
        (work / "notes.md").write_text("a code change that leaves the requirements alone\n")

    assert marker.read_text() == "ran\n"  # the second job reused the env: no second install
    first, second = (json.loads((tmp_path / f"report-{n}.json").read_text()) for n in (1, 2))
    # each attempt runs in a private copy of the node's cached env, in its own attempt directory
    assert first["prefix"] != second["prefix"]
    assert all(
        Path(r["prefix"]).name == "venv" and (Path(r["prefix"]) / "pyvenv.cfg").is_file() for r in (first, second)
    )
    assert first["python"] == str(Path(first["prefix"]) / "bin" / "python")  # the venv's python comes first
    assert first["virtual_env"] == first["prefix"]
    assert first["tiny"] == "from the job's wheel"
    # The interpreter's own packages (on a node: the image's torch) are there too, from where they are.
    assert Path(first["xxhash_from"]).is_relative_to(Path(sys.prefix))
    code, out, _ = run(capsys, "job", "logs", jobs[1])
    assert "(cached on this node, setup not run again;" in out and "Successfully installed" not in out
    code, out, _ = run(capsys, "job", "logs", jobs[0])
    assert "Successfully installed gpucloud-tiny-1.0" in out  # the setup's output is in the attempt's log


def test_a_long_setup_keeps_the_lease_and_a_failed_one_fails_the_job_in_one_line(tmp_path, gpucloud_home):
    started, gate = tmp_path / "started", tmp_path / "gate"
    setup = f"echo resolving; touch {started}; while [ ! -e {gate} ]; do sleep 0.05; done; echo 'no such package' >&2; exit 3"
    queue = open_queue()
    job = queue.submit(JobSpec(command=["python", "-c", "print('never')"], setup=setup))
    config = dataclasses.replace(FAST, lease_seconds=1.0)  # renewed every 0.25 s while the setup runs
    supervisor = threading.Thread(
        target=lambda: supervise_job(queue, job.id, notices=Inbox(), config=config, worker="w"), daemon=True
    )
    supervisor.start()
    try:
        wait_for(started.exists, timeout=120, what="the setup to start (after the venv is made)")
        first = queue.get(job.id).lease_until or 0
        wait_for(lambda: (queue.get(job.id).lease_until or 0) > first + 0.5, what="a renewal while the setup runs")
        assert queue.claim("another-worker", lease_seconds=1.0) is None  # still held: not taken over as lost
    finally:
        gate.touch()
        supervisor.join(timeout=120)
    failed = queue.get(job.id)
    assert failed.state.value == "failed"
    assert failed.reason == f"the setup command {setup!r} exited with 3; last output: resolving | no such package"
    envs = gpucloud_home / "cache" / "envs"
    assert [p.name for p in envs.iterdir() if not p.name.endswith(".lock")] == []  # the next attempt sets up again


def files(root: Path, content: dict[str, str]) -> Path:
    for rel, text in content.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root


def test_the_env_key_follows_the_requirement_files_and_nothing_else(tmp_path: Path) -> None:
    root = files(
        tmp_path,
        {
            "requirements.txt": "-r requirements/base.txt\ntransformers==4.50\n",
            "requirements/base.txt": "--constraint constraints.txt\nnumpy\n",
            "requirements/constraints.txt": "numpy<3\n",
            "requirements-dev.txt": "pytest\n",
            "extra.txt": "einops\n",
        },
    )
    setup = "pip install -r requirements.txt -r extra.txt"
    assert {p.relative_to(root).as_posix() for p in requirement_files(setup, root)} == {
        "extra.txt",  # named
        "requirements.txt",  # named
        "requirements/base.txt",  # -r inside requirements.txt, relative to it
        "requirements/constraints.txt",  # --constraint inside that one
        "requirements-dev.txt",  # the workdir's requirements*.txt
    }
    key = env_key(setup, root, code_sha256="a" * 64)
    assert env_key(setup, root, code_sha256="b" * 64) == key  # code changes alone reuse the env
    (root / "requirements/constraints.txt").write_text("numpy<2\n")  # two includes deep
    assert env_key(setup, root, code_sha256="a" * 64) != key
    assert env_key(setup + " --upgrade", root, code_sha256="a" * 64) != env_key(setup, root, code_sha256="a" * 64)


@pytest.mark.parametrize("setup", ["pip install einops", "apt-get moo"])
def test_a_setup_naming_no_requirement_file_gets_an_env_per_snapshot(tmp_path: Path, setup: str) -> None:
    assert requirement_files(setup, tmp_path) == []
    assert env_key(setup, tmp_path, code_sha256="a" * 64) != env_key(setup, tmp_path, code_sha256="b" * 64)
