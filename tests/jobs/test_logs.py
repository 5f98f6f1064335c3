"""`gpucloud job logs`, offline: every attempt's stdout and stderr are kept, the
crashed and the interrupted ones too, with the supervisor's lines interleaved and marked; --attempt
picks one; --follow streams a running attempt until the job ends."""

from __future__ import annotations

import io
import re
import threading

import pytest

from gpucloud.jobs.logs import END_MARKER, AttemptLog, LogReader, attempt_log_path, show_logs, sources
from gpucloud.jobs.runner import supervise_job
from gpucloud.lifecycle.model import Attempt, AttemptState, Event, JobSpec, JobState
from gpucloud.queue.sqlite import SqliteQueue
from helpers.notices import Inbox, spot_notice
from helpers.waiting import wait_for

from .test_cli import one_line_error, run
from .test_runner import FAST, script

SUPERVISOR_LINE = re.compile(r"^\[gpucloud \d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z\] ", re.M)

# Attempt 1 writes to both streams and crashes; attempt 2 (retried at once) finishes.
CRASH_THEN_FINISH = """
    import os, sys
    attempt = os.environ["GPUCLOUD_ATTEMPT"]
    print(f"out of attempt {attempt}", flush=True)
    print(f"err of attempt {attempt}", file=sys.stderr, flush=True)
    sys.exit(3 if attempt == "1" else 0)
"""

# Prints a line per tick until the gate opens: the running attempt a follower streams.
TICKING = """
    import os, sys, time
    gate = sys.argv[1]
    tick = 0
    while not os.path.exists(gate):
        tick += 1
        print(f"tick {tick}", flush=True)
        time.sleep(0.05)
    print("gate open, done", flush=True)
"""


@pytest.fixture
def queue_file(gpucloud_home):
    path = gpucloud_home / "queue.db"  # the default queue of the CLI under this GPUCLOUD_HOME
    queue = SqliteQueue(path)
    yield queue
    queue.close()


def test_a_crashed_and_a_retried_attempt_both_keep_their_output(capsys, tmp_path, queue_file):
    job = queue_file.submit(JobSpec(command=script(tmp_path, "train.py", CRASH_THEN_FINISH), max_attempts=2))
    assert supervise_job(queue_file, job.id, notices=Inbox(), config=FAST, worker="w").exit_code == 0
    capsys.readouterr()
    code, out, err = run(capsys, "job", "logs", job.id)
    assert code == 0 and err == ""
    first, second = out.split("==> attempt 2 (finished) <==\n")
    assert first.startswith("==> attempt 1 (crashed) <==\n")
    assert "out of attempt 1\n" in first and "err of attempt 1\n" in first and "of attempt 2" not in first
    assert "out of attempt 2\n" in second and "err of attempt 2\n" in second
    # The supervisor's own lines, interleaved and marked as its own.
    assert re.search(SUPERVISOR_LINE.pattern + r"command exited with code 3", first, re.M)
    assert re.search(SUPERVISOR_LINE.pattern + r"job finished", second, re.M)
    assert END_MARKER not in out
    code, out, _ = run(capsys, "job", "logs", job.id, "--attempt", "1")
    assert code == 0 and "out of attempt 1" in out and "of attempt 2" not in out and "==>" not in out


def test_an_interrupted_attempt_keeps_its_output_and_the_notice_lines(tmp_path, queue_file):
    from .test_runner import COOPERATIVE

    job = queue_file.submit(JobSpec(command=script(tmp_path, "train.py", COOPERATIVE)))
    inbox = Inbox()
    done: dict = {}
    thread = threading.Thread(
        target=lambda: done.setdefault("r", supervise_job(queue_file, job.id, notices=inbox, config=FAST, worker="w"))
    )
    thread.start()
    wait_for(lambda: any(e.kind == "resume" for e in queue_file.events(job.id)), what="the attempt to train")
    inbox.put(spot_notice(30))
    thread.join(timeout=60)
    assert done["r"].exit_code == 75 and queue_file.get(job.id).state is JobState.QUEUED
    written: list[str] = []
    notes = show_logs(queue_file, queue_file.get(job.id), attempt=None, follow=False, out=written.append)
    text = "".join(written)
    assert text.startswith("==> attempt 1 (requeued) <==\n")
    for expected in ("spot-interruption notice from test", "checkpoint of step", "job requeued as attempt 2"):
        assert re.search(SUPERVISOR_LINE.pattern + r".*" + expected, text, re.M), text
    assert notes == ["attempt 2 has not started yet"]


def test_follow_streams_the_running_attempt_and_stops_when_the_job_ends(tmp_path, queue_file):
    gate = tmp_path / "gate"
    job = queue_file.submit(JobSpec(command=[*script(tmp_path, "train.py", TICKING), str(gate)]))
    supervisor = threading.Thread(
        target=lambda: supervise_job(queue_file, job.id, notices=Inbox(), config=FAST, worker="w"), daemon=True
    )
    supervisor.start()
    streamed: list[str] = []
    follower_queue = SqliteQueue(queue_file.path)
    follower = threading.Thread(
        target=lambda: show_logs(
            follower_queue, queue_file.get(job.id), attempt=None, follow=True, out=streamed.append, poll_s=0.05
        ),
        daemon=True,
    )
    try:
        wait_for(lambda: queue_file.get(job.id).state is JobState.RUNNING, what="the attempt to run")
        follower.start()
        wait_for(lambda: "tick 3\n" in "".join(streamed), what="ticks streamed while the attempt runs")
        assert queue_file.get(job.id).state is JobState.RUNNING  # streamed live, not after the end
        gate.touch()
        follower.join(timeout=60)
        assert not follower.is_alive(), "--follow did not stop when the job finished"
    finally:
        gate.touch()
        supervisor.join(timeout=60)
        follower_queue.close()
    text = "".join(streamed)
    assert "gate open, done\n" in text and re.search(SUPERVISOR_LINE.pattern + "job finished", text, re.M)
    assert text.count("==> attempt 1") == 1


def test_follow_from_the_shell_ends_at_once_for_a_finished_job(capsys, tmp_path, queue_file):
    job = queue_file.submit(JobSpec(command=script(tmp_path, "train.py", CRASH_THEN_FINISH), max_attempts=2))
    supervise_job(queue_file, job.id, notices=Inbox(), config=FAST, worker="w")
    capsys.readouterr()
    code, out, _ = run(capsys, "job", "logs", job.id, "--follow", "--attempt", "2")
    assert code == 0 and "out of attempt 2" in out and "attempt 1" not in out


def test_bad_input_is_one_line(capsys, queue_file, tmp_path):
    job = queue_file.submit(JobSpec(command=["python", "train.py"]), job_id="never-ran")
    code, out, err = run(capsys, "job", "logs", "nope")
    assert code == 2 and out == "" and "no job 'nope'" in one_line_error(err)
    code, out, err = run(capsys, "job", "logs", job.id, "--attempt", "4")
    assert code == 2 and out == ""
    assert one_line_error(err).endswith("job never-ran has only attempt 1; --attempt 4 is not one of them")
    code, _, err = run(capsys, "job", "logs", job.id, "--attempt", "0")
    assert code == 2 and "--attempt" in err
    code, out, err = run(capsys, "job", "logs", job.id)  # queued: nothing yet, and it says so
    assert code == 0 and out == "" and err == "gpucloud: attempt 1 has not started yet\n"


def test_help_teaches(capsys):
    code, out, _ = run(capsys, "job", "logs", "--help")
    assert code == 0
    for expected in ("--attempt", "--follow", "[gpucloud", "gpucloud job logs llama-7b --follow", "crashed"):
        assert expected in out


def test_the_reader_holds_a_line_until_it_ends_and_never_splits_a_character(tmp_path):
    path = attempt_log_path("j", 1, tmp_path / "logs")
    log = AttemptLog(path, echo=io.StringIO())

    attempt = Attempt(job_id="j", number=1, state=AttemptState.RUNNING, created_at=0.0, started_at=0.0)
    [source] = sources([attempt], [Event(job_id="j", attempt=1, kind="started", at=0.0, data={"log": str(path)})])
    shown: list[str] = []
    reader = LogReader(shown.append, headers=False)
    with open(path, "ab") as fh:
        fh.write(b"half a line, " + "é".encode()[:1])
    assert not reader.pump(source)
    with open(path, "ab") as fh:
        fh.write("é".encode()[1:] + b" whole\n")
    assert reader.pump(source) and shown == ["half a line, \u00e9 whole\n"]
    log.close()
    assert not reader.pump(source) and reader.done(source)


def test_a_command_that_could_not_start_keeps_why_in_its_log(capsys, queue_file):
    job = queue_file.submit(JobSpec(command=["no-such-program-for-gpucloud"]))
    assert supervise_job(queue_file, job.id, notices=Inbox(), config=FAST, worker="w").exit_code == 127
    capsys.readouterr()
    code, out, _ = run(capsys, "job", "logs", job.id, "--attempt", "1")
    assert code == 0
    assert re.search(SUPERVISOR_LINE.pattern + r"command exited with code 127: command not found", out, re.M), out
