"""Randomized trials of the fleet protocol on the embedded queue: agents killed with SIGKILL (real
processes), duplicate and stale deliveries, slot leases running out, notices while a gang forms and
while it runs. Over 200 seeded trials: no job is lost, no attempt runs twice at once, attempt
numbers rise by one per requeue, every noticed attempt is requeued exactly once, and every job ends
FINISHED or FAILED with a reason. The seeds are fixed, so a failure names a seed that replays it."""

from __future__ import annotations

import collections
import time
from pathlib import Path

import pytest

from gpucloud.lifecycle.model import AttemptEnd, AttemptState, JobSpec, JobState
from gpucloud.queue import gang
from gpucloud.queue.sqlite import SqliteQueue
from jobqueue.aws_fixtures import aws_job_plane  # noqa: F401  (fixture: the job plane on the session moto server)

from .trials import KILL_POINTS, Trial

TRIALS = 200
KILL_EVERY = 4  # one real agent process killed with -9 in every 4th trial
AWS_TRIALS = 8  # each round is a few dozen HTTP calls to moto (~3 s a trial): fewer trials, same schedule
FAULT_KINDS = (
    "notice-while-forming",
    "notice-while-running",
    "lease-expired",
    "crash",
    "duplicate-delivery",
    "stale-delivery",
)


def run_trials(seeds: range, trial_for) -> tuple[collections.Counter, int, int]:
    faults: collections.Counter = collections.Counter()
    checks = rounds = 0
    for seed in seeds:
        result = trial_for(seed).run()
        faults.update(result.faults)
        checks += result.checks
        rounds += result.rounds
    return faults, checks, rounds


def summary(backend: str, trials: int, faults: collections.Counter, checks: int, rounds: int) -> str:
    return (
        f"randomized trials ({backend}): {trials} trials, {rounds} rounds, faults "
        f"{dict(sorted(faults.items()))}, {checks} invariant checks passed"
    )


@pytest.mark.slow
def test_two_hundred_randomized_trials_lose_no_job_and_run_no_attempt_twice(tmp_path: Path) -> None:
    def trial_for(seed: int) -> Trial:
        path = tmp_path / f"trial-{seed}.db"
        return Trial(
            seed, lambda: SqliteQueue(path), kill_points=KILL_POINTS if seed % KILL_EVERY == 0 else (), db_path=path
        )

    faults, checks, rounds = run_trials(range(TRIALS), trial_for)
    print("\n" + summary("sqlite", TRIALS, faults, checks, rounds))
    # The schedule really exercised every kind of fault (a generator change that stops drawing one
    # would otherwise pass silently).
    for kind in (*FAULT_KINDS, *(f"sigkill-{p}" for p in KILL_POINTS)):
        assert faults[kind] > 0, f"no {kind} fault in {TRIALS} trials"
    assert sum(faults[f"sigkill-{p}"] for p in KILL_POINTS) == TRIALS // KILL_EVERY


@pytest.mark.slow
def test_randomized_trials_on_the_aws_backend(aws_job_plane: dict[str, str]) -> None:
    from gpucloud.queue.connect import open_queue

    # Seeds after the SQLite ones: other schedules. Agents die with -9 at the points that exist on
    # AWS (there is no database write lock to die holding).
    aws_points = tuple(p for p in KILL_POINTS if p != "in-write-transaction")
    seeds = range(TRIALS, TRIALS + AWS_TRIALS)
    faults, checks, rounds = run_trials(
        seeds,
        lambda seed: Trial(
            seed, lambda: open_queue(aws_job_plane["uri"]), kill_points=aws_points if seed % KILL_EVERY == 0 else ()
        ),
    )
    print("\n" + summary("aws", AWS_TRIALS, faults, checks, rounds))
    assert sum(faults[f"sigkill-{p}"] for p in aws_points) == AWS_TRIALS // KILL_EVERY
    assert faults["notice-while-running"] > 0 and faults["duplicate-delivery"] > 0


@pytest.mark.parametrize("backend", ["sqlite", "aws"])
def test_a_late_member_cannot_start_the_next_attempt_under_its_old_gang(
    backend: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    # The race the trials found (seed 135 without the harness's guard): a 2-node gang forms, member a
    # starts it, the attempt ends at once (a notice while the gang forms, or a command that exits
    # immediately), and member b, which saw the formed gang a moment earlier, calls start_gang.
    if backend == "sqlite":
        queue = SqliteQueue(tmp_path / "late.db")
    else:
        from gpucloud.queue.connect import open_queue

        queue = open_queue(request.getfixturevalue("aws_job_plane")["uri"])
    job = queue.submit(JobSpec(command=["train"], nodes=2), job_id="late")
    now = time.time()
    a = gang.claim_slot(queue, "a", "10.0.0.1", lease_seconds=30, now=now)
    b = gang.claim_slot(queue, "b", "10.0.0.2", lease_seconds=30, now=now)
    assert a is not None and b is not None and gang.members(queue, job, 1, now=now) is not None
    assert gang.start_gang(queue, a, lease_seconds=60) is not None
    ended = queue.end_attempt(job.id, 1, AttemptEnd(state=AttemptState.REQUEUED, reason="spot-interruption notice"))
    assert ended.applied and (ended.job.state, ended.job.attempt) == (JobState.QUEUED, 2)

    assert gang.start_gang(queue, b, lease_seconds=60) is None
    # Attempt 2 must still be waiting for its own gang, not held by attempt 1's gang id.
    after = queue.get(job.id)
    assert (after.state, after.attempt, after.worker) == (JobState.QUEUED, 2, None), after
