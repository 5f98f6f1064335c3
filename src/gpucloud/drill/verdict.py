"""The drill's verdict: did the job keep gpucloud's spot promise through one interruption?

A pure judge over the drill job's record in the queue (the job, its attempts, its events), the same
whichever injector interrupted it (AWS FIS on a cluster, an IMDS emulator on the local fleet). The
per-interruption figures are ``cost/timeline.py``'s (what ``gpucloud job show`` prints); this module
only holds them against the promise:

* ``commit-within-lead``: notice → checkpoint committed, before the notice's deadline (the
  instance is reclaimed then: a spot notice gives two minutes,
  https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/spot-instance-termination-notices.html);
* ``one-step``: every node acked the stop at the same step, and the commit names that step;
* ``one-requeue``: the job was requeued exactly once (the notice is not a crash, nor two);
* ``resumed-at-commit``: the next attempt restored exactly the committed step;
* ``steps-lost``: at most one step recomputed;
* ``job-finished``: the job then ran to its end.

Pass only if every check passes.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel

from gpucloud.cost.timeline import Interruption, build_timeline
from gpucloud.drill.run import DrillRun
from gpucloud.lifecycle.model import Attempt, Event, Job, JobState

MAX_STEPS_LOST = 1


class Check(BaseModel):
    name: str
    passed: bool
    value: Any  # the figure measured (None: the timeline does not have it)
    limit: Any  # what the promise allows
    detail: str  # the check in words, with its figures


class Verdict(BaseModel):
    verdict: Literal["pass", "fail"]
    checks: list[Check]
    job_id: str
    job_state: str
    attempts: int
    target: str
    injector: str
    injected_at: float  # when the interruption was injected (epoch seconds; ISO 8601 in JSON output)
    lead_seconds: float
    timeline: dict[str, Any]  # the interruption's figures (seconds relative to the notice, steps)
    experiment: dict[str, Any] | None = None


def judge(
    job: Job,
    attempts: list[Attempt],
    events: list[Event],
    *,
    target: str,
    injector: str,
    lead_seconds: float,
    injected_at: float,
    experiment: dict[str, Any] | None = None,
) -> Verdict:
    """The verdict on the drill job's record (pure)."""
    report = build_timeline(job, attempts, events, now=max((e.at for e in events), default=injected_at))
    interruption = _the_interruption(report.interruptions)
    number = interruption.attempt if interruption is not None else None
    checks = [
        _commit_within_lead(interruption),
        _one_step(events, number, job.spec.nodes),
        _one_requeue(events),
        _resumed_at_commit(interruption),
        _steps_lost(interruption),
        _job_finished(job),
    ]
    notice = next((e for e in events if e.kind == "notice" and e.attempt == number), None)
    timeline: dict[str, Any] = {
        "interrupted_attempt": number,
        "injected_to_notice_s": None if notice is None else round(notice.at - injected_at, 3),
        **(
            {}
            if interruption is None
            else interruption.model_dump(
                include={
                    "notice_to_flag_s",
                    "notice_to_ack_s",
                    "notice_to_commit_s",
                    "commit_before_deadline_s",
                    "requeue_to_resume_s",
                    "notice_to_resume_s",
                    "last_step",
                    "committed_step",
                    "resumed_step",
                    "steps_lost",
                }
            )
        ),
    }
    return Verdict(
        verdict="pass" if all(c.passed for c in checks) else "fail",
        checks=checks,
        job_id=job.id,
        job_state=job.state.value,
        attempts=len(attempts),
        target=target,
        injector=injector,
        injected_at=injected_at,
        lead_seconds=lead_seconds,
        timeline=timeline,
        experiment=experiment,
    )


def verdict_of(run: DrillRun) -> Verdict:
    """The verdict on what a drill left in its queue."""
    return judge(
        run.queue.get(run.job_id),
        run.queue.attempts(run.job_id),
        run.queue.events(run.job_id),
        target=run.target,
        injector=run.injector,
        lead_seconds=run.lead_seconds,
        injected_at=run.injected_at,
        experiment=run.experiment,
    )


def _the_interruption(interruptions: list[Interruption]) -> Interruption | None:
    """The drill's interruption: the first one a notice caused (else the first at all, which then fails)."""
    noticed = [i for i in interruptions if i.notice_kind is not None]
    candidates = noticed or interruptions
    return candidates[0] if candidates else None


def _commit_within_lead(interruption: Interruption | None) -> Check:
    took = interruption.notice_to_commit_s if interruption is not None else None
    margin = interruption.commit_before_deadline_s if interruption is not None else None
    lead = None if took is None or margin is None else round(took + margin, 3)
    passed = took is not None and margin is not None and margin >= 0
    if interruption is None or interruption.notice_kind is None:
        detail = "no interruption notice in the job's timeline"
    elif took is None:
        detail = "no checkpoint was committed after the notice"
    elif margin is None:
        detail = f"committed {took:.3f}s after the notice, which carried no deadline"
    else:
        detail = f"committed {took:.3f}s after the notice, {margin:.3f}s before its deadline ({lead:.3f}s lead)"
    return Check(name="commit-within-lead", passed=passed, value=took, limit=lead, detail=detail)


def _one_step(events: list[Event], attempt: int | None, nodes: int) -> Check:
    acks = [e.data.get("step") for e in events if e.kind == "ack" and e.attempt == attempt]
    commits = [e.data.get("step") for e in events if e.kind == "commit" and e.attempt == attempt]
    steps = sorted({*acks, *commits}, key=str)
    passed = len(acks) >= nodes and bool(commits) and len(steps) == 1 and steps[0] is not None
    detail = (
        f"{len(acks)} of {nodes} nodes acked, at steps {_steps(acks)}; committed at {_steps(commits)}"
        if acks or commits
        else "no node acked a stop step and nothing was committed"
    )
    return Check(name="one-step", passed=passed, value=steps, limit="one step, acked by every node", detail=detail)


def _one_requeue(events: list[Event]) -> Check:
    requeues = sum(1 for e in events if e.kind == "requeue")
    return Check(
        name="one-requeue",
        passed=requeues == 1,
        value=requeues,
        limit=1,
        detail=f"the job was requeued {requeues} time{'' if requeues == 1 else 's'}",
    )


def _resumed_at_commit(interruption: Interruption | None) -> Check:
    committed = interruption.committed_step if interruption is not None else None
    resumed = interruption.resumed_step if interruption is not None else None
    passed = committed is not None and resumed == committed
    detail = (
        "the interrupted attempt committed no step"
        if committed is None
        else "no later attempt resumed"
        if resumed is None
        else f"resumed at step {resumed}; step {committed} was committed"
    )
    return Check(name="resumed-at-commit", passed=passed, value=resumed, limit=committed, detail=detail)


def _steps_lost(interruption: Interruption | None) -> Check:
    lost = interruption.steps_lost if interruption is not None else None
    if interruption is None or lost is None:
        detail = "unknown: no later attempt resumed"
    else:
        detail = (
            f"{lost} step{'' if lost == 1 else 's'} recomputed: the interrupted attempt completed step "
            f"{interruption.last_step}, the next resumed at {interruption.resumed_step}"
        )
    passed = lost is not None and lost <= MAX_STEPS_LOST
    return Check(name="steps-lost", passed=passed, value=lost, limit=MAX_STEPS_LOST, detail=detail)


def _job_finished(job: Job) -> Check:
    detail = f"the job is {job.state.value}" + (f" ({job.reason})" if job.reason else "")
    return Check(
        name="job-finished",
        passed=job.state is JobState.FINISHED,
        value=job.state.value,
        limit=JobState.FINISHED.value,
        detail=detail,
    )


def _steps(steps: list[Any]) -> str:
    return ", ".join(str(s) for s in steps) if steps else "none"
