"""The supervisor against real processes: signals, control files, requeue, crash retries."""

from __future__ import annotations

import json
import os
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from gpucloud import jobenv
from gpucloud.jobs.runner import supervise_job
from gpucloud.jobs.supervisor import SupervisorConfig
from gpucloud.lifecycle.model import AttemptState, JobSpec, JobState
from gpucloud.queue.sqlite import SqliteQueue
from helpers.notices import Inbox, spot_notice
from helpers.waiting import wait_for

FAST = SupervisorConfig(ack_timeout=0.5, stop_margin=1.0, exit_grace=2.0, kill_after=0.5, tick=0.02)


def script(tmp_path: Path, name: str, body: str) -> list[str]:
    path = tmp_path / name
    path.write_text(textwrap.dedent(body))
    return [sys.executable, str(path)]


# The spot-train side of the contract, as a cooperative training script would speak it.
COOPERATIVE = """
    import os, sys, time
    from gpucloud import control
    ctl = os.environ["GPUCLOUD_CONTROL_DIR"]
    control.write(ctl, control.RESUMED, {"step": 0})
    step = 0
    while True:
        time.sleep(0.01)
        step += 1
        control.write(ctl, control.PROGRESS, {"step": step})
        if control.exists(ctl, control.SAVE):
            control.remove(ctl, control.SAVE)
            control.write(ctl, control.FINISHED, {"step": step})
            sys.exit(0)
        if control.exists(ctl, control.PREEMPT):
            control.write(ctl, control.ACK, {"step": step})
            control.write(ctl, control.COMMITTED, {"step": step})
            sys.exit(75)
"""

IGNORES_API = """
    import os, signal, sys, time
    out = sys.argv[1]
    def on_term(signum, frame):
        with open(out, "w") as fh:
            fh.write(repr(time.time()))
        sys.exit(143)
    signal.signal(signal.SIGTERM, on_term)
    open(out + ".started", "w").close()
    while True:
        time.sleep(0.01)
"""


@pytest.fixture
def q(tmp_path):
    queue = SqliteQueue(tmp_path / "q.db")
    yield queue
    queue.close()


def run_in_thread(q, job_id, inbox, config=FAST, **kw):
    result: dict = {}
    thread = threading.Thread(
        target=lambda: result.setdefault("r", supervise_job(q, job_id, notices=inbox, config=config, worker="w", **kw))
    )
    thread.start()
    return thread, result


def kinds(q, job_id):
    return [e.kind for e in q.events(job_id)]


def test_a_command_that_ignores_the_api_gets_sigterm_after_the_ack_timeout_before_the_deadline(q, tmp_path):
    marker = tmp_path / "sigterm-at"
    job = q.submit(JobSpec(command=script(tmp_path, "ignore.py", IGNORES_API) + [str(marker)]))
    inbox = Inbox()
    thread, result = run_in_thread(q, job.id, inbox)
    wait_for(lambda: Path(str(marker) + ".started").exists(), what="the command to start")
    notice = spot_notice(lead=10.0)
    inbox.put(notice)
    thread.join(timeout=30)
    r = result["r"]
    assert r.exit_code == jobenv.EXIT_REQUEUED
    got_sigterm = float(marker.read_text())
    assert notice.received_at + FAST.ack_timeout <= got_sigterm < notice.deadline - FAST.stop_margin
    stop = [e for e in q.events(job.id) if e.kind == "stop"]
    assert [e.data["signal"] for e in stop] == ["SIGTERM"] and "ack" in stop[0].data["reason"]
    assert stop[0].data["phase"] == "flagged"  # the session never acknowledged
    assert q.get(job.id).state is JobState.QUEUED and q.get(job.id).attempt == 2


def test_sigkill_follows_when_the_command_ignores_sigterm(q, tmp_path):
    stubborn = script(
        tmp_path,
        "stubborn.py",
        """
        import signal, time, sys
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        open(sys.argv[1], "w").close()
        while True:
            time.sleep(0.01)
    """,
    )
    started = tmp_path / "started"
    job = q.submit(JobSpec(command=stubborn + [str(started)]))
    inbox = Inbox()
    thread, result = run_in_thread(q, job.id, inbox)
    wait_for(started.exists, what="the command to start")
    inbox.put(spot_notice(lead=10.0))
    thread.join(timeout=30)
    assert [e.data["signal"] for e in q.events(job.id) if e.kind == "stop"] == ["SIGTERM", "SIGKILL"]
    assert result["r"].attempts[0].command_exit == -9 and result["r"].exit_code == 75


def test_a_cooperative_command_checkpoints_and_is_requeued_without_any_signal(q, tmp_path):
    job = q.submit(JobSpec(command=script(tmp_path, "coop.py", COOPERATIVE)))
    inbox = Inbox()
    thread, result = run_in_thread(q, job.id, inbox)
    wait_for(lambda: "resume" in kinds(q, job.id), what="the session to resume")
    inbox.put(spot_notice(lead=30.0))
    thread.join(timeout=30)
    r = result["r"]
    assert r.exit_code == 75 and r.attempts[0].end.state is AttemptState.REQUEUED
    assert "stop" not in kinds(q, job.id)
    first = q.attempts(job.id)[0]
    assert first.committed_step is not None and first.committed_step == first.last_step
    assert kinds(q, job.id).index("flag") < kinds(q, job.id).index("ack") < kinds(q, job.id).index("commit")


def test_a_rank_that_acks_the_instant_the_flag_appears_is_still_recorded_after_the_flag(q, tmp_path, monkeypatch):
    # The worst case of a loaded machine: a rank sees the preempt file and acks before the
    # supervisor gets to record the flag. The timeline is ordered by time, so the flag's time must
    # be taken before the file can be seen, whatever the scheduler does next.
    from gpucloud import control

    real_write = control.write

    def write_then_a_rank_acks_at_once(control_dir, name, payload):
        path = real_write(control_dir, name, payload)
        if name == control.PREEMPT:
            real_write(control_dir, control.ACK, {"step": 1})
        return path

    monkeypatch.setattr(control, "write", write_then_a_rank_acks_at_once)
    job = q.submit(JobSpec(command=script(tmp_path, "coop.py", COOPERATIVE)))
    inbox = Inbox()
    thread, _ = run_in_thread(q, job.id, inbox)
    wait_for(lambda: "resume" in kinds(q, job.id), what="the session to resume")
    inbox.put(spot_notice(lead=30.0))
    thread.join(timeout=30)
    assert kinds(q, job.id).index("flag") < kinds(q, job.id).index("ack")


def test_duplicate_and_repeated_stop_notices_yield_one_flag_and_one_requeue(q, tmp_path):
    job = q.submit(JobSpec(command=script(tmp_path, "coop.py", COOPERATIVE)))
    inbox = Inbox()
    thread, result = run_in_thread(q, job.id, inbox)
    wait_for(lambda: "resume" in kinds(q, job.id), what="the session to resume")
    same = spot_notice(lead=30.0)
    for notice in (same, same, same, spot_notice(lead=20.0, payload={"action": "terminate", "time": "other"})):
        inbox.put(notice)
    thread.join(timeout=30)
    assert kinds(q, job.id).count("flag") == 1 and kinds(q, job.id).count("requeue") == 1
    assert [a.number for a in q.attempts(job.id)] == [1, 2]
    # Ending the attempt again (a racing duplicate) changes nothing.
    assert not q.end_attempt(job.id, 1, result["r"].attempts[0].end).applied


def test_a_rebalance_recommendation_asks_for_an_early_checkpoint_and_does_not_stop(q, tmp_path):
    job = q.submit(JobSpec(command=script(tmp_path, "coop.py", COOPERATIVE)))
    inbox = Inbox()
    thread, result = run_in_thread(q, job.id, inbox)
    wait_for(lambda: "resume" in kinds(q, job.id), what="the session to resume")
    inbox.put(spot_notice(kind="rebalance", payload={"noticeTime": "now"}))
    thread.join(timeout=30)
    assert result["r"].exit_code == 0 and q.get(job.id).state is JobState.FINISHED  # the script finishes on `save`
    assert "save" in kinds(q, job.id) and "flag" not in kinds(q, job.id)


def test_crashes_are_retried_with_the_next_attempt_number_then_failed_with_the_reason(q, tmp_path):
    seen = tmp_path / "attempts.txt"
    crash = script(
        tmp_path,
        "crash.py",
        """
        import os, sys
        with open(sys.argv[1], "a") as fh:
            fh.write(os.environ["GPUCLOUD_ATTEMPT"] + "\\n")
        print("CUDA error: an illegal memory access was encountered", flush=True)
        sys.exit(3)
    """,
    )
    job = q.submit(JobSpec(command=crash + [str(seen)], max_attempts=3))
    with open(os.devnull, "w") as devnull:
        r = supervise_job(q, job.id, notices=Inbox(), config=FAST, worker="w", sink=devnull)
    assert seen.read_text().split() == ["1", "2", "3"]
    assert r.exit_code == 3
    failed = q.get(job.id)
    assert failed.state is JobState.FAILED
    assert "code 3" in failed.reason and "illegal memory access" in failed.reason and "3 of 3" in failed.reason


def test_a_crash_then_a_success_finishes_the_job(q, tmp_path):
    flaky = script(
        tmp_path,
        "flaky.py",
        """
        import os, sys
        sys.exit(1 if os.environ["GPUCLOUD_ATTEMPT"] == "1" else 0)
    """,
    )
    job = q.submit(JobSpec(command=flaky, max_attempts=2))
    r = supervise_job(q, job.id, notices=Inbox(), config=FAST, worker="w")
    assert r.exit_code == 0 and [a.end.state for a in r.attempts] == [AttemptState.CRASHED, AttemptState.FINISHED]


def test_the_command_gets_the_job_environment(q, tmp_path):
    dump = tmp_path / "env.json"
    printer = script(
        tmp_path,
        "env.py",
        """
        import json, os, sys
        json.dump({k: v for k, v in os.environ.items() if k.startswith("GPUCLOUD_") or k == "EXTRA"}, open(sys.argv[1], "w"))
    """,
    )
    job = q.submit(JobSpec(command=printer + [str(dump)], checkpoint_uri="/ckpt", env={"EXTRA": "1"}))
    supervise_job(q, job.id, notices=Inbox(), config=FAST, worker="w", local_checkpoint_dir="/nvme")
    env = json.loads(dump.read_text())
    assert env[jobenv.JOB_ID] == job.id and env[jobenv.ATTEMPT] == "1"
    assert env[jobenv.CHECKPOINT_URI] == "/ckpt" and env[jobenv.LOCAL_CHECKPOINT_DIR] == "/nvme"
    assert Path(env[jobenv.CONTROL_DIR]).is_dir() and env["EXTRA"] == "1"


def test_ranks_in_sessions_of_their_own_are_stopped_too(q, tmp_path):
    # torchrun starts every worker with start_new_session=True: a killpg of our group misses them.
    pidfile = tmp_path / "rank.pid"
    launcher = script(
        tmp_path,
        "launcher.py",
        """
        import subprocess, sys, time
        rank = subprocess.Popen([sys.executable, "-c", "import time\\nwhile True: time.sleep(0.05)"], start_new_session=True)
        open(sys.argv[1], "w").write(str(rank.pid))
        while True:
            time.sleep(0.05)
    """,
    )
    job = q.submit(JobSpec(command=launcher + [str(pidfile)]))
    inbox = Inbox()
    thread, result = run_in_thread(q, job.id, inbox)
    wait_for(lambda: pidfile.exists() and pidfile.read_text(), what="the rank to start")
    rank_pid = int(pidfile.read_text())
    time.sleep(0)  # the supervisor's next scan picks the rank up; the notice path refreshes anyway
    inbox.put(spot_notice(lead=10.0))
    thread.join(timeout=30)
    assert result["r"].exit_code == 75
    wait_for(lambda: not _alive(rank_pid), timeout=5, what="the rank to be gone")


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_a_missing_program_fails_the_job_with_a_clear_reason(q, tmp_path):
    job = q.submit(JobSpec(command=["definitely-not-a-program-xyz"]))
    r = supervise_job(q, job.id, notices=Inbox(), config=FAST, worker="w")
    assert r.exit_code == 127
    assert "command not found" in q.get(job.id).reason


def test_an_attempt_whose_lease_was_taken_over_stops_and_is_not_requeued_twice(q, tmp_path):
    import sqlite3

    started = tmp_path / "started"
    loop = script(
        tmp_path,
        "loop.py",
        """
        import sys, time
        open(sys.argv[1], "w").close()
        while True:
            time.sleep(0.01)
    """,
    )
    job = q.submit(JobSpec(command=loop + [str(started)]))
    config = SupervisorConfig(ack_timeout=0.5, stop_margin=1.0, kill_after=0.5, tick=0.02, lease_seconds=0.4)
    thread, result = run_in_thread(q, job.id, Inbox(), config=config)
    wait_for(started.exists, what="the command to start")
    thief = SqliteQueue(tmp_path / "q.db")
    raw = sqlite3.connect(tmp_path / "q.db", isolation_level=None)

    def take_over():
        raw.execute("UPDATE jobs SET lease_until = 0 WHERE id = ?", (job.id,))  # as if the worker had stalled
        return thief.claim("thief", lease_seconds=60, job_id=job.id)

    stolen = wait_for(take_over, what="another worker to take the job over")
    thread.join(timeout=30)
    r = result["r"]
    assert stolen.attempt == 2 and r.attempts[0].end.state is AttemptState.LOST and not r.attempts[0].transition.applied
    assert r.exit_code == 75
    assert any(e.kind == "stop" and "lease lost" in e.data["reason"] for e in q.events(job.id))
    assert q.get(job.id).worker == "thief" and [a.number for a in q.attempts(job.id)] == [1, 2]
    raw.close()
    thief.close()


def test_garbage_in_control_files_is_ignored_not_trusted(q, tmp_path):
    liar = script(
        tmp_path,
        "liar.py",
        """
        import json, os, sys
        ctl = os.environ["GPUCLOUD_CONTROL_DIR"]
        open(os.path.join(ctl, "progress"), "w").write("{not json")
        json.dump({"step": "seven"}, open(os.path.join(ctl, "committed"), "w"))
        json.dump(["not", "an", "object"], open(os.path.join(ctl, "ack"), "w"))
        sys.exit(75)
    """,
    )
    job = q.submit(JobSpec(command=liar))
    r = supervise_job(q, job.id, notices=Inbox(), config=FAST, worker="w")
    end = r.attempts[0].end
    assert end.state is AttemptState.REQUEUED and end.committed_step is None and end.last_step is None
    assert "ack" not in kinds(q, job.id)
