"""What a job's timeline says: steps lost per interruption, latencies, GPU-hours used and lost.

Pure functions over the records a queue returns (job, attempts, events); ``gpucloud job show``,
``gpucloud demo`` and the benchmark all print this one timeline (``JobTimeline``).

Definitions (also in docs/spot-train.md):

* *steps lost* by attempt k = the furthest step it completed − the step attempt k+1 resumed from
  (steps are counted as completed steps; a fresh start resumes from 0). 0: nothing recomputed.
* *GPU-hours used* = Σ attempt wall time × nodes × GPUs per node.
* *GPU-hours lost* = for each attempt that did not finish: the share of its training time spent on
  the steps that were lost, plus the next attempt's start-up (process start → checkpoint restored).
* *dollars* (``cost``, with a price lookup): ``cost/job_cost.py`` (docs/cost.md, "Dollars per job").
"""

from __future__ import annotations

import time
from collections.abc import Iterable

from pydantic import BaseModel

from gpucloud.cost.job_cost import JobCost, PriceLookup, job_cost
from gpucloud.lifecycle.model import CANCEL_SOURCE, FRESH_START_STEP, Attempt, AttemptState, Event, Job, steps_lost


class Interruption(BaseModel):
    attempt: int
    cause: str  # notice kind, "crash", "lost" or "cancel" (a cancelled attempt that `job resume` continued)
    notice_kind: str | None = None
    last_step: int | None = None
    committed_step: int | None = None
    resumed_step: int | None = None  # what attempt k+1 restored (None: not resumed yet / fresh)
    steps_lost: int | None = None
    notice_to_flag_s: float | None = None
    notice_to_ack_s: float | None = None  # every rank agreed on the stop step
    notice_to_commit_s: float | None = None
    commit_before_deadline_s: float | None = None
    requeue_to_resume_s: float | None = None
    notice_to_resume_s: float | None = None
    stopped_with: str | None = None  # signal the supervisor had to send, if any
    save_fits: bool | None = None  # at the notice, the last measured save fitted before commit_by (None: unknown)


class AttemptRow(BaseModel):
    number: int
    state: str
    node: str | None
    started_at: float | None
    ended_at: float | None
    wall_s: float | None
    resumed_step: int | None
    last_step: int | None
    exit_code: int | None
    reason: str | None
    checkpoint_uri: str | None = None  # the durable tier this attempt used (resolved on its node)
    step_rate: float | None = None  # steps per second over the last minute, while it runs


class TimelineRow(BaseModel):
    at: float
    attempt: int
    kind: str
    detail: str


class JobTimeline(BaseModel):
    job_id: str
    state: str
    reason: str | None
    command: list[str]
    attempts: list[AttemptRow]
    interruptions: list[Interruption]
    steps_lost: int | None  # total over interruptions whose loss is known
    gpus_per_node: int
    nodes: int
    gpu_hours_used: float
    gpu_hours_lost: float
    gpu_note: str | None
    timeline: list[TimelineRow]
    warnings: list[str] = []  # e.g. an emergency save that could not fit in the notice
    cancel_requested_at: float | None = None  # `gpucloud job cancel` on the running job: it is stopping
    # Live progress (the job record's, stored with each lease renewal): the running attempt's step
    # and rate, or the last step of the attempt that ended last.
    last_step: int | None = None
    step_rate: float | None = None
    progress_at: float | None = None
    cost: JobCost | None = None  # dollars per attempt and in total (None: no price lookup given)


def build_timeline(
    job: Job,
    attempts: list[Attempt],
    events: list[Event],
    *,
    now: float | None = None,
    prices: PriceLookup | None = None,
) -> JobTimeline:
    """The timeline; with ``prices`` (``cost.job_cost.catalog_prices()``) also what the job cost."""
    now = time.time() if now is None else now
    by_attempt: dict[int, list[Event]] = {}
    for event in events:
        by_attempt.setdefault(event.attempt, []).append(event)
    gpus = job.spec.nodes * job.spec.gpus_per_node

    rows: list[AttemptRow] = []
    interruptions: list[Interruption] = []
    used_s = 0.0
    lost_s = 0.0
    attempts_by_number = {a.number: a for a in attempts}
    for attempt in attempts:
        evs = by_attempt.get(attempt.number, [])
        started = attempt.started_at
        ended = (
            attempt.ended_at
            if attempt.ended_at is not None
            else (now if attempt.state is AttemptState.RUNNING else None)
        )
        wall = (ended - started) if started is not None and ended is not None else None
        used_s += wall or 0.0
        live = _reports_progress(job, attempt)
        rows.append(
            AttemptRow(
                number=attempt.number,
                state=attempt.state.value,
                node=attempt.node,
                started_at=started,
                ended_at=attempt.ended_at,
                wall_s=_r(wall),
                resumed_step=attempt.resumed_step,
                # A running attempt's step lives on the job until the attempt ends (JobQueue.heartbeat).
                last_step=job.last_step if live and attempt.last_step is None else attempt.last_step,
                exit_code=attempt.exit_code,
                reason=attempt.reason,
                checkpoint_uri=_checkpoint_uri(evs),
                step_rate=job.step_rate if live else None,
            )
        )
        following = attempts_by_number.get(attempt.number + 1)
        if attempt.state not in _INTERRUPTED and not (attempt.state in _ENDED and following is not None):
            continue
        next_events = by_attempt.get(attempt.number + 1, [])
        interruption = _interruption(attempt, evs, following, next_events)
        # A failed or cancelled attempt interrupted the job only when `job resume` continued it.
        if attempt.state not in _ENDED or interruption.notice_kind is not None or following is not None:
            interruptions.append(interruption)
        lost_s += _lost_seconds(attempt, evs, interruption, following, next_events)

    known = [i.steps_lost for i in interruptions if i.steps_lost is not None]
    return JobTimeline(
        job_id=job.id,
        state=job.state.value,
        reason=job.reason,
        cancel_requested_at=job.cancel_requested_at,
        last_step=job.last_step,
        step_rate=job.step_rate,
        progress_at=job.progress_at,
        cost=None if prices is None else job_cost(job, attempts, events, prices, now=now),
        command=job.spec.command,
        attempts=rows,
        interruptions=interruptions,
        steps_lost=sum(known) if known else (0 if not interruptions else None),
        gpus_per_node=job.spec.gpus_per_node,
        nodes=job.spec.nodes,
        gpu_hours_used=round(used_s * gpus / 3600, 4),
        gpu_hours_lost=round(lost_s * gpus / 3600, 4),
        gpu_note=(
            "GPU-hours are 0: the job declares 0 GPUs per node (CPU); set --gpus-per-node when submitting"
            if gpus == 0
            else None
        ),
        timeline=[TimelineRow(at=e.at, attempt=e.attempt, kind=e.kind, detail=_detail(e)) for e in events],
        warnings=[
            *(
                f"attempt {e.attempt}: {_save_fit_detail(e)}"
                for e in events
                if e.kind == "save-fit" and e.data.get("fits") is False
            ),
            *(
                f"attempt {e.attempt}: resumed at step {e.data.get('step')}, but the data position was "
                f"{e.data['data_position']}; the batches after it differ from an uninterrupted run's, so the "
                "steps kept are not the steps an uninterrupted run would have trained"
                for e in events
                if e.kind == "resume" and str(e.data.get("data_position", "")).startswith("not restored")
            ),
        ],
    )


def _reports_progress(job: Job, attempt: Attempt) -> bool:
    """Whether the job's live progress is ``attempt``'s: it is the running attempt, and the step was
    written since it started (until its first renewal the job still holds the previous attempt's)."""
    return (
        attempt.state is AttemptState.RUNNING
        and attempt.number == job.attempt
        and attempt.started_at is not None
        and job.progress_at is not None
        and job.progress_at >= attempt.started_at
    )


_INTERRUPTED = (AttemptState.REQUEUED, AttemptState.CRASHED, AttemptState.LOST, AttemptState.FAILED)
_ENDED = (AttemptState.FAILED, AttemptState.CANCELLED)  # ended the job, until `gpucloud job resume`


def _first(events: Iterable[Event], kind: str) -> Event | None:
    return next((e for e in events if e.kind == kind), None)


def _interruption(
    attempt: Attempt, evs: list[Event], following: Attempt | None, next_events: list[Event]
) -> Interruption:
    notice = next((e for e in evs if e.kind == "notice" and e.data.get("deadline") is not None), None)
    flag, ack, commit = _first(evs, "flag"), _first(evs, "ack"), _first(evs, "commit")
    requeue = _first(evs, "requeue") or _first(evs, "resubmit")
    resume = _first(next_events, "resume")
    kills = [e.data.get("signal") for e in evs if e.kind == "stop"]
    cause = (
        "cancel"
        if attempt.state is AttemptState.CANCELLED
        else str(notice.data.get("kind"))
        if notice is not None
        else "lost"
        if attempt.state is AttemptState.LOST
        else "crash"
    )
    resumed_step = following.resumed_step if following is not None and resume is not None else None
    lost = steps_lost(attempt.last_step, resumed_step) if resume is not None else None
    deadline = notice.data.get("deadline") if notice is not None else None
    return Interruption(
        attempt=attempt.number,
        cause=cause,
        notice_kind=str(notice.data.get("kind")) if notice is not None else None,
        last_step=attempt.last_step,
        committed_step=attempt.committed_step,
        resumed_step=resumed_step,
        steps_lost=lost,
        notice_to_flag_s=_dt(notice, flag),
        notice_to_ack_s=_dt(notice, ack),
        notice_to_commit_s=_dt(notice, commit),
        commit_before_deadline_s=_r(deadline - commit.at)
        if commit is not None and isinstance(deadline, (int, float))
        else None,
        requeue_to_resume_s=_dt(requeue, resume),
        notice_to_resume_s=_dt(notice, resume),
        save_fits=_save_fits(evs),
        stopped_with=kills[-1] if kills else None,
    )


def _lost_seconds(
    attempt: Attempt, evs: list[Event], interruption: Interruption, following: Attempt | None, next_events: list[Event]
) -> float:
    lost = 0.0
    resume = _first(evs, "resume")
    train_start = resume.at if resume is not None else attempt.started_at
    if train_start is not None and attempt.ended_at is not None and attempt.last_step is not None:
        first_step = attempt.resumed_step if attempt.resumed_step is not None else FRESH_START_STEP
        done = attempt.last_step - first_step
        train_s = max(0.0, attempt.ended_at - train_start)
        if interruption.steps_lost is not None and done > 0:
            lost += train_s * min(1.0, interruption.steps_lost / done)
        elif interruption.steps_lost is None:
            lost += train_s  # nothing known to be kept: count it all
    next_resume = _first(next_events, "resume")
    if following is not None and following.started_at is not None and next_resume is not None:
        lost += max(0.0, next_resume.at - following.started_at)
    return lost


def _dt(start: Event | None, end: Event | None) -> float | None:
    if start is None or end is None:
        return None
    return _r(end.at - start.at)


def _r(value: float | None) -> float | None:
    return None if value is None else round(value, 3)


def _checkpoint_uri(events: list[Event]) -> str | None:
    started = _first(events, "started")
    uri = started.data.get("checkpoint_uri") if started is not None else None
    return uri if isinstance(uri, str) else None


def _detail(event: Event) -> str:
    if event.kind == "stop-request":
        return _stop_request_detail(event)
    if event.kind == "save-fit":
        return _save_fit_detail(event)
    data = dict(event.data)
    data.pop("event_id", None)
    for key in ("deadline", "ack_by", "commit_by"):
        if isinstance(data.get(key), (int, float)):
            data[key] = f"{data[key] - event.at:+.1f}s"
    node = data.get("node")
    if isinstance(node, dict):  # where it ran, as a person reads it (-o json has every field)
        where = (node.get(k) for k in ("instance_id", "instance_type", "lifecycle", "availability_zone"))
        data["node"] = " ".join(str(v) for v in where if v) or "unknown"
    parts = [f"{k}={' '.join(v) if isinstance(v, list) else v}" for k, v in data.items() if v is not None]
    return ", ".join(parts)


def _save_fits(events: list[Event]) -> bool | None:
    fit = _first(events, "save-fit")
    fits = fit.data.get("fits") if fit is not None else None
    return fits if isinstance(fits, bool) else None


def _save_fit_detail(event: Event) -> str:
    """e.g. "emergency save would NOT fit: the last save (step 40, 208.00 GB) took 357.0 s; 112.0 s were left"."""
    data = event.data
    left, needed, size, step = data.get("left_s"), data.get("needed_s"), data.get("bytes"), data.get("measured_step")
    left_text = f"{left:.1f} s" if isinstance(left, (int, float)) else "unknown time"
    if not isinstance(needed, (int, float)):
        return f"emergency save: {left_text} left to commit; no earlier save of this job was measured"
    verdict = "would fit" if data.get("fits") else "would NOT fit"
    size_text = f", {size / 1e9:.2f} GB" if isinstance(size, int) else ""
    return (
        f"emergency save {verdict}: the last save (step {step}{size_text}) took {needed:.1f} s; {left_text} were left"
    )


def _stop_request_detail(event: Event) -> str:
    """e.g. "spot-interruption (terminate) from queue about i-0abc..., deadline +95.0s: every gang member stops"."""
    data = event.data
    if data.get("source") == CANCEL_SOURCE and isinstance(data.get("deadline"), (int, float)):
        return f"cancel: every rank saves a step, deadline {data['deadline'] - event.at:+.1f}s"
    text = str(data.get("kind") or "stop")
    if data.get("action"):
        text += f" ({data['action']})"
    if data.get("source"):
        text += f" from {data['source']}"
    if data.get("instance_id"):
        text += f" about {data['instance_id']}"
    if isinstance(data.get("deadline"), (int, float)):
        text += f", deadline {data['deadline'] - event.at:+.1f}s"
    return text + ": every gang member stops"
