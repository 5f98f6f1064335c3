"""The job commands from the shell: one-line errors for bad input, JSON output, exit codes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cli_run import one_line_error
from cli_run import run_cli as run
from gpucloud.queue.sqlite import SqliteQueue
from helpers.waiting import wait_for


@pytest.mark.parametrize(
    "argv, expected",
    [
        (["job", "show", "nope"], "no job 'nope'"),
        (["spot-train", "--no-imds", "--job-id", "nope"], "no job 'nope'"),
        (["jobs", "--queue", "postgres://db/jobs"], "allowed: sqlite:///PATH"),
        (["jobs", "--queue", "aws://us-east-1/jobs"], "followed by a path '/jobs'; name the table and queue"),
        (["jobs", "--queue", "sqlite:///"], "names no file"),
        (["spot-train", "--no-imds"], "missing command after --"),
        (["spot-train", "--no-imds", "--"], "missing command after --"),
        (["submit"], "missing command after --"),
        (["submit", "--job-id", "../escape", "--", "true"], "job id '../escape'"),
        (["submit", "--env", "NOEQUALS", "--", "true"], "--env 'NOEQUALS'"),
        (["spot-train", "--no-imds", "--grace", "5", "--stop-margin", "5", "--", "true"], "--stop-margin"),
        (["spot-train", "--imds-endpoint", "ftp://x", "--", "true"], "--imds-endpoint"),
    ],
)
def test_bad_input_is_one_line_naming_what_is_wrong(capsys, argv, expected):
    code, out, err = run(capsys, *argv)
    assert code == 2 and out == ""
    assert expected in one_line_error(err)


@pytest.mark.parametrize(
    "argv, expected",
    [
        (["spot-train", "--poll-interval", "-1", "--", "true"], "--poll-interval"),
        (["spot-train", "--ack-timeout", "soon", "--", "true"], "--ack-timeout"),
        (["worker", "--max-jobs", "0"], "--max-jobs"),
        (["jobs", "--state", "sleeping"], "--state"),
    ],
)
def test_bad_flags_are_rejected_by_name(capsys, argv, expected):
    code, _, err = run(capsys, *argv)
    assert code == 2 and expected in err and "Traceback" not in err


def test_a_corrupt_queue_file_is_a_one_line_error_and_is_left_untouched(capsys, tmp_path):
    db = tmp_path / "queue.db"
    db.write_bytes(b"this is not sqlite" * 100)
    code, _, err = run(capsys, "jobs", "--queue", f"sqlite:///{db}")
    assert code == 2 and "not a usable SQLite database" in one_line_error(err)
    assert db.read_bytes() == b"this is not sqlite" * 100


def test_spot_train_with_a_job_id_refuses_a_different_command(capsys, tmp_path):
    run(capsys, "submit", "--job-id", "fixed", "--", "true")
    code, _, err = run(capsys, "spot-train", "--no-imds", "--job-id", "fixed", "--", "false")
    assert code == 2 and "omit the command" in one_line_error(err)
    code, _, err = run(capsys, "spot-train", "--no-imds", "--job-id", "fixed", "--max-attempts", "5")
    assert code == 2 and "only apply to new jobs" in one_line_error(err)


def test_submit_list_and_show_as_json(capsys):
    code, out, _ = run(
        capsys, "submit", "--job-id", "train-1", "--gpus-per-node", "8", "--output", "json", "--", "python", "train.py"
    )
    assert code == 0 and json.loads(out)["job_id"] == "train-1"
    code, out, _ = run(capsys, "jobs", "--output", "json")
    assert [(j["job_id"], j["state"], j["command"]) for j in json.loads(out)] == [
        ("train-1", "queued", ["python", "train.py"])
    ]
    code, out, _ = run(capsys, "job", "show", "train-1", "--output", "json")
    report = json.loads(out)
    assert report["state"] == "queued" and report["gpus_per_node"] == 8 and report["timeline"][0]["kind"] == "submitted"


def test_job_show_prints_attempts_timeline_and_gpu_hours_for_humans(capsys):
    code, out, _ = run(capsys, "spot-train", "--no-imds", "--gpus-per-node", "4", "--", sys.executable, "-c", "pass")
    job_id = json.loads(run(capsys, "jobs", "--output", "json")[1])[0]["job_id"]
    code, out, _ = run(capsys, "job", "show", job_id)
    assert code == 0
    for expected in ("attempts", "timeline", "claimed", "started", "finish", "GPU-hours used"):
        assert expected in out


def test_spot_train_runs_a_command_to_completion_and_prints_json(capsys):
    code, out, err = run(
        capsys, "spot-train", "--no-imds", "--output", "json", "--", sys.executable, "-c", "print('hello')"
    )
    summary = json.loads(out)  # the command's own stdout went to stderr, not into the JSON
    assert code == 0 and summary["state"] == "finished" and summary["exit_code"] == 0
    assert "hello" in err


def test_spot_train_exits_with_the_commands_code_when_it_fails(capsys):
    code, out, _ = run(
        capsys,
        "spot-train",
        "--no-imds",
        "--max-attempts",
        "1",
        "--output",
        "json",
        "--",
        sys.executable,
        "-c",
        "import sys; sys.exit(4)",
    )
    assert code == 4 and json.loads(out)["state"] == "failed"


def test_worker_once_runs_a_queued_job_and_exits_when_idle(capsys):
    run(capsys, "submit", "--job-id", "w-1", "--", sys.executable, "-c", "pass")
    code, out, _ = run(capsys, "worker", "--no-imds", "--once", "--output", "json")
    assert code == 0 and json.loads(out)["jobs"] == [{"job_id": "w-1", "state": "finished", "exit_code": 0}]
    code, out, _ = run(capsys, "worker", "--no-imds", "--once", "--output", "json")
    assert code == 0 and json.loads(out)["jobs"] == []


def test_worker_stops_after_max_jobs(capsys):
    for n in range(3):
        run(capsys, "submit", "--job-id", f"m-{n}", "--", sys.executable, "-c", "pass")
    code, out, _ = run(capsys, "worker", "--no-imds", "--max-jobs", "2", "--output", "json")
    assert code == 0 and [j["job_id"] for j in json.loads(out)["jobs"]] == ["m-0", "m-1"]
    code, out, _ = run(capsys, "jobs", "--state", "queued", "--output", "json")
    assert [j["job_id"] for j in json.loads(out)] == ["m-2"]


def test_worker_idle_exit(capsys):
    started = time.monotonic()
    code, out, _ = run(capsys, "worker", "--no-imds", "--idle-exit", "0", "--output", "json")
    assert code == 0 and json.loads(out)["jobs"] == [] and time.monotonic() - started < 10


def test_sigterm_to_spot_train_is_a_notice_that_still_stops_a_command_ignoring_the_api(tmp_path, gpucloud_home):
    loop = tmp_path / "loop.py"
    loop.write_text("import time\nwhile True:\n    time.sleep(0.01)\n")
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "gpucloud",
            "spot-train",
            "--no-imds",
            "--grace",
            "10",
            "--ack-timeout",
            "1",
            "--output",
            "json",
            "--",
            sys.executable,
            str(loop),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=dict(os.environ),
    )
    db = Path(gpucloud_home) / "queue.db"
    wait_for(lambda: db.exists() and _started(db), timeout=30, what="the attempt to start")
    sent = time.time()
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 75, err
    summary = json.loads(out)
    assert summary["state"] == "queued" and summary["attempt"] == 2
    events = {e.kind: e for e in SqliteQueue(db).events(summary["job_id"])}
    assert events["notice"].data["kind"] == "sigterm"
    assert events["stop"].data["signal"] == "SIGTERM" and events["stop"].at < sent + 10


def _started(db: Path) -> bool:
    q = SqliteQueue(db)
    try:
        return any(e.kind == "started" for j in q.list_jobs() for e in q.events(j.id))
    finally:
        q.close()


def test_a_job_row_damaged_outside_gpucloud_is_a_one_line_error(capsys, gpucloud_home):
    import sqlite3

    run(capsys, "submit", "--job-id", "hurt", "--", "true")
    raw = sqlite3.connect(Path(gpucloud_home) / "queue.db")
    raw.execute("UPDATE jobs SET spec = '{\"command\": []}' WHERE id = 'hurt'")
    raw.commit()
    raw.close()
    code, _, err = run(capsys, "job", "show", "hurt")
    assert code == 2 and "job 'hurt' in the queue is unreadable (command" in one_line_error(err)


def test_a_queue_path_that_cannot_be_created_is_a_one_line_error(capsys, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    code, _, err = run(capsys, "jobs", "--queue", f"sqlite:///{blocker}/sub/queue.db")
    assert code == 2 and "cannot create the queue directory" in one_line_error(err)
