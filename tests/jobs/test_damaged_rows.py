"""Rows of a shared SQLite queue that another program edited: ids that would lead outside
$GPUCLOUD_HOME, log paths naming any file, times no calendar holds, attempt numbers no counter
reaches. Every value is checked where it is read, not only where gpucloud wrote it."""

from __future__ import annotations

import json
import logging
import sys

import pytest

from cli_run import one_line_error
from cli_run import run_cli as run
from jobs.test_damaged_queue import _damage

BAD_IDS = ["../../escape", "../x", "/abs", "a/b", ".hidden", "x\n", "", "x" * 129, "é", "a b", "-rf"]


@pytest.mark.parametrize("bad", BAD_IDS)
def test_a_job_id_rewritten_in_the_queue_is_refused_wherever_it_is_read(capsys, caplog, gpucloud_home, bad):
    run(capsys, "submit", "--job-id", "victim", "--", sys.executable, "-c", "open('made-here', 'w')")
    run(capsys, "submit", "--job-id", "good", "--", sys.executable, "-c", "pass")
    db = gpucloud_home / "queue.db"
    for table, column in (("jobs", "id"), ("attempts", "job_id"), ("events", "job_id")):
        _damage(db, f"UPDATE {table} SET {column} = ? WHERE {column} = 'victim'", bad)
    before = {p for p in gpucloud_home.parent.rglob("*")}
    with caplog.at_level(logging.WARNING):
        code, out, err = run(capsys, "worker", "--no-imds", "--once", "--output", "json")
    assert code == 0, err
    assert json.loads(out)["jobs"] == [{"job_id": "good", "state": "finished", "exit_code": 0}]
    made = {p for p in gpucloud_home.parent.rglob("*")} - before
    assert all(gpucloud_home in p.parents for p in made), sorted(map(str, made))
    code, out, err = run(capsys, "jobs", "--output", "json")
    assert code == 0 and [j["job_id"] for j in json.loads(out)] == ["good"], err


@pytest.mark.parametrize(
    "path",
    [
        "/etc/hostname",
        "/etc/passwd",
        "{home}/logs/other-job/attempt-1.log",
        "{home}/logs/j/attempt-2.log",
        "{home}/logs/j/../other-job/attempt-1.log",
        "logs/j/attempt-1.log",
        "s3://someone-elses-bucket/secrets.txt",
        "s3://bucket/logs/other-job/attempt-1/node/",
        "s3://bucket/logs/j/attempt-1/../../other-job/attempt-1/",
    ],
)
def test_job_logs_reads_only_the_attempts_own_log(capsys, gpucloud_home, tmp_path, path):
    run(capsys, "submit", "--job-id", "j", "--", "true")
    other = gpucloud_home / "logs" / "other-job" / "attempt-1.log"
    other.parent.mkdir(parents=True)
    other.write_text("another job's secret\n")
    named = path.format(home=gpucloud_home)
    _damage(
        gpucloud_home / "queue.db",
        "INSERT INTO events (job_id, attempt, kind, at, data) VALUES ('j', 1, 'started', 1.0, ?)",
        json.dumps({"log": named, "log_uri": named}),
    )
    code, out, err = run(capsys, "job", "logs", "j")
    assert code == 0, err
    assert out == ""
    assert "not where gpucloud keeps it" in err and "Traceback" not in err


def test_job_logs_does_not_follow_a_link_the_job_put_in_place_of_its_log(capsys, gpucloud_home):
    run(capsys, "submit", "--job-id", "j", "--", "true")
    log = gpucloud_home / "logs" / "j" / "attempt-1.log"
    log.parent.mkdir(parents=True)
    log.symlink_to("/etc/hostname")
    _damage(
        gpucloud_home / "queue.db",
        "INSERT INTO events (job_id, attempt, kind, at, data) VALUES ('j', 1, 'started', 1.0, ?)",
        json.dumps({"log": str(log)}),
    )
    code, out, err = run(capsys, "job", "logs", "j")
    assert code == 2 and out == "" and "symbolic link" in one_line_error(err)


EXTREME_TIMES = [1e308, -1e308, 1e20, -1e20, 2.0**63, 253402300800.0]  # the last: year 10000
TIME_COLUMNS = [
    ("jobs", "created_at"),
    ("jobs", "updated_at"),
    ("jobs", "lease_until"),
    ("jobs", "progress_at"),
    ("jobs", "cancel_requested_at"),
    ("attempts", "started_at"),
    ("attempts", "ended_at"),
    ("events", "at"),
]


@pytest.mark.parametrize("value", EXTREME_TIMES)
@pytest.mark.parametrize(("table", "column"), TIME_COLUMNS)
def test_a_time_no_calendar_holds_is_shown_not_a_traceback(capsys, gpucloud_home, table, column, value):
    run(capsys, "submit", "--job-id", "j", "--", "true")
    run(capsys, "worker", "--no-imds", "--once")
    key = "id" if table == "jobs" else "job_id"
    _damage(gpucloud_home / "queue.db", f"UPDATE {table} SET {column} = ? WHERE {key} = 'j'", value)
    for argv in (["jobs"], ["jobs", "-o", "json"], ["job", "show", "j"], ["job", "show", "j", "-o", "json"]):
        code, out, err = run(capsys, *argv)
        assert code == 0 and "Traceback" not in err, (argv, err)
        if "json" in argv:
            json.loads(out)


@pytest.mark.parametrize("attempt", [2**53, 2**53 + 1, 2**62, 2**63 - 1])
def test_resume_with_a_huge_attempt_number_is_one_line(capsys, gpucloud_home, attempt):
    run(capsys, "submit", "--job-id", "j", "--", "false")
    _damage(gpucloud_home / "queue.db", "UPDATE jobs SET state = 'failed', attempt = ? WHERE id = 'j'", attempt)
    code, _, err = run(capsys, "job", "resume", "j")
    line = one_line_error(err)
    assert code == 2 and ("most a job can have" in line or "'j' in the queue is unreadable (attempt" in line), line
