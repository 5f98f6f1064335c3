"""The report as text: the summary (also what the daily schedule sends to the alert topic) and the table rows."""

from __future__ import annotations

from gpucloud.cost.report import Report
from gpucloud.output import iso_time

UNKNOWN = "unknown"

JOB_COLUMNS = [
    "job",
    "state",
    "group",
    "GPU-h",
    "cost $",
    "GPU util",
    "idle GPU-h",
    "interruptions",
    "steps lost",
    "ckpt share",
    "goodput",
]
GROUP_COLUMNS = ["group", "spot node-h", "on-demand node-h", "other node-h", "interruptions/h", "nodes", "idle nodes"]


def _pct(share: float | None) -> str:
    return UNKNOWN if share is None else f"{share * 100:.1f}%"


def _num(value: float | None, digits: int = 2) -> str:
    return UNKNOWN if value is None else f"{value:,.{digits}f}"


def summary(report: Report) -> str:
    """A few lines: the window, totals, waste rate, and what is unknown."""
    t = report.totals
    cost = "unknown (no prices)" if t.cost_usd is None else f"${t.cost_usd:,.2f}"
    if t.cost_usd is not None and t.jobs_without_cost:
        cost += f" ({t.jobs_without_cost} job(s) without a price left out)"
    lines = [
        f"gpucloud report {iso_time(report.since)} .. {iso_time(report.until)}",
        f"jobs: {t.jobs}   GPU-hours: {t.gpu_hours:,.2f}   cost: {cost}",
        f"waste rate: {_pct(t.waste_rate)} (lost {t.lost_gpu_hours:,.2f} + idle "
        f"{_num(t.idle_gpu_hours)} + checkpoint {t.checkpoint_gpu_hours:,.2f} GPU-h)   goodput: {_pct(t.goodput)}",
        f"interruptions: {t.interruptions}   steps lost: {t.steps_lost}",
    ]
    return "\n".join([*lines, *(f"note: {note}" for note in report.notes)])


def job_rows(report: Report) -> list[list[str]]:
    return [
        [
            line.job_id if not line.name else f"{line.job_id} ({line.name})",
            line.state,
            line.group,
            f"{line.gpu_hours:,.2f}",
            _num(line.cost_usd),
            UNKNOWN if line.gpu_utilisation_pct is None else f"{line.gpu_utilisation_pct:.0f}%",
            _num(line.idle_gpu_hours),
            str(line.interruptions),
            UNKNOWN if line.steps_lost is None else str(line.steps_lost),
            _pct(line.checkpoint_overhead),
            _pct(line.goodput),
        ]
        for line in report.jobs
    ]


def group_rows(report: Report) -> list[list[str]]:
    return [
        [
            g.group,
            f"{g.spot_node_hours:,.2f}",
            f"{g.on_demand_node_hours:,.2f}",
            f"{g.unknown_lifecycle_node_hours:,.2f}",
            "" if g.interruptions_per_hour is None else f"{g.interruptions_per_hour:.3f}",
            str(g.nodes),
            str(g.idle_nodes),
        ]
        for g in report.groups
    ]
