"""The drill's verdict on hand-built timelines in the real SQLite queue: the run that keeps the
promise passes; each way of breaking it fails exactly its own check."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from gpucloud.drill.run import DrillRun
from gpucloud.drill.verdict import verdict_of
from gpucloud.lifecycle.model import AttemptEnd, AttemptState, JobSpec
from gpucloud.queue.sqlite import SqliteQueue

T0 = 1_000_000.0  # the injection
LEAD = 120.0
CHECKS = ["commit-within-lead", "one-step", "one-requeue", "resumed-at-commit", "steps-lost", "job-finished"]


@dataclasses.dataclass
class Timeline:
    """One drill job's story; each field is one thing a failing drill gets wrong."""

    ack_steps: tuple[int, ...] = (40, 40)  # one ack per node of the 2-node gang
    commit_step: int | None = 40
    commit_after_notice_s: float = 2.0
    last_step: int = 40  # the interrupted attempt's furthest completed step
    resumed_step: int = 40
    noticed: bool = True
    second_requeue: bool = False  # attempt 2 is noticed too; attempt 3 finishes
    final: AttemptState = AttemptState.FINISHED


def record(queue: SqliteQueue, t: Timeline) -> str:
    job = queue.submit(JobSpec(command=["train"], nodes=2, checkpoint_uri="/ckpt"), job_id="drill")

    def ev(attempt: int, kind: str, at: float, /, **data) -> None:
        queue.record(job.id, attempt, kind, at=T0 + at, data=data)

    def start(attempt: int, resumed: int, at: float) -> None:
        assert queue.claim("gang", lease_seconds=60, job_id=job.id, attempt=attempt) is not None
        queue.update_attempt(job.id, attempt, started_at=T0 + at, resumed_step=resumed)
        ev(attempt, "started", at)
        ev(attempt, "resume", at + 3, step=resumed)

    def noticed(attempt: int, at: float, stop_step: int, resumed: int) -> None:
        ev(attempt, "notice", at, kind="spot-interruption", deadline=T0 + at + LEAD, action="terminate")
        ev(attempt, "flag", at + 0.1)
        for step in t.ack_steps:
            ev(attempt, "ack", at + 0.5, step=step)
        if t.commit_step is not None:
            ev(attempt, "commit", at + t.commit_after_notice_s, step=t.commit_step)
        end = AttemptEnd(
            state=AttemptState.REQUEUED,
            exit_code=1,
            last_step=stop_step,
            committed_step=t.commit_step,
            resume_from=resumed,
            reason="checkpointed on notice",
        )
        queue.end_attempt(job.id, attempt, end)  # records the requeue

    start(1, 0, -30)
    if not t.noticed:
        queue.end_attempt(job.id, 1, AttemptEnd(state=t.final, exit_code=0, last_step=100))
        return job.id
    noticed(1, 0.2, t.last_step, t.resumed_step)
    start(2, t.resumed_step, 5)
    attempt = 2
    if t.second_requeue:
        noticed(2, 20, t.last_step + 10, t.resumed_step + 10)
        start(3, t.resumed_step + 10, 25)
        attempt = 3
    final_step = 100 if t.final is AttemptState.FINISHED else 70
    queue.end_attempt(job.id, attempt, AttemptEnd(state=t.final, exit_code=0, last_step=final_step))
    return job.id


def verdict(tmp_path: Path, timeline: Timeline):
    queue = SqliteQueue(tmp_path / "queue.db")
    try:
        job_id = record(queue, timeline)
        run = DrillRun(queue, job_id, target="a", injected_at=T0, lead_seconds=LEAD, injector="imds-emulator")
        return verdict_of(run)
    finally:
        queue.close()


def failed(result) -> list[str]:
    return [c.name for c in result.checks if not c.passed]


def test_a_run_that_keeps_the_promise_passes_with_every_figure(tmp_path):
    result = verdict(tmp_path, Timeline())
    assert result.verdict == "pass", result.checks
    assert [c.name for c in result.checks] == CHECKS
    checks = {c.name: c for c in result.checks}
    assert (checks["commit-within-lead"].value, checks["commit-within-lead"].limit) == (2.0, 120.0)
    assert checks["one-step"].value == [40]
    assert (checks["one-requeue"].value, checks["resumed-at-commit"].value, checks["steps-lost"].value) == (1, 40, 0)
    assert checks["job-finished"].value == "finished"
    assert result.timeline["injected_to_notice_s"] == pytest.approx(0.2)
    assert result.timeline["notice_to_commit_s"] == 2.0
    assert result.timeline["committed_step"] == result.timeline["resumed_step"] == 40
    assert (result.job_id, result.attempts, result.target, result.injector) == ("drill", 2, "a", "imds-emulator")


def test_one_step_lost_is_still_within_the_promise(tmp_path):
    result = verdict(tmp_path, Timeline(last_step=41))
    assert result.verdict == "pass"
    assert result.timeline["steps_lost"] == 1


@pytest.mark.parametrize(
    ("timeline", "fails"),
    [
        (Timeline(commit_after_notice_s=LEAD + 1), ["commit-within-lead"]),
        (Timeline(ack_steps=(40, 41), commit_step=41, last_step=41, resumed_step=41), ["one-step"]),
        (Timeline(ack_steps=(40,)), ["one-step"]),  # one node never acked
        (Timeline(second_requeue=True), ["one-requeue"]),
        (Timeline(last_step=40, resumed_step=39), ["resumed-at-commit"]),  # restored an older step: 1 lost
        (Timeline(last_step=42), ["steps-lost"]),  # trained 2 steps past the commit
        (Timeline(final=AttemptState.FAILED), ["job-finished"]),
        (Timeline(commit_step=None), ["commit-within-lead", "one-step", "resumed-at-commit"]),
    ],
    ids=[
        "commit-after-deadline",
        "ranks-on-two-steps",
        "a-node-never-acked",
        "two-requeues",
        "resumed-before-the-commit",
        "two-steps-lost",
        "job-failed",
        "nothing-committed",
    ],
)
def test_each_broken_promise_fails_its_own_check(tmp_path, timeline, fails):
    result = verdict(tmp_path, timeline)
    assert result.verdict == "fail"
    assert failed(result) == fails, result.checks


def test_a_job_that_was_never_interrupted_fails_the_drill(tmp_path):
    result = verdict(tmp_path, Timeline(noticed=False))
    assert result.verdict == "fail"
    assert failed(result) == CHECKS[:-1]
    assert result.timeline["interrupted_attempt"] is None
    assert "no interruption notice" in result.checks[0].detail
