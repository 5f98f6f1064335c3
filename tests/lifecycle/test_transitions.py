"""The job state machine alone: (job as read, request, now) -> the change to store, or a refusal.

No store is involved: these rows say what every backend must write, and the contract suite
(``tests/jobqueue``) checks that both backends write it atomically.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from gpucloud.lifecycle import transitions as t
from gpucloud.lifecycle.model import (
    MAX_ATTEMPT,
    AttemptEnd,
    AttemptState,
    Job,
    JobSpec,
    JobState,
    Progress,
    StopRequest,
)
from gpucloud.lifecycle.transitions import AttemptChange, Change, Guard, NewAttempt, NewEvent, Outcome, Refusal
from gpucloud.signals.events import Notice

NOW = 1000.0
SPEC = JobSpec(command=["python", "train.py"], max_attempts=3)


def job(state: JobState = JobState.RUNNING, **fields: Any) -> Job:
    base: dict[str, Any] = {"id": "j", "spec": SPEC, "state": state, "attempt": 2, "created_at": 1.0, "updated_at": 1.0}
    if state is JobState.RUNNING:
        base.update(worker="w", lease_until=NOW + 30)
    return Job(**{**base, **fields})


QUEUED = job(JobState.QUEUED)
RUNNING = job()
EXPIRED = job(lease_until=NOW - 1)
CANCELLING = job(cancel_requested_at=NOW - 5)
CANCELLING_EXPIRED = job(cancel_requested_at=NOW - 5, lease_until=NOW - 1)
ONE_CRASH_LEFT = job(crashes=2)


def end(state: AttemptState, **fields: Any) -> AttemptEnd:
    return AttemptEnd(state=state, **fields)


def released(**fields: Any) -> dict[str, Any]:
    return {"worker": None, "lease_until": None, "step_rate": None, "updated_at": NOW, **fields}


def ended(state: AttemptState, **fields: Any) -> AttemptChange:
    base = {"state": state, "ended_at": NOW, "exit_code": None, "committed_step": None, "reason": None}
    return AttemptChange(2, AttemptState.RUNNING, {**base, **fields})


# --------------------------------------------------------------------------------------- ending

END_ROWS = [
    pytest.param(
        RUNNING,
        end(AttemptState.REQUEUED, committed_step=40, last_step=41, resume_from=40, reason="spot"),
        Change(
            Outcome.REQUEUED,
            Guard(JobState.RUNNING, 2),
            job={"state": JobState.QUEUED, "attempt": 3, "crashes": 0, **released(last_step=41)},
            attempt=ended(AttemptState.REQUEUED, committed_step=40, last_step=41, reason="spot"),
            new_attempt=NewAttempt(3, AttemptState.QUEUED, NOW),
            events=(NewEvent(2, "requeue", NOW, {"next_attempt": 3, "reason": "spot", "from_step": 40}),),
        ),
        id="a requeue queues exactly attempt k+1",
    ),
    pytest.param(
        RUNNING,
        end(AttemptState.CRASHED, exit_code=1, reason="exit 1"),
        Change(
            Outcome.REQUEUED,
            Guard(JobState.RUNNING, 2),
            job={"state": JobState.QUEUED, "attempt": 3, "crashes": 1, **released()},
            attempt=ended(AttemptState.CRASHED, exit_code=1, reason="exit 1"),
            new_attempt=NewAttempt(3, AttemptState.QUEUED, NOW),
            events=(NewEvent(2, "requeue", NOW, {"next_attempt": 3, "reason": "exit 1", "from_step": None}),),
        ),
        id="a crash with attempts left is retried and counted",
    ),
    pytest.param(
        ONE_CRASH_LEFT,
        end(AttemptState.CRASHED, exit_code=1, reason="exit 1"),
        Change(
            Outcome.FAILED,
            Guard(JobState.RUNNING, 2),
            job={
                "state": JobState.FAILED,
                "crashes": 3,
                "reason": "exit 1 (attempt 2; 3 of 3 allowed attempts crashed)",
                "exit_code": 1,
                **released(),
            },
            attempt=ended(AttemptState.FAILED, exit_code=1, reason="exit 1"),
            events=(
                NewEvent(
                    2, "failed", NOW, {"reason": "exit 1 (attempt 2; 3 of 3 allowed attempts crashed)", "exit_code": 1}
                ),
            ),
        ),
        id="the last allowed crash fails the job and its attempt",
    ),
    pytest.param(
        ONE_CRASH_LEFT,
        end(AttemptState.REQUEUED, reason="spot"),
        Change(
            Outcome.REQUEUED,
            Guard(JobState.RUNNING, 2),
            job={"state": JobState.QUEUED, "attempt": 3, "crashes": 2, **released()},
            attempt=ended(AttemptState.REQUEUED, reason="spot"),
            new_attempt=NewAttempt(3, AttemptState.QUEUED, NOW),
            events=(NewEvent(2, "requeue", NOW, {"next_attempt": 3, "reason": "spot", "from_step": None}),),
        ),
        id="a notice never uses up an attempt",
    ),
    pytest.param(
        RUNNING,
        end(AttemptState.FINISHED, exit_code=0, last_step=100, resumed_step=40),
        Change(
            Outcome.FINISHED,
            Guard(JobState.RUNNING, 2),
            job={"state": JobState.FINISHED, "exit_code": 0, **released(last_step=100)},
            attempt=ended(AttemptState.FINISHED, exit_code=0, last_step=100, resumed_step=40),
            events=(NewEvent(2, "finish", NOW, {"step": 100}),),
        ),
        id="a finish ends the job",
    ),
    pytest.param(
        RUNNING,
        end(AttemptState.FAILED, exit_code=2),
        Change(
            Outcome.FAILED,
            Guard(JobState.RUNNING, 2),
            job={"state": JobState.FAILED, "crashes": 0, "reason": "failed", "exit_code": 2, **released()},
            attempt=ended(AttemptState.FAILED, exit_code=2),
            events=(NewEvent(2, "failed", NOW, {"reason": "failed", "exit_code": 2}),),
        ),
        id="a failure without a reason still says one",
    ),
    pytest.param(
        CANCELLING,
        end(AttemptState.REQUEUED, committed_step=9, last_step=9),
        Change(
            Outcome.CANCELLED,
            Guard(JobState.RUNNING, 2),
            job={
                "state": JobState.CANCELLED,
                "reason": "cancelled while running attempt 2",
                "exit_code": None,
                **released(last_step=9),
            },
            attempt=ended(
                AttemptState.CANCELLED, committed_step=9, last_step=9, reason="cancelled while running attempt 2"
            ),
            events=(NewEvent(2, "cancelled", NOW, {"step": 9, "reason": "cancelled while running attempt 2"}),),
            releases_slots=True,
        ),
        id="a requeue of a cancelled job ends it cancelled, with no attempt k+1",
    ),
    pytest.param(
        CANCELLING,
        end(AttemptState.FINISHED, exit_code=0),
        Change(
            Outcome.FINISHED,
            Guard(JobState.RUNNING, 2),
            job={"state": JobState.FINISHED, "exit_code": 0, **released()},
            attempt=ended(AttemptState.FINISHED, exit_code=0),
            events=(NewEvent(2, "finish", NOW, {"step": None}),),
        ),
        id="a command that finished before the cancel's stop did finish",
    ),
    pytest.param(
        job(JobState.CANCELLED, worker=None, lease_until=None),
        end(AttemptState.FINISHED),
        Refusal("attempt 2 of job j is not running (the job is cancelled at attempt 2)"),
        id="a finish on a cancelled job is refused",
    ),
    pytest.param(
        job(attempt=3),
        end(AttemptState.REQUEUED),
        Refusal("attempt 2 of job j is not running (the job is running at attempt 3)"),
        id="a stale attempt (taken over) is refused",
    ),
    pytest.param(
        job(JobState.QUEUED, attempt=3),
        end(AttemptState.REQUEUED),
        Refusal("attempt 2 of job j is not running (the job is queued at attempt 3)"),
        id="a duplicate requeue is refused, never attempt k+2",
    ),
]


@pytest.mark.parametrize(("read", "request_", "expected"), END_ROWS)
def test_ending_an_attempt(read: Job, request_: AttemptEnd, expected: Change | Refusal) -> None:
    assert t.end(read, 2, request_, NOW) == expected


# ------------------------------------------------------------------------------------- claiming

HOLDER = {"worker": "w2", "lease_until": NOW + 60, "updated_at": NOW, "step_rate": None}

CLAIM_ROWS = [
    pytest.param(
        QUEUED,
        None,
        Change(
            Outcome.CLAIMED,
            Guard(JobState.QUEUED, 2),
            job={"state": JobState.RUNNING, **HOLDER},
            attempt=AttemptChange(2, AttemptState.QUEUED, {"state": AttemptState.RUNNING, "worker": "w2", "node": "n"}),
            events=(NewEvent(2, "claimed", NOW, {"worker": "w2", "node": "n"}),),
        ),
        id="a queued attempt goes to the claimer",
    ),
    pytest.param(
        EXPIRED,
        None,
        Change(
            Outcome.TAKEN_OVER,
            Guard(JobState.RUNNING, 2, lease_expired_at=NOW),
            job={"attempt": 3, **HOLDER},
            attempt=AttemptChange(
                2,
                AttemptState.RUNNING,
                {"state": AttemptState.LOST, "ended_at": NOW, "reason": "lease of worker w expired"},
            ),
            new_attempt=NewAttempt(3, AttemptState.RUNNING, NOW, worker="w2", node="n"),
            events=(
                NewEvent(2, "lease-expired", NOW, {"worker": "w"}),
                NewEvent(3, "claimed", NOW, {"worker": "w2", "node": "n"}),
            ),
        ),
        id="an expired lease: attempt k lost, the claimer runs exactly k+1",
    ),
    pytest.param(RUNNING, None, Refusal("job j is running and its lease is live"), id="a live lease is kept"),
    pytest.param(
        job(lease_until=NOW),
        None,
        Refusal("job j is running and its lease is live"),
        id="a lease ending exactly now is still live",
    ),
    pytest.param(
        CANCELLING_EXPIRED,
        None,
        Change(
            Outcome.LOST_CANCELLED,
            Guard(JobState.RUNNING, 2, lease_expired_at=NOW),
            job={
                "state": JobState.CANCELLED,
                "reason": "cancelled while running attempt 2",
                "exit_code": None,
                **released(),
            },
            attempt=AttemptChange(
                2,
                AttemptState.RUNNING,
                {
                    "state": AttemptState.CANCELLED,
                    "ended_at": NOW,
                    "reason": "lease of worker w expired after the cancel",
                },
            ),
            events=(
                NewEvent(2, "lease-expired", NOW, {"worker": "w"}),
                NewEvent(2, "cancelled", NOW, {"step": None, "reason": "cancelled while running attempt 2"}),
            ),
            releases_slots=True,
        ),
        id="a cancelled job whose holder died ends cancelled, nobody runs it",
    ),
    pytest.param(
        job(JobState.FINISHED, worker=None, lease_until=None),
        None,
        Refusal("job j is finished"),
        id="a finished job is not claimable",
    ),
    pytest.param(job(JobState.QUEUED, attempt=3), 2, Refusal("job j is queued at attempt 3, not queued at attempt 2")),
    pytest.param(
        EXPIRED, 2, Refusal("job j is running at attempt 2, not queued at attempt 2"), id="a pin never takes over"
    ),
]


@pytest.mark.parametrize(("read", "pinned", "expected"), CLAIM_ROWS)
def test_claiming(read: Job, pinned: int | None, expected: Change | Refusal) -> None:
    assert t.claim(read, "w2", lease_seconds=60, node="n", now=NOW, attempt=pinned) == expected


def test_only_claims_and_takeovers_hand_the_job_over() -> None:
    assert {o for o in Outcome if o.claims} == {Outcome.CLAIMED, Outcome.TAKEN_OVER}


# ------------------------------------------------------------------------- renewing, stopping


def test_a_renewal_is_guarded_by_the_holder_and_carries_the_progress() -> None:
    change = t.heartbeat(2, "w", lease_seconds=60, now=NOW, progress=Progress(7, 1.5, NOW - 1))
    assert change == Change(
        Outcome.RENEWED,
        Guard(JobState.RUNNING, 2, worker="w"),
        job={"lease_until": NOW + 60, "updated_at": NOW, "last_step": 7, "step_rate": 1.5, "progress_at": NOW - 1},
    )
    assert t.heartbeat(2, "w", lease_seconds=60, now=NOW).job == {"lease_until": NOW + 60, "updated_at": NOW}


def test_a_stop_request_is_guarded_by_the_running_attempt() -> None:
    notice = Notice(kind="spot-interruption", source="imds", deadline=NOW + 120, received_at=NOW, event_id="e1")
    change = t.request_stop(2, notice, now=NOW)
    assert change.guard == Guard(JobState.RUNNING, 2) and change.job == {} and change.events == ()
    assert change.stop is not None and change.stop.request == StopRequest.of(notice, requested_at=NOW)
    assert change.stop.event == NewEvent(2, "stop-request", NOW, change.stop.request.timeline_data())


# ----------------------------------------------------------------------------- cancel and resume

ASKED_QUEUED = NewEvent(2, "cancel", NOW, {"state": "queued", "grace_s": 30.0})
ASKED_RUNNING = NewEvent(2, "cancel", NOW, {"state": "running", "grace_s": 30.0})

CANCEL_ROWS = [
    pytest.param(
        QUEUED,
        Change(
            Outcome.CANCELLED,
            Guard(JobState.QUEUED, 2),
            job={
                "state": JobState.CANCELLED,
                "reason": "cancelled while queued (attempt 2 never ran)",
                "exit_code": None,
                **released(),
            },
            attempt=AttemptChange(
                2,
                AttemptState.QUEUED,
                {
                    "state": AttemptState.CANCELLED,
                    "ended_at": NOW,
                    "reason": "cancelled while queued (attempt 2 never ran)",
                },
            ),
            events=(
                ASKED_QUEUED,
                NewEvent(2, "cancelled", NOW, {"step": None, "reason": "cancelled while queued (attempt 2 never ran)"}),
            ),
            releases_slots=True,
        ),
        id="a queued job ends at once",
    ),
    pytest.param(
        CANCELLING,
        Refusal("job j is already cancelling"),
        id="a repeated cancel changes nothing",
    ),
    pytest.param(
        job(JobState.CANCELLED, worker=None, lease_until=None),
        Refusal("job j is already cancelled"),
        id="a cancelled job stays so",
    ),
    pytest.param(
        job(JobState.FINISHED, worker=None, lease_until=None),
        Refusal("job j is already finished; there is nothing to cancel", error=True),
        id="a finished job cannot be cancelled",
    ),
    pytest.param(
        job(JobState.FAILED, worker=None, lease_until=None),
        Refusal("job j is already failed; there is nothing to cancel", error=True),
        id="a failed job cannot be cancelled",
    ),
]


@pytest.mark.parametrize(("read", "expected"), CANCEL_ROWS)
def test_cancelling(read: Job, expected: Change | Refusal) -> None:
    assert t.cancel(read, grace_seconds=30.0, now=NOW) == expected


def test_a_running_cancel_flags_the_job_and_asks_the_ranks_to_save() -> None:
    change = t.cancel(RUNNING, grace_seconds=30.0, now=NOW)
    assert isinstance(change, Change) and change.outcome is Outcome.CANCEL_REQUESTED
    assert change.guard == Guard(JobState.RUNNING, 2)
    assert change.job == {"cancel_requested_at": NOW, "updated_at": NOW}
    assert change.events == (ASKED_RUNNING,) and change.attempt is None and change.new_attempt is None
    assert change.stop is not None and change.stop.attempt == 2
    assert change.stop.request.deadline == NOW + 30.0 and change.stop.request.source == "cancel"


def test_a_cancel_of_a_job_nobody_holds_ends_it_at_once() -> None:
    change = t.cancel(EXPIRED, grace_seconds=30.0, now=NOW)
    assert isinstance(change, Change) and change.outcome is Outcome.LOST_CANCELLED
    assert change.events[0] == ASKED_RUNNING and [e.kind for e in change.events[1:]] == ["lease-expired", "cancelled"]
    assert change.new_attempt is None and change.job["state"] is JobState.CANCELLED


@pytest.mark.parametrize("was", [JobState.FAILED, JobState.CANCELLED])
def test_a_resume_queues_attempt_k_plus_1_with_a_fresh_crash_count(was: JobState) -> None:
    read = job(was, worker=None, lease_until=None, crashes=3, reason="why", exit_code=1, cancel_requested_at=NOW - 9)
    change = t.resume(read, from_step=40, now=NOW)
    assert change == Change(
        Outcome.RESUMED,
        Guard(was, 2),
        job={
            "state": JobState.QUEUED,
            "attempt": 3,
            "crashes": 0,
            "reason": None,
            "exit_code": None,
            "cancel_requested_at": None,
            "worker": None,
            "lease_until": None,
            "updated_at": NOW,
        },
        new_attempt=NewAttempt(3, AttemptState.QUEUED, NOW),
        events=(NewEvent(2, "resubmit", NOW, {"was": was.value, "next_attempt": 3, "from_step": 40}),),
    )


@pytest.mark.parametrize(
    ("read", "says"),
    [
        (QUEUED, "job j is queued (attempt 2)"),
        (RUNNING, "job j is running (attempt 2)"),
        (CANCELLING, "job j is cancelling (attempt 2)"),
        (job(JobState.FINISHED, worker=None, lease_until=None), "job j finished; there is nothing to resume"),
        (job(JobState.FAILED, attempt=MAX_ATTEMPT), "the most a job can have"),
    ],
)
def test_a_resume_of_a_job_that_is_not_over_or_finished_is_a_user_error(read: Job, says: str) -> None:
    refusal = t.resume(read, from_step=None, now=NOW)
    assert isinstance(refusal, Refusal) and refusal.error and says in refusal.reason


# ----------------------------------------------------------------------------------- properties


def test_no_change_ever_creates_an_attempt_past_k_plus_1() -> None:
    reads = [QUEUED, RUNNING, EXPIRED, CANCELLING, CANCELLING_EXPIRED, ONE_CRASH_LEFT]
    reads += [job(s, worker=None, lease_until=None) for s in (JobState.FINISHED, JobState.FAILED, JobState.CANCELLED)]
    ends = [end(s) for s in AttemptState if s not in (AttemptState.QUEUED, AttemptState.RUNNING)]
    for read in reads:
        changes = [t.end(read, read.attempt, e, NOW) for e in ends]
        changes += [t.claim(read, "x", lease_seconds=1, node=None, now=NOW), t.resume(read, from_step=None, now=NOW)]
        changes.append(t.cancel(read, grace_seconds=1, now=NOW))
        for change in changes:
            if isinstance(change, Change) and change.new_attempt is not None:
                assert change.new_attempt.number == read.attempt + 1 == change.job["attempt"]
                assert change.guard.attempt == read.attempt  # stored only if nobody moved the job on


def test_a_change_never_leaves_a_terminal_job_holding_a_lease() -> None:
    for read in (RUNNING, CANCELLING, ONE_CRASH_LEFT):
        for state in (AttemptState.FINISHED, AttemptState.FAILED, AttemptState.CRASHED, AttemptState.REQUEUED):
            change = t.end(read, 2, end(state), NOW)
            assert isinstance(change, Change)
            assert (change.job["worker"], change.job["lease_until"]) == (None, None)


def test_an_unknown_event_kind_cannot_be_built() -> None:
    with pytest.raises(ValueError, match="unknown timeline event 'exploded'"):
        NewEvent(1, "exploded", NOW, {})


def test_a_new_job_is_queued_at_attempt_1() -> None:
    new, change = t.submit("j", SPEC, NOW)
    assert (new.state, new.attempt, new.created_at, new.updated_at) == (JobState.QUEUED, 1, NOW, NOW)
    assert change.new_attempt == NewAttempt(1, AttemptState.QUEUED, NOW)
    assert change.events == (NewEvent(1, "submitted", NOW, {"command": ["python", "train.py"]}),)


def test_changes_are_values() -> None:
    change = t.heartbeat(1, "w", lease_seconds=1, now=NOW)
    with pytest.raises(dataclasses.FrozenInstanceError):
        change.outcome = Outcome.FAILED  # type: ignore[misc]
