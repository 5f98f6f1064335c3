"""Live progress through the supervisor: a running attempt's step and rate reach
the job record while it trains; its end leaves the last step and no rate."""

from __future__ import annotations

import pytest

from gpucloud.cost.timeline import build_timeline
from gpucloud.lifecycle.model import JobSpec, JobState
from gpucloud.queue.sqlite import SqliteQueue
from helpers.notices import Inbox
from helpers.waiting import wait_for

from .test_runner import run_in_thread, script

# The session's side of the progress contract: a step per 50 ms, until the test opens the gate.
PROGRESSING = """
    import os, sys, time
    from gpucloud import control
    ctl = os.environ["GPUCLOUD_CONTROL_DIR"]
    gate = sys.argv[1]
    control.write(ctl, control.RESUMED, {"step": 0})
    step = 0
    while not os.path.exists(gate):
        time.sleep(0.05)
        step += 1
        control.write(ctl, control.PROGRESS, {"step": step})
    control.write(ctl, control.FINISHED, {"step": step})
"""


@pytest.fixture
def q(tmp_path):
    queue = SqliteQueue(tmp_path / "q.db")
    yield queue
    queue.close()


def test_a_running_attempt_puts_its_step_and_rate_on_the_job_and_its_end_leaves_the_last_step(q, tmp_path):
    gate = tmp_path / "gate"
    job = q.submit(JobSpec(command=[*script(tmp_path, "train.py", PROGRESSING), str(gate)]))
    thread, result = run_in_thread(q, job.id, Inbox())
    try:
        live = wait_for(lambda: (found := q.get(job.id)).step_rate and found, what="a step rate on the running job")
    finally:
        gate.touch()
    assert live.state is JobState.RUNNING and live.last_step >= 1 and live.step_rate > 0
    # `job show`: the running attempt's row carries the job's live step and rate.
    [row] = build_timeline(live, q.attempts(job.id), q.events(job.id)).attempts
    assert (row.state, row.last_step, row.step_rate) == ("running", live.last_step, live.step_rate)
    thread.join(timeout=60)
    assert result["r"].exit_code == 0
    done = q.get(job.id)
    [attempt] = q.attempts(job.id)
    assert done.state is JobState.FINISHED and done.step_rate is None
    assert done.last_step == attempt.last_step and done.last_step >= live.last_step
