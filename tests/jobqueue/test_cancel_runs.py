"""`gpucloud job cancel` against a real running attempt, on every backend: the supervisor reads the
cancel from the queue (no local notice), the command saves its step like at a notice, and the job
ends `cancelled` with no attempt k+1; the worker is free for the next job."""

from __future__ import annotations

import sys
import textwrap
import threading
from pathlib import Path

from gpucloud.jobs.runner import supervise_job
from gpucloud.jobs.supervisor import EXIT_CANCELLED, SupervisorConfig
from gpucloud.lifecycle.model import AttemptState, JobSpec, JobState
from helpers.notices import Inbox
from helpers.waiting import wait_for
from jobs.test_runner import COOPERATIVE  # the spot-train side of the contract, as a cooperative script speaks it

FAST = SupervisorConfig(ack_timeout=5.0, stop_margin=1.0, exit_grace=5.0, kill_after=1.0, tick=0.02, stop_poll=0.1)


def test_a_running_job_saves_its_step_and_ends_cancelled(open_backend, tmp_path: Path):
    supervisor_side, user_side = open_backend(), open_backend()
    train = tmp_path / "train.py"
    train.write_text(textwrap.dedent(COOPERATIVE))
    job = user_side.submit(JobSpec(command=[sys.executable, str(train)]))
    result: dict = {}
    thread = threading.Thread(
        target=lambda: result.setdefault(
            "r", supervise_job(supervisor_side, job.id, notices=Inbox(), config=FAST, worker="w")
        )
    )
    thread.start()
    try:
        wait_for(lambda: any(e.kind == "resume" for e in user_side.events(job.id)), what="the command to start")
        assert user_side.cancel(job.id, grace_seconds=60).state is JobState.RUNNING
    finally:
        thread.join(timeout=60)
    assert not thread.is_alive()
    outcome = result["r"]
    assert outcome.exit_code == EXIT_CANCELLED
    assert outcome.node_stopping is False  # a cancel stops the job, not the node
    ended = user_side.get(job.id)
    assert ended.state is JobState.CANCELLED and ended.worker is None and ended.lease_until is None
    [attempt] = user_side.attempts(job.id)  # never requeued
    assert attempt.state is AttemptState.CANCELLED
    assert attempt.committed_step is not None and attempt.committed_step >= 1  # the step was saved
    kinds = [e.kind for e in user_side.events(job.id)]
    assert {"cancel", "stop-request", "flag", "ack", "commit", "cancelled"} <= set(kinds)
    assert "requeue" not in kinds
