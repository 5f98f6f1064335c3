"""Code reaches the node, offline: `submit --workdir DIR` stores DIR's snapshot
beside the SQLite queue once per tree, the worker runs the command in a verified copy of it in the
attempt's directory, and a snapshot changed after submit fails the job with one line, no crash."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from gpucloud.jobs.code.snapshot import build
from gpucloud.lifecycle.model import JobSpec
from gpucloud.queue.connect import open_queue
from jobs.test_cli import one_line_error, run

TRAIN = """\
import json, os, pathlib, sys
pathlib.Path(sys.argv[1]).write_text(json.dumps({
    "cwd": os.getcwd(),
    "conf": pathlib.Path("conf/settings.txt").read_text(),
    "secret_shipped": os.path.exists("secret.env"),
    "git_shipped": os.path.exists(".git"),
    "path0": os.environ["PATH"].split(os.pathsep)[0],
}))
"""


def project(tmp_path: Path) -> Path:
    work = tmp_path / "project"
    (work / "conf").mkdir(parents=True)
    (work / ".git").mkdir()
    (work / ".git" / "HEAD").write_text("ref: refs/heads/main\n")
    (work / "train.py").write_text(TRAIN)
    (work / "conf" / "settings.txt").write_text("lr=0.1\n")
    (work / "secret.env").write_text("TOKEN=x\n")
    (work / ".gitignore").write_text("secret.env\n")
    return work


def test_the_worker_runs_the_command_in_a_copy_of_the_snapshot_stored_once(tmp_path: Path, gpucloud_home, capsys):
    work, result = project(tmp_path), tmp_path / "result.json"
    code, out, err = run(
        capsys, "submit", "--workdir", str(work), "--output", "json", "--", sys.executable, "train.py", str(result)
    )
    assert code == 0, err
    job = json.loads(out)
    stored = Path(job["code"]["uri"])
    assert stored.parent == gpucloud_home / "code" and stored.name == f"{job['code']['sha256']}.tar.gz"
    assert job["code"]["files"] == 3 and job["code_uploaded"] is True  # .gitignore, train.py, conf/settings.txt
    code, out, err = run(capsys, "submit", "--workdir", str(work), "--", sys.executable, "train.py", str(result))
    assert code == 0 and f"already stored at {stored}" in out  # the same tree is stored once

    code, _, err = run(capsys, "worker", "--no-imds", "--once")
    assert code == 0, err
    seen = json.loads(result.read_text())
    assert Path(seen["cwd"]) == gpucloud_home / "run" / job["job_id"] / "attempt-1" / "workdir"
    assert seen["conf"] == "lr=0.1\n" and not seen["secret_shipped"] and not seen["git_shipped"]
    assert seen["path0"] == str(Path(sys.executable).parent)  # gpucloud's interpreter first on PATH
    code, out, _ = run(capsys, "job", "logs", job["job_id"])
    assert f"code {job['code']['sha256'][:12]} (3 files, fetched from {stored} and verified)" in out
    code, out, _ = run(capsys, "job", "show", job["job_id"])
    size = job["code"]["size_bytes"]
    assert f"code: {job['code']['sha256'][:12]} (3 files, {size} B) at {stored}\n" in out
    code, out, _ = run(capsys, "job", "show", job["job_id"], "--output", "json")
    assert json.loads(out)["code"] == job["code"] and json.loads(out)["setup"] is None


def test_a_snapshot_changed_after_submit_fails_the_job_with_one_line(tmp_path: Path, gpucloud_home, capsys):
    work = project(tmp_path)
    code, out, err = run(capsys, "submit", "--workdir", str(work), "--output", "json", "--", sys.executable, "train.py")
    assert code == 0, err
    job = json.loads(out)
    (work / "train.py").write_text("import os; os.system('echo tampered')\n")
    other = build(work, tmp_path / "other")
    other.archive.replace(job["code"]["uri"])  # someone swapped the stored archive
    code, _, err = run(capsys, "worker", "--no-imds", "--once")
    assert code != 0 and "Traceback" not in err
    queue = open_queue()
    failed = queue.get(job["job_id"])
    assert failed.state.value == "failed"
    assert "does not match the hash the job recorded" in (failed.reason or "") and "\n" not in (failed.reason or "")
    assert not (gpucloud_home / "cache" / "code" / job["code"]["sha256"]).exists()


def test_a_workdir_over_the_limit_is_refused_before_anything_is_queued(tmp_path: Path, gpucloud_home, capsys):
    work = project(tmp_path)
    (work / "weights.bin").write_bytes(b"\0" * 4096)
    code, _, err = run(capsys, "submit", "--workdir", str(work), "--max-workdir-size", "2KiB", "--", "python", "x.py")
    assert code == 2
    line = one_line_error(err)
    assert "over the 2.0 KiB limit; biggest: weights.bin (4.0 KiB)" in line
    assert open_queue().list_jobs() == [] and not (gpucloud_home / "code").exists()
    code, _, err = run(capsys, "submit", "--workdir", str(work), "--max-workdir-size", "big", "--", "python", "x.py")
    assert code == 2 and "--max-workdir-size 'big' is not a size" in one_line_error(err)
    code, _, err = run(capsys, "submit", "--setup", " ", "--", "python", "x.py")
    assert code == 2 and "--setup is empty" in one_line_error(err)


def test_a_job_stored_before_code_shipping_is_read_and_runs_where_it_did(tmp_path: Path, gpucloud_home, capsys):
    import sqlite3

    queue = open_queue()
    job = queue.submit(JobSpec(command=[sys.executable, "-c", "import os; print('cwd', os.getcwd())"]))
    queue.close()
    # The spec as an older gpucloud wrote it: no code and no setup keys at all.
    old = {"command": job.spec.command, "name": None, "checkpoint_uri": None, "workdir": str(tmp_path), "env": {}}
    with sqlite3.connect(gpucloud_home / "queue.db") as db:
        db.execute("UPDATE jobs SET spec = ? WHERE id = ?", (json.dumps(old), job.id))
    read = open_queue().get(job.id)
    assert read.spec.code is None and read.spec.setup is None and read.spec.workdir == str(tmp_path)
    code, _, err = run(capsys, "worker", "--no-imds", "--once")
    assert code == 0, err
    code, out, _ = run(capsys, "job", "logs", job.id)
    assert f"cwd {tmp_path}\n" in out
