"""The cancel contract (``JobQueue.cancel``) on every backend: a queued job never
runs; a running one gets a stop request and, however its attempt then ends, ends CANCELLED with no
attempt k+1; its lease and slots are released."""

from __future__ import annotations

import time

import pytest

from gpucloud.lifecycle.model import CANCEL_GRACE_S, AttemptEnd, AttemptState, JobSpec, JobState, SlotClaim
from gpucloud.queue import gang
from gpucloud.queue.protocol import NotCancellable, UnknownJob
from gpucloud.signals.events import Notice

ONE = JobSpec(command=["python", "train.py"])
GANG = JobSpec(command=["python", "train.py"], nodes=2)


def kinds(jq, job_id: str) -> list[str]:
    return [e.kind for e in jq.events(job_id)]


def test_a_queued_job_is_cancelled_at_once_and_never_runs(jq):
    job = jq.submit(ONE)
    after = jq.cancel(job.id)
    assert after.state is JobState.CANCELLED and after.state.terminal
    assert "never ran" in (after.reason or "")
    [attempt] = jq.attempts(job.id)
    assert attempt.state is AttemptState.CANCELLED
    assert jq.claim("w", lease_seconds=60) is None
    assert jq.claim("w", lease_seconds=60, job_id=job.id) is None
    assert kinds(jq, job.id)[-2:] == ["cancel", "cancelled"]
    assert [j.id for j in jq.list_jobs([JobState.CANCELLED])] == [job.id]


def test_a_queued_gang_releases_its_slots(jq):
    job = jq.submit(GANG)
    now = time.time()
    held = SlotClaim(job_id=job.id, attempt=1, slot=0, worker="a", address="10.0.0.1", lease_until=now + 60)
    assert jq.take_slot(held, now=now)
    jq.cancel(job.id)
    other = SlotClaim(job_id=job.id, attempt=1, slot=1, worker="b", address="10.0.0.2", lease_until=now + 60)
    assert not jq.take_slot(other, now=now)  # no slot of a cancelled job can be taken
    assert gang.start_gang(jq, held, lease_seconds=60) is None  # nor can its gang start
    assert all(o.job_id != job.id for o in jq.slot_offers(hide_seconds=1))


def test_a_running_job_gets_a_stop_request_and_ends_cancelled_not_requeued(jq):
    job = jq.submit(ONE)
    jq.claim("w", lease_seconds=60, job_id=job.id)
    asked_at = time.time()
    after = jq.cancel(job.id, grace_seconds=30)
    assert after.state is JobState.RUNNING and after.cancel_requested_at is not None
    notice = jq.stop_request(job.id, 1)
    assert notice is not None and notice.is_stop and notice.source == "cancel"
    assert asked_at + 30 <= (notice.deadline or 0) <= time.time() + 30
    # The ranks saved step 7 and the supervisor ended the attempt as for any notice: REQUEUED.
    end = AttemptEnd(state=AttemptState.REQUEUED, exit_code=75, last_step=7, committed_step=7, reason="checkpointed")
    transition = jq.end_attempt(job.id, 1, end)
    assert transition.applied
    ended = jq.get(job.id)
    assert ended.state is JobState.CANCELLED
    assert (ended.worker, ended.lease_until, ended.attempt) == (None, None, 1)
    [attempt] = jq.attempts(job.id)  # no attempt 2
    assert (attempt.state, attempt.committed_step) == (AttemptState.CANCELLED, 7)
    assert jq.claim("w2", lease_seconds=60) is None
    assert "requeue" not in kinds(jq, job.id) and kinds(jq, job.id)[-1] == "cancelled"
    assert jq.heartbeat(job.id, 1, "w", lease_seconds=60) is False  # the lease is gone


@pytest.mark.parametrize("state", [AttemptState.CRASHED, AttemptState.FAILED, AttemptState.LOST])
def test_any_other_end_of_a_cancelled_attempt_is_cancelled_too(jq, state):
    job = jq.submit(ONE)
    jq.claim("w", lease_seconds=60, job_id=job.id)
    jq.cancel(job.id)
    jq.end_attempt(job.id, 1, AttemptEnd(state=state, exit_code=1, reason="gone"))
    assert jq.get(job.id).state is JobState.CANCELLED
    assert [a.number for a in jq.attempts(job.id)] == [1]


def test_a_cancelled_attempt_that_finished_first_stays_finished(jq):
    job = jq.submit(ONE)
    jq.claim("w", lease_seconds=60, job_id=job.id)
    jq.cancel(job.id)
    jq.end_attempt(job.id, 1, AttemptEnd(state=AttemptState.FINISHED, exit_code=0, last_step=9))
    assert jq.get(job.id).state is JobState.FINISHED


def test_a_gang_that_loses_a_member_after_a_cancel_is_not_failed_over(jq):
    job = jq.submit(GANG)
    jq.claim(gang.gang_worker(job.id, 1), lease_seconds=60, job_id=job.id)
    jq.cancel(job.id)
    transition = gang.fail_over(jq, jq.get(job.id), now=time.time())  # no live slot claims: members lost
    assert transition is not None and transition.job.state is JobState.CANCELLED
    assert [a.number for a in jq.attempts(job.id)] == [1]


def test_a_dead_holder_of_a_cancelled_job_is_not_replaced(jq, clock):
    job = jq.submit(ONE)
    assert jq.claim("w", lease_seconds=1, job_id=job.id) is not None
    jq.cancel(job.id)
    clock.advance(2)  # the lease runs out
    assert jq.claim("w2", lease_seconds=60, job_id=job.id) is None
    assert jq.claim("w2", lease_seconds=60) is None
    assert jq.get(job.id).state is JobState.CANCELLED
    assert [a.number for a in jq.attempts(job.id)] == [1]


def test_a_spot_stop_requested_first_stands_and_the_job_still_ends_cancelled(jq):
    job = jq.submit(ONE)
    jq.claim("w", lease_seconds=60, job_id=job.id)
    spot = Notice(
        kind="spot-interruption", source="imds", deadline=time.time() + 120, received_at=time.time(), event_id="s1"
    )
    assert jq.request_stop(job.id, 1, spot)
    jq.cancel(job.id)
    assert jq.stop_request(job.id, 1).event_id == "s1"
    jq.end_attempt(job.id, 1, AttemptEnd(state=AttemptState.REQUEUED, committed_step=3))
    assert jq.get(job.id).state is JobState.CANCELLED


def test_cancel_is_idempotent_and_refused_for_an_ended_job(jq):
    running = jq.submit(ONE)
    jq.claim("w", lease_seconds=60, job_id=running.id)
    first = jq.cancel(running.id)
    assert jq.cancel(running.id).cancel_requested_at == first.cancel_requested_at
    assert kinds(jq, running.id).count("cancel") == 1
    queued = jq.submit(ONE)
    jq.cancel(queued.id)
    assert jq.cancel(queued.id).state is JobState.CANCELLED
    done = jq.submit(ONE)
    jq.claim("w", lease_seconds=60, job_id=done.id)
    jq.end_attempt(done.id, 1, AttemptEnd(state=AttemptState.FINISHED, exit_code=0))
    with pytest.raises(NotCancellable, match=r"already finished; there is nothing to cancel$"):
        jq.cancel(done.id)
    with pytest.raises(UnknownJob):
        jq.cancel("no-such-job")


def test_the_default_grace_is_the_documented_one(jq):
    job = jq.submit(ONE)
    jq.claim("w", lease_seconds=60, job_id=job.id)
    before = time.time()
    jq.cancel(job.id)
    assert jq.stop_request(job.id, 1).deadline >= before + CANCEL_GRACE_S
