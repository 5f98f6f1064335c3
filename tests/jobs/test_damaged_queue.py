"""A damaged, edited or busy SQLite queue: one line naming the problem, never a traceback, and one
bad row never hides or blocks the rest of the queue."""

from __future__ import annotations

import json
import logging
import sqlite3
import sys
import threading
import time
from pathlib import Path

import pytest

from gpucloud.errors import UserError
from gpucloud.lifecycle.model import JobSpec
from gpucloud.queue.sqlite import QueueBusy, SqliteQueue
from helpers.waiting import wait_for

from .test_cli import one_line_error, run

QUEUE_LOG = "gpucloud.queue.sqlite"


def _damage(db: Path, sql: str, *args: object) -> None:
    """Change the file as another program (or a flipped bit) would: no constraint checks."""
    raw = sqlite3.connect(db)
    raw.execute("PRAGMA ignore_check_constraints = ON")
    raw.execute(sql, args)
    raw.commit()
    raw.close()


def _warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == QUEUE_LOG and r.levelno >= logging.WARNING]


@pytest.mark.parametrize(
    "column, value, problem",
    [
        ("spec", '{"command": ["true"', "spec"),
        ("spec", "[" * 50_000, "spec"),
        ("state", "paused", "state"),
        ("lease_until", "soon", "lease_until"),
    ],
    ids=["bad spec JSON", "deep spec JSON", "bad state", "text lease_until"],
)
def test_an_unreadable_job_row_is_skipped_with_one_line_and_the_worker_runs_the_next_job(
    capsys, caplog, gpucloud_home, column, value, problem
):
    run(capsys, "submit", "--job-id", "bad", "--", sys.executable, "-c", "pass")
    run(capsys, "submit", "--job-id", "good", "--", sys.executable, "-c", "pass")
    _damage(gpucloud_home / "queue.db", f"UPDATE jobs SET {column} = ? WHERE id = 'bad'", value)
    with caplog.at_level(logging.WARNING, logger=QUEUE_LOG):
        code, out, err = run(capsys, "jobs", "--output", "json")
        assert code == 0, err
        assert [j["job_id"] for j in json.loads(out)] == ["good"]
        [line] = _warnings(caplog)
        assert "'bad'" in line and problem in line and "\n" not in line
        caplog.clear()
        code, out, err = run(capsys, "worker", "--no-imds", "--once", "--output", "json")
    assert code == 0, err
    assert json.loads(out)["jobs"] == [{"job_id": "good", "state": "finished", "exit_code": 0}]
    assert len(_warnings(caplog)) <= 1  # at most one line per bad row, however often the worker reads it


def test_a_bad_event_row_and_a_bad_attempt_row_leave_job_show_working(capsys, caplog, gpucloud_home):
    run(capsys, "submit", "--job-id", "j", "--", "true")
    db = gpucloud_home / "queue.db"
    _damage(db, "UPDATE events SET data = '{not json' WHERE job_id = 'j' AND kind = 'submitted'")
    _damage(db, "INSERT INTO events (job_id, attempt, kind, at, data) VALUES ('j', 1, 'exit', 'noon', '{}')")
    _damage(db, "UPDATE attempts SET state = 'sleeping' WHERE job_id = 'j'")
    with caplog.at_level(logging.WARNING, logger=QUEUE_LOG):
        code, out, err = run(capsys, "job", "show", "j", "--output", "json")
    assert code == 0, err
    report = json.loads(out)
    assert [e["kind"] for e in report["timeline"]] == ["submitted"]  # kept, without its unreadable data
    lines = _warnings(caplog)
    assert len(lines) == 3 and all("\n" not in line for line in lines)
    assert any("submitted" in line and "not JSON" in line for line in lines)
    assert any("attempt 1" in line and "state" in line for line in lines)


@pytest.mark.parametrize(
    "argv", [["jobs"], ["job", "show", "j"], ["submit", "--", "true"], ["worker", "--no-imds", "--once"]]
)
def test_an_unknown_schema_version_is_one_line_in_every_command(capsys, gpucloud_home, argv):
    run(capsys, "submit", "--job-id", "j", "--", "true")
    _damage(gpucloud_home / "queue.db", "UPDATE meta SET value = 'abc' WHERE key = 'schema_version'")
    code, _, err = run(capsys, *argv)
    assert code == 2 and "has schema version 'abc'" in one_line_error(err)


def test_an_empty_program_name_is_one_line(capsys):
    code, _, err = run(capsys, "submit", "--", "")
    assert code == 2 and "program name is empty" in one_line_error(err)


def test_a_missing_workdir_is_named(capsys, tmp_path):
    missing = tmp_path / "gone"
    # submit ships --workdir as a snapshot, so it refuses a missing one at once ...
    code, _, err = run(capsys, "submit", "--job-id", "w", "--workdir", str(missing), "--", "true")
    assert code == 2 and f"Directory '{missing}' does not exist" in one_line_error(err)
    # ... and a job whose node-side working directory is missing (recorded by an older submit) is named on the node
    from gpucloud.queue.connect import open_queue

    open_queue().submit(JobSpec(command=["true"], workdir=str(missing)), job_id="w")
    run(capsys, "worker", "--no-imds", "--once")
    _, out, _ = run(capsys, "job", "show", "w", "--output", "json")
    reason = json.loads(out)["attempts"][0]["reason"]
    assert f"working directory {str(missing)!r} does not exist" in reason and "command not found" not in reason


def test_listing_behind_another_writer_answers_at_once(capsys, gpucloud_home):
    run(capsys, "submit", "--job-id", "j", "--", "true")
    writer = sqlite3.connect(gpucloud_home / "queue.db", isolation_level=None)
    writer.execute("BEGIN IMMEDIATE")  # holds the write lock until the end of the test
    try:
        code, out, err = run(capsys, "jobs", "--output", "json")  # before: 30 s, then "move it away"
        assert code == 0, err
        assert [j["job_id"] for j in json.loads(out)] == ["j"]
    finally:
        writer.execute("ROLLBACK")
        writer.close()


def test_a_write_behind_a_stuck_writer_says_busy_not_damaged(tmp_path):
    db = tmp_path / "queue.db"
    SqliteQueue(db).close()
    writer = sqlite3.connect(db, isolation_level=None)
    writer.execute("BEGIN IMMEDIATE")
    try:
        q = SqliteQueue(db, busy_timeout_s=0.05, lock_patience_s=0.2)
        with pytest.raises(QueueBusy, match=r"is busy: another process has held its write lock .*not damaged"):
            q.submit(JobSpec(command=["true"]))
        q.close()
    finally:
        writer.execute("ROLLBACK")
        writer.close()


class _Seen(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.busy = threading.Event()

    def emit(self, record: logging.LogRecord) -> None:
        if "is busy" in record.getMessage():
            self.busy.set()


def test_a_patient_queue_outwaits_a_lock_held_past_the_busy_timeout_and_proceeds(tmp_path):
    """The worker's side: a queue write-locked for longer than SQLite's busy timeout must
    not raise ``database is locked`` (which killed the worker and orphaned its training)."""
    db = tmp_path / "queue.db"
    q = SqliteQueue(db, busy_timeout_s=0.05, lock_patience_s=None)
    job = q.submit(JobSpec(command=["true"]))
    seen = _Seen()
    logging.getLogger(QUEUE_LOG).addHandler(seen)
    writer = sqlite3.connect(db, isolation_level=None)
    outcome: dict[str, object] = {}

    def claim() -> None:
        try:
            outcome["job"] = q.claim("w", lease_seconds=60)
        except BaseException as err:  # noqa: BLE001 - the test reports whatever escaped
            outcome["error"] = err

    try:
        writer.execute("BEGIN IMMEDIATE")
        claimer = threading.Thread(target=claim, daemon=True)
        claimer.start()
        wait_for(seen.busy.is_set, what="the claim to find the queue busy")  # past SQLite's own timeout
        held_until = time.monotonic() + 1.0  # the lock stays held for 20 busy timeouts, not one
        wait_for(lambda: time.monotonic() >= held_until or outcome, what="the lock to be held a while")
        assert claimer.is_alive() and not outcome  # still waiting, not failed
        writer.execute("ROLLBACK")
        claimer.join(timeout=60)
    finally:
        logging.getLogger(QUEUE_LOG).removeHandler(seen)
        if writer.in_transaction:
            writer.execute("ROLLBACK")
        writer.close()
    assert "error" not in outcome, outcome.get("error")
    assert outcome["job"].id == job.id
    q.close()


def _populated_queue(db: Path) -> None:
    q = SqliteQueue(db)
    for n in range(40):
        job = q.submit(JobSpec(command=["python", "train.py", "x" * 200]), job_id=f"job-{n}")
        for k in range(5):
            q.record(job.id, 1, "notice", data={"n": k, "pad": "y" * 300})
    q.close()


def _every_command(db: Path) -> None:
    q = SqliteQueue(db)
    try:
        for job in q.list_jobs():
            q.attempts(job.id)
            q.events(job.id)
        q.claim("w", lease_seconds=60)
        q.submit(JobSpec(command=["true"]))
        q.nodes()
    finally:
        q.close()


def test_a_damaged_page_anywhere_is_one_line_never_a_traceback(tmp_path):
    """Every page of a populated queue overwritten in turn: each run either works or fails as a
    ``UserError`` (before: a ``DatabaseError`` traceback from the command that first read it)."""
    template = tmp_path / "template.db"
    _populated_queue(template)
    raw = sqlite3.connect(template)
    raw.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    page_size, pages = raw.execute("PRAGMA page_size").fetchone()[0], raw.execute("PRAGMA page_count").fetchone()[0]
    raw.close()
    image = template.read_bytes()
    tracebacks = []
    for page in range(1, pages):  # page 0 (the header) is refused at open by every version
        damaged = bytearray(image)
        damaged[page * page_size : (page + 1) * page_size] = bytes([0x5A]) * page_size
        db = tmp_path / f"damaged-{page}.db"
        db.write_bytes(bytes(damaged))
        try:
            _every_command(db)
        except UserError as err:
            assert "\n" not in str(err)
        except Exception as err:  # noqa: BLE001 - counted: each one is a traceback for the user
            tracebacks.append((page, repr(err)[:120]))
    assert tracebacks == [], f"{len(tracebacks)} of {pages - 1} damaged pages: {tracebacks[:3]}"


def test_a_supervisor_outwaits_a_queue_locked_past_the_busy_timeout_and_finishes_the_job(tmp_path):
    """Item 2's cause: a worker died of ``database is locked`` and left its training orphaned.
    The queue is write-locked while the command runs and ends; the supervisor waits, then records."""
    from gpucloud.jobs.runner import supervise_job
    from gpucloud.jobs.supervisor import SupervisorConfig
    from helpers.notices import Inbox

    db, go = tmp_path / "queue.db", tmp_path / "go"
    q = SqliteQueue(db, busy_timeout_s=0.05, lock_patience_s=None)
    wait_then_exit = f"import os, time\nwhile not os.path.exists({str(go)!r}): time.sleep(0.02)"
    job = q.submit(JobSpec(command=[sys.executable, "-c", wait_then_exit]))
    seen = _Seen()
    logging.getLogger(QUEUE_LOG).addHandler(seen)
    writer = sqlite3.connect(db, isolation_level=None)
    outcome: dict[str, object] = {}

    def supervise() -> None:
        try:
            outcome["result"] = supervise_job(q, job.id, worker="w", notices=Inbox(), config=SupervisorConfig())
        except BaseException as err:  # noqa: BLE001 - the test reports whatever escaped
            outcome["error"] = err

    supervisor = threading.Thread(target=supervise, daemon=True)
    try:
        supervisor.start()
        wait_for(lambda: "started" in [e.kind for e in SqliteQueue(db).events(job.id)], what="the command to start")
        writer.execute("BEGIN IMMEDIATE")
        go.write_text("")  # the command exits while the queue is locked: its end must wait, not fail
        wait_for(seen.busy.is_set, what="the supervisor to find the queue busy")
        held_until = time.monotonic() + 1.0  # the lock stays held for 20 busy timeouts, not one
        wait_for(lambda: time.monotonic() >= held_until or outcome, what="the lock to be held a while")
        assert supervisor.is_alive() and not outcome
        writer.execute("ROLLBACK")
        supervisor.join(timeout=120)
    finally:
        logging.getLogger(QUEUE_LOG).removeHandler(seen)
        if writer.in_transaction:
            writer.execute("ROLLBACK")
        writer.close()
    assert "error" not in outcome, outcome.get("error")
    assert outcome["result"].exit_code == 0 and q.get(job.id).state.value == "finished"
    q.close()


def test_a_notice_flags_the_ranks_while_the_queue_is_write_locked(tmp_path, gpucloud_home):
    """The flag is the notice's whole point: it is written before the timeline, so another
    process holding the queue's write lock cannot delay it (before: it waited for the lock)."""
    from gpucloud.jobs.runner import supervise_job
    from gpucloud.jobs.supervisor import SupervisorConfig
    from helpers.notices import Inbox, spot_notice

    db = tmp_path / "queue.db"
    q = SqliteQueue(db, busy_timeout_s=0.05, lock_patience_s=None)
    control_dir = gpucloud_home / "run"
    job = q.submit(JobSpec(command=[sys.executable, "-c", "import time\nwhile True: time.sleep(0.05)"]))
    inbox = Inbox()
    config = SupervisorConfig(ack_timeout=0.5, stop_margin=1.0, exit_grace=2.0, kill_after=0.5, tick=0.02)
    outcome: dict[str, object] = {}

    def supervise() -> None:
        try:
            outcome["result"] = supervise_job(q, job.id, worker="w", notices=inbox, config=config)
        except BaseException as err:  # noqa: BLE001 - the test reports whatever escaped
            outcome["error"] = err

    supervisor = threading.Thread(target=supervise, daemon=True)
    writer = sqlite3.connect(db, isolation_level=None)
    try:
        supervisor.start()
        wait_for(lambda: "started" in [e.kind for e in SqliteQueue(db).events(job.id)], what="the command to start")
        writer.execute("BEGIN IMMEDIATE")
        inbox.put(spot_notice(lead=60.0))
        flags = wait_for(lambda: list(control_dir.rglob("preempt*")), what="the ranks' flag, queue locked")
        assert flags and supervisor.is_alive() and not outcome
        writer.execute("ROLLBACK")
        supervisor.join(timeout=120)
    finally:
        if writer.in_transaction:
            writer.execute("ROLLBACK")
        writer.close()
    assert "error" not in outcome, outcome.get("error")
    assert outcome["result"].exit_code == 75  # requeued: the notice was handled as one
    kinds = [e.kind for e in q.events(job.id)]
    assert kinds.index("notice") < kinds.index("flag")  # the timeline still reads in order
    q.close()
