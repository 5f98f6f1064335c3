"""The resume contract (``JobQueue.resume``) on every backend: a failed or cancelled
job gets attempt k+1 under its id, claimable like any queued attempt; queued, running and finished
jobs are refused in one line; racing resumes queue exactly one attempt."""

from __future__ import annotations

import threading

import pytest

from gpucloud.lifecycle.model import AttemptEnd, AttemptState, JobSpec, JobState
from gpucloud.queue.protocol import NotResumable, UnknownJob

ONE = JobSpec(command=["python", "train.py"], max_attempts=1)


def failed(jq):
    job = jq.submit(ONE)
    jq.claim("w", lease_seconds=60, job_id=job.id)
    jq.end_attempt(job.id, 1, AttemptEnd(state=AttemptState.CRASHED, exit_code=1, last_step=4, reason="boom"))
    assert jq.get(job.id).state is JobState.FAILED
    return job


def test_a_failed_job_gets_a_new_attempt_under_its_id(jq):
    job = failed(jq)
    after = jq.resume(job.id, from_step=4)
    assert (after.id, after.state, after.attempt, after.crashes) == (job.id, JobState.QUEUED, 2, 0)
    assert (after.reason, after.exit_code, after.worker) == (None, None, None)
    assert [a.state for a in jq.attempts(job.id)] == [AttemptState.FAILED, AttemptState.QUEUED]
    [event] = [e for e in jq.events(job.id) if e.kind == "resubmit"]
    assert event.data == {"was": "failed", "next_attempt": 2, "from_step": 4}
    claimed = jq.claim("w2", lease_seconds=60)  # found like any queued attempt (on SQS: its message)
    assert claimed is not None and (claimed.id, claimed.attempt) == (job.id, 2)
    # a fresh crash budget: this crash (1 of max_attempts=1) fails it again, not before
    jq.end_attempt(job.id, 2, AttemptEnd(state=AttemptState.CRASHED, exit_code=1, reason="again"))
    assert jq.get(job.id).state is JobState.FAILED


def test_a_job_cancelled_while_running_resumes_and_is_requeued_normally_after(jq):
    job = jq.submit(JobSpec(command=["python", "train.py"]))
    jq.claim("w", lease_seconds=60, job_id=job.id)
    jq.cancel(job.id)
    jq.end_attempt(job.id, 1, AttemptEnd(state=AttemptState.REQUEUED, committed_step=6))
    after = jq.resume(job.id, from_step=6)
    assert after.state is JobState.QUEUED and after.cancel_requested_at is None
    jq.claim("w", lease_seconds=60, job_id=job.id)
    assert jq.stop_request(job.id, 2) is None  # the cancel was attempt 1's
    jq.end_attempt(job.id, 2, AttemptEnd(state=AttemptState.REQUEUED, committed_step=9))  # a spot notice
    assert (jq.get(job.id).state, jq.get(job.id).attempt) == (JobState.QUEUED, 3)


def test_a_job_cancelled_while_queued_resumes(jq):
    job = jq.submit(ONE)
    jq.cancel(job.id)
    assert jq.resume(job.id).attempt == 2
    assert [a.state for a in jq.attempts(job.id)] == [AttemptState.CANCELLED, AttemptState.QUEUED]


def test_queued_running_cancelling_and_finished_jobs_are_refused_in_one_line(jq):
    queued = jq.submit(ONE)
    with pytest.raises(NotResumable, match=r"is queued \(attempt 1\); resume takes failed or cancelled jobs"):
        jq.resume(queued.id)
    jq.claim("w", lease_seconds=60, job_id=queued.id)
    with pytest.raises(NotResumable, match=r"is running \(attempt 1\).*`gpucloud job cancel"):
        jq.resume(queued.id)
    jq.cancel(queued.id)
    with pytest.raises(NotResumable, match=r"is cancelling \(attempt 1\)"):
        jq.resume(queued.id)
    jq.end_attempt(queued.id, 1, AttemptEnd(state=AttemptState.FINISHED, exit_code=0))
    with pytest.raises(NotResumable, match=r"finished; there is nothing to resume .*submit a new job"):
        jq.resume(queued.id)
    with pytest.raises(UnknownJob):
        jq.resume("no-such-job")


def test_racing_resumes_queue_exactly_one_attempt(open_backend):
    first = open_backend()
    job = failed(first)
    clients = [open_backend() for _ in range(4)]
    outcomes: list[str] = []

    def resume(client) -> None:
        try:
            client.resume(job.id)
            outcomes.append("resumed")
        except NotResumable:
            outcomes.append("refused")

    threads = [threading.Thread(target=resume, args=(c,)) for c in clients]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert sorted(outcomes) == ["refused"] * 3 + ["resumed"]
    assert [a.number for a in first.attempts(job.id)] == [1, 2]
