"""The daily training-efficiency report (``gpucloud report``): pure, from records to a ``Report``.

Inputs are what the queue already stores (jobs, attempts, timeline events, the agents' node
records), an optional GPU-utilisation reading from Prometheus (``report_sources``), and a per-job
cost function. Nothing here reads a clock, a file or the network.

Which jobs: every job with an attempt that ran in the window ``[since, until]`` (or that was
submitted in it). A job's figures are its whole life's (``cost.timeline.build_timeline``, the same timeline
``gpucloud job show`` prints), so a job that ran across midnight reads the same in both days'
reports; the cost-per-day chart splits each job's cost over the days its attempts ran in.

Definitions (docs/cost.md, "The daily report"):

* *paid GPU-hours* = ``build_timeline``'s GPU-hours used (attempt wall time × nodes × GPUs per node).
* *lost GPU-hours* = ``build_timeline``'s GPU-hours lost (lost steps' share + restart overhead).
* *checkpoint GPU-hours* = Σ of the ``saved`` events' ``seconds`` × nodes × GPUs per node (the
  session measures each save; every GPU waits for it).
* *idle GPU-hours* = GPU time with utilisation below ``IDLE_BELOW_PCT`` while an attempt ran, from
  Prometheus; unknown (None, never 0) without it.
* *goodput* = (paid − lost − checkpoint) / paid: useful step time over paid GPU time.
* *waste rate* = (lost + idle + checkpoint) / paid over all jobs, capped at 1 (a GPU idle during a
  save counts twice; the rate over-states rather than hides).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterable, Mapping, Sequence

from pydantic import BaseModel

from gpucloud.cost.timeline import build_timeline
from gpucloud.lifecycle.model import Attempt, Event, Job, NodeRecord, NodeState

SECONDS_PER_HOUR = 3600.0
SECONDS_PER_DAY = 86400.0
# DCGM_FI_DEV_GPU_UTIL below this (percent) while an attempt runs counts as idle; the monitoring
# rule GpuIdleWhileRunning uses the same threshold (monitoring/rules.py).
IDLE_BELOW_PCT = 10.0
UNKNOWN_GROUP = "(none)"  # jobs and nodes off a cluster's groups (a laptop's worker)


@dataclasses.dataclass(frozen=True)
class JobHistory:
    """One job's records, as a queue returns them."""

    job: Job
    attempts: list[Attempt]
    events: list[Event]


@dataclasses.dataclass(frozen=True)
class JobCostTotals:
    """What the per-job cost function says (``cost/job_cost.py`` when it is there)."""

    cost_usd: float
    cost_lost_usd: float | None = None
    on_demand_equivalent_usd: float | None = None
    price_source: str | None = None  # e.g. "spot-history", "estimate"


# The one place a job's dollars come from: (history, node records by worker id) -> cost, or None
# when no price is known. ``report_sources.job_cost_function`` supplies it.
CostFunction = Callable[[JobHistory, Mapping[str, NodeRecord]], JobCostTotals | None]


@dataclasses.dataclass(frozen=True)
class Utilisation:
    """GPU utilisation from Prometheus over the window.

    ``per_job``: job id -> (mean utilisation %, idle GPU-hours). A job absent from it has no
    samples: unknown. ``series``: (time, mean utilisation % over every GPU running an attempt)."""

    source: str
    per_job: Mapping[str, tuple[float, float]]
    series: Sequence[tuple[float, float]]


class JobLine(BaseModel):
    job_id: str
    name: str | None
    state: str
    group: str
    gpus: int
    attempts: int
    gpu_hours: float
    cost_usd: float | None  # None: no price known for where it ran
    cost_lost_usd: float | None
    price_source: str | None
    gpu_utilisation_pct: float | None  # None: unknown (no monitoring, or no samples for the job)
    idle_gpu_hours: float | None
    interruptions: int
    steps_lost: int | None
    lost_gpu_hours: float
    checkpoint_gpu_hours: float
    checkpoint_overhead: float | None  # share of paid time spent saving (None: nothing paid)
    goodput: float | None  # useful step time / paid GPU time (None: nothing paid)


class GroupLine(BaseModel):
    group: str
    spot_node_hours: float
    on_demand_node_hours: float
    unknown_lifecycle_node_hours: float  # the node record is gone or never said
    interruptions: int
    interruptions_per_hour: float | None
    nodes: int  # agents reporting now
    idle_nodes: int  # of them, idle (nothing to claim): paid for, training nothing


class Totals(BaseModel):
    jobs: int
    gpu_hours: float
    cost_usd: float | None  # None when no job's cost is known
    jobs_without_cost: int
    lost_gpu_hours: float
    idle_gpu_hours: float | None
    checkpoint_gpu_hours: float
    interruptions: int
    steps_lost: int
    waste_rate: float | None  # (lost + idle + checkpoint) / paid; idle counts 0 when unknown (see utilisation)
    goodput: float | None


class DayCost(BaseModel):
    day: str  # YYYY-MM-DD (UTC)
    cost_usd: float | None  # None: no job that ran that day has a known price
    gpu_hours: float


class MoneySplit(BaseModel):
    """Where the money (or, without prices, the GPU-hours) went."""

    unit: str  # "usd" or "gpu-hours"
    useful: float
    lost: float
    idle: float
    checkpoint: float


class UtilisationPoint(BaseModel):
    at: float
    pct: float  # mean over every GPU running an attempt


class Report(BaseModel):
    since: float
    until: float
    utilisation_source: str | None  # the Prometheus URL, or None: utilisation unknown
    jobs: list[JobLine]
    groups: list[GroupLine]
    totals: Totals
    cost_per_day: list[DayCost]
    utilisation_over_time: list[UtilisationPoint]
    money: MoneySplit
    notes: list[str]


def build(
    histories: Iterable[JobHistory],
    nodes: Sequence[NodeRecord],
    *,
    since: float,
    until: float,
    cost_of: CostFunction,
    utilisation: Utilisation | None = None,
    node_stale_after_s: float = 120.0,
) -> Report:
    by_worker = {n.id: n for n in nodes}
    lines: list[JobLine] = []
    group_hours: dict[str, dict[str, float]] = {}
    group_interruptions: dict[str, int] = {}
    day_cost: dict[str, list[float]] = {}
    for history in histories:
        if not _active_in(history, since, until):
            continue
        line, spans = _job_line(history, by_worker, cost_of, utilisation, until)
        lines.append(line)
        group_interruptions[line.group] = group_interruptions.get(line.group, 0) + line.interruptions
        for lifecycle, group, seconds in _node_seconds(history, by_worker, until):
            hours = group_hours.setdefault(group, {"spot": 0.0, "on-demand": 0.0, "unknown": 0.0})
            hours[lifecycle] += seconds / SECONDS_PER_HOUR
        _split_by_day(line, spans, day_cost)
    return Report(
        since=since,
        until=until,
        utilisation_source=utilisation.source if utilisation is not None else None,
        jobs=lines,
        groups=_groups(group_hours, group_interruptions, nodes, until, node_stale_after_s),
        totals=_totals(lines),
        cost_per_day=[
            DayCost(day=day, cost_usd=round(cost, 2) if priced else None, gpu_hours=round(hours, 3))
            for day, (cost, hours, priced) in sorted(day_cost.items())
        ],
        utilisation_over_time=[UtilisationPoint(at=t, pct=round(v, 2)) for t, v in utilisation.series]
        if utilisation is not None
        else [],
        money=_money(lines),
        notes=_notes(lines, utilisation),
    )


def _active_in(history: JobHistory, since: float, until: float) -> bool:
    if since <= history.job.created_at <= until:
        return True
    for attempt in history.attempts:
        if attempt.started_at is None or attempt.started_at > until:
            continue
        if attempt.ended_at is None or attempt.ended_at >= since:
            return True
    return False


def _attempt_spans(history: JobHistory, until: float) -> list[tuple[float, float]]:
    spans = []
    for attempt in history.attempts:
        if attempt.started_at is None:
            continue
        end = attempt.ended_at if attempt.ended_at is not None else until
        if end > attempt.started_at:
            spans.append((attempt.started_at, end))
    return spans


def _job_line(
    history: JobHistory,
    by_worker: Mapping[str, NodeRecord],
    cost_of: CostFunction,
    utilisation: Utilisation | None,
    until: float,
) -> tuple[JobLine, list[tuple[float, float]]]:
    job = history.job
    report = build_timeline(job, history.attempts, history.events, now=until)
    gpus = job.spec.nodes * job.spec.gpus_per_node
    save_s = sum(
        float(e.data["seconds"])
        for e in history.events
        if e.kind == "saved" and isinstance(e.data.get("seconds"), (int, float))
    )
    checkpoint_hours = save_s * gpus / SECONDS_PER_HOUR
    paid = report.gpu_hours_used
    cost = cost_of(history, by_worker)
    measured = utilisation.per_job.get(job.id) if utilisation is not None else None
    line = JobLine(
        job_id=job.id,
        name=job.spec.name,
        state=job.state.value,
        group=_job_group(history, by_worker),
        gpus=gpus,
        attempts=len(history.attempts),
        gpu_hours=paid,
        cost_usd=None if cost is None else round(cost.cost_usd, 4),
        cost_lost_usd=None if cost is None or cost.cost_lost_usd is None else round(cost.cost_lost_usd, 4),
        price_source=None if cost is None else cost.price_source,
        gpu_utilisation_pct=None if measured is None else round(measured[0], 2),
        idle_gpu_hours=None if measured is None else round(measured[1], 4),
        interruptions=len(report.interruptions),
        steps_lost=report.steps_lost,
        lost_gpu_hours=report.gpu_hours_lost,
        checkpoint_gpu_hours=round(checkpoint_hours, 4),
        checkpoint_overhead=_share(checkpoint_hours, paid),
        goodput=_share(max(0.0, paid - report.gpu_hours_lost - checkpoint_hours), paid),
    )
    return line, _attempt_spans(history, until)


def _share(part: float, whole: float) -> float | None:
    return None if whole <= 0 else round(min(1.0, part / whole), 4)


def _job_group(history: JobHistory, by_worker: Mapping[str, NodeRecord]) -> str:
    """The group whose nodes ran its last started attempt (the node record says), else the one it asked for."""
    for attempt in reversed(history.attempts):
        node = by_worker.get(attempt.worker or "")
        if attempt.started_at is not None and node is not None and node.group:
            return node.group
    return history.job.spec.group or UNKNOWN_GROUP


def _node_seconds(
    history: JobHistory, by_worker: Mapping[str, NodeRecord], until: float
) -> Iterable[tuple[str, str, float]]:
    """(lifecycle, group, node-seconds) per attempt: wall time × the job's nodes."""
    for attempt in history.attempts:
        if attempt.started_at is None:
            continue
        end = attempt.ended_at if attempt.ended_at is not None else until
        node = by_worker.get(attempt.worker or "")
        # The life cycle the node recorded when it started the attempt (IMDS, ``jobs/runner.py``),
        # else the agent's node record (the node's current one: the same instance, so the same life cycle).
        lifecycle = _started_lifecycle(history.events, attempt.number) or (node.lifecycle if node else None)
        lifecycle = lifecycle if lifecycle in ("spot", "on-demand") else "unknown"
        group = node.group if node is not None and node.group else history.job.spec.group or UNKNOWN_GROUP
        yield str(lifecycle), group, max(0.0, end - attempt.started_at) * history.job.spec.nodes


def _started_lifecycle(events: list[Event], attempt: int) -> str | None:
    for event in events:
        if event.attempt == attempt and event.kind == "started" and isinstance(event.data.get("node"), dict):
            lifecycle = event.data["node"].get("lifecycle")
            return lifecycle if isinstance(lifecycle, str) else None
    return None


def _split_by_day(line: JobLine, spans: list[tuple[float, float]], day_cost: dict[str, list[float]]) -> None:
    total = sum(end - start for start, end in spans)
    if total <= 0:
        return
    for start, end in spans:
        at = start
        while at < end:
            day_start = math.floor(at / SECONDS_PER_DAY) * SECONDS_PER_DAY
            piece_end = min(end, day_start + SECONDS_PER_DAY)
            share = (piece_end - at) / total
            bucket = day_cost.setdefault(_day(day_start), [0.0, 0.0, 0.0])
            bucket[0] += (line.cost_usd or 0.0) * share
            bucket[1] += line.gpu_hours * share
            bucket[2] += line.cost_usd is not None
            at = piece_end


def _day(epoch: float) -> str:
    import datetime

    return datetime.datetime.fromtimestamp(epoch, tz=datetime.timezone.utc).strftime("%Y-%m-%d")


def _groups(
    hours: dict[str, dict[str, float]],
    interruptions: dict[str, int],
    nodes: Sequence[NodeRecord],
    until: float,
    stale_after_s: float,
) -> list[GroupLine]:
    live = [n for n in nodes if n.state is not NodeState.STOPPED and until - n.updated_at <= stale_after_s]
    names = set(hours) | {n.group or UNKNOWN_GROUP for n in live}
    lines = []
    for name in sorted(names):
        h = hours.get(name, {"spot": 0.0, "on-demand": 0.0, "unknown": 0.0})
        total = sum(h.values())
        count = interruptions.get(name, 0)
        members = [n for n in live if (n.group or UNKNOWN_GROUP) == name]
        lines.append(
            GroupLine(
                group=name,
                spot_node_hours=round(h["spot"], 3),
                on_demand_node_hours=round(h["on-demand"], 3),
                unknown_lifecycle_node_hours=round(h["unknown"], 3),
                interruptions=count,
                interruptions_per_hour=round(count / total, 4) if total > 0 else None,
                nodes=len(members),
                idle_nodes=sum(1 for n in members if n.state is NodeState.IDLE),
            )
        )
    return lines


def _totals(lines: list[JobLine]) -> Totals:
    paid = sum(line.gpu_hours for line in lines)
    lost = sum(line.lost_gpu_hours for line in lines)
    checkpoint = sum(line.checkpoint_gpu_hours for line in lines)
    idle_known = [line.idle_gpu_hours for line in lines if line.idle_gpu_hours is not None]
    idle = sum(idle_known) if idle_known else None
    costs = [line.cost_usd for line in lines if line.cost_usd is not None]
    return Totals(
        jobs=len(lines),
        gpu_hours=round(paid, 3),
        cost_usd=round(sum(costs), 2) if costs else None,
        jobs_without_cost=len(lines) - len(costs),
        lost_gpu_hours=round(lost, 3),
        idle_gpu_hours=None if idle is None else round(idle, 3),
        checkpoint_gpu_hours=round(checkpoint, 3),
        interruptions=sum(line.interruptions for line in lines),
        steps_lost=sum(line.steps_lost or 0 for line in lines),
        waste_rate=_share(lost + (idle or 0.0) + checkpoint, paid),
        goodput=_share(max(0.0, paid - lost - checkpoint), paid),
    )


def _money(lines: list[JobLine]) -> MoneySplit:
    """Each job's dollars (or GPU-hours, when no job has a price) split in the shares of its GPU-hours."""
    priced = any(line.cost_usd is not None for line in lines)
    split = {"lost": 0.0, "idle": 0.0, "checkpoint": 0.0, "useful": 0.0}
    for line in lines:
        amount = (line.cost_usd or 0.0) if priced else line.gpu_hours
        if line.gpu_hours <= 0 or amount <= 0:
            continue
        parts = {
            "lost": line.lost_gpu_hours,
            "idle": line.idle_gpu_hours or 0.0,
            "checkpoint": line.checkpoint_gpu_hours,
        }
        wasted = min(line.gpu_hours, sum(parts.values()))
        scale = wasted / sum(parts.values()) if sum(parts.values()) > 0 else 0.0
        for key, hours in parts.items():
            split[key] += amount * hours * scale / line.gpu_hours
        split["useful"] += amount * (line.gpu_hours - wasted) / line.gpu_hours
    return MoneySplit(unit="usd" if priced else "gpu-hours", **{k: round(v, 4) for k, v in split.items()})


def _notes(lines: list[JobLine], utilisation: Utilisation | None) -> list[str]:
    notes = []
    if not lines:
        notes.append("no job ran in this window: the queue has nothing to report")
    if utilisation is None:
        notes.append(
            "GPU utilisation and idle GPU-hours are unknown: no Prometheus was given (--prometheus URL); "
            "the waste rate counts no idle time"
        )
    else:
        unmeasured = sum(1 for line in lines if line.gpu_utilisation_pct is None)
        if unmeasured:
            notes.append(f"{unmeasured} job(s) have no GPU samples in Prometheus: their utilisation is unknown")
    unpriced = sum(1 for line in lines if line.cost_usd is None)
    if unpriced:
        notes.append(f"{unpriced} job(s) have no known price: their cost is unknown and left out of the totals")
    return notes
