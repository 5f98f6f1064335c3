"""Live progress on every backend: the lease renewal carries the running attempt's
step and rate onto the job (no write of its own); its end keeps the last step and drops the rate."""

from __future__ import annotations

import time

from gpucloud.lifecycle.model import AttemptEnd, AttemptState, JobSpec, JobState, Progress

ONE = JobSpec(command=["python", "train.py"])


def test_a_renewal_with_progress_puts_the_step_and_rate_on_the_job(jq):
    job = jq.submit(ONE)
    jq.claim("w", lease_seconds=60, job_id=job.id)
    assert (jq.get(job.id).last_step, jq.get(job.id).step_rate) == (None, None)
    written = time.time()
    assert jq.heartbeat(job.id, 1, "w", lease_seconds=60, progress=Progress(120, 2.5, written))
    seen = jq.get(job.id)
    assert (seen.last_step, seen.step_rate, seen.progress_at) == (120, 2.5, written)
    [listed] = jq.list_jobs([JobState.RUNNING])  # `gpucloud jobs` reads the same record
    assert (listed.last_step, listed.step_rate) == (120, 2.5)
    # A renewal before the rate is known stores the step alone; one without progress keeps it.
    assert jq.heartbeat(job.id, 1, "w", lease_seconds=60, progress=Progress(130, None, written + 1))
    assert (jq.get(job.id).last_step, jq.get(job.id).step_rate) == (130, None)
    assert jq.heartbeat(job.id, 1, "w", lease_seconds=60)
    assert jq.get(job.id).last_step == 130


def test_only_the_holder_reports_progress(jq):
    job = jq.submit(ONE)
    jq.claim("w", lease_seconds=60, job_id=job.id)
    assert not jq.heartbeat(job.id, 1, "intruder", lease_seconds=60, progress=Progress(999, 9.0, time.time()))
    assert not jq.heartbeat(job.id, 2, "w", lease_seconds=60, progress=Progress(999, 9.0, time.time()))
    assert jq.get(job.id).last_step is None


def test_the_end_keeps_the_last_step_and_drops_the_rate_until_the_next_attempt_reports(jq):
    job = jq.submit(ONE)
    jq.claim("w", lease_seconds=60, job_id=job.id)
    jq.heartbeat(job.id, 1, "w", lease_seconds=60, progress=Progress(40, 4.0, time.time()))
    end = AttemptEnd(state=AttemptState.REQUEUED, exit_code=75, last_step=42, committed_step=42)
    assert jq.end_attempt(job.id, 1, end).applied
    queued = jq.get(job.id)
    assert (queued.state, queued.last_step, queued.step_rate) == (JobState.QUEUED, 42, None)
    running = jq.claim("w2", lease_seconds=60, job_id=job.id)
    assert running is not None and (running.attempt, running.last_step, running.step_rate) == (2, 42, None)
    jq.heartbeat(job.id, 2, "w2", lease_seconds=60, progress=Progress(45, 1.5, time.time()))
    finished = AttemptEnd(state=AttemptState.FINISHED, exit_code=0, last_step=50)
    jq.end_attempt(job.id, 2, finished)
    done = jq.get(job.id)
    assert (done.state, done.last_step, done.step_rate) == (JobState.FINISHED, 50, None)


def test_a_cancelled_attempt_leaves_its_last_step(jq):
    job = jq.submit(ONE)
    jq.claim("w", lease_seconds=60, job_id=job.id)
    jq.heartbeat(job.id, 1, "w", lease_seconds=60, progress=Progress(7, 1.0, time.time()))
    jq.cancel(job.id)
    jq.end_attempt(job.id, 1, AttemptEnd(state=AttemptState.REQUEUED, last_step=9, committed_step=9))
    after = jq.get(job.id)
    assert (after.state, after.last_step, after.step_rate) == (JobState.CANCELLED, 9, None)


def test_a_rate_outlived_by_a_dead_holder_is_never_shown(jq, clock):
    job = jq.submit(ONE)
    jq.claim("dead", lease_seconds=60, job_id=job.id)
    # its last renewal: a short lease, which then runs out (the holder died)
    assert jq.heartbeat(job.id, 1, "dead", lease_seconds=0.1, progress=Progress(5, 3.0, time.time()))
    clock.advance(1)  # the lease runs out
    after = jq.cancel(job.id)  # nobody holds it: cancelled at once, whatever rate is stored stays
    assert after.state is JobState.CANCELLED
    for seen in (after, jq.get(job.id), *jq.list_jobs()):
        assert (seen.last_step, seen.step_rate) == (5, None)
