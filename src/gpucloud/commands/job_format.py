"""How the job commands show a job: its JSON row, times, dollars, steps/s and state, the same in
``submit``, ``jobs`` and every ``job`` subcommand."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from gpucloud.cost.job_cost import JobCost
    from gpucloud.lifecycle.model import Job


def when(epoch: float | None) -> str:
    """Local time of ``epoch``; a time no calendar holds (a row edited to 1e308, NaN) shown as a number."""
    if epoch is None:
        return ""
    try:
        return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(epoch))
    except (OverflowError, ValueError, OSError):
        return f"{epoch!r} (not a time)"


def clock(epoch: float) -> str:
    """``HH:MM:SS.mmm`` local time, for the timeline; as ``when`` for a time no calendar holds."""
    try:
        return time.strftime("%H:%M:%S", time.localtime(epoch)) + f".{int(epoch % 1 * 1000):03d}"
    except (OverflowError, ValueError, OSError):
        return when(epoch)


def size_text(n: int) -> str:
    from gpucloud.jobs.code.snapshot import human_size

    return human_size(n)


def job_row(job: Job, cost: JobCost | None = None) -> dict[str, Any]:
    """A job as ``--output json`` gives it; with ``cost``, its dollars too (``gpucloud jobs``)."""
    return {
        "job_id": job.id,
        "name": job.spec.name,
        "state": job.state.value,
        "attempt": job.attempt,
        "crashes": job.crashes,
        "worker": job.worker,
        "created_at": job.created_at,
        "updated_at": job.updated_at,
        "command": job.spec.command,
        "reason": job.reason,
        "cancel_requested_at": job.cancel_requested_at,
        "group": job.spec.group,
        "fallback_group": job.spec.fallback_group,
        # Code shipping (submit --workdir/--setup): the snapshot's URI and hash, the setup command.
        "code": job.spec.code.model_dump() if job.spec.code is not None else None,
        "setup": job.spec.setup,
        # Live progress: the running attempt's step and steps/s (stored with its lease renewals),
        # or the last step of the attempt that ended last (step_rate null).
        "last_step": job.last_step,
        "step_rate": job.step_rate,
        "progress_at": job.progress_at,
        # Dollars (cost/job_cost.py; docs/cost.md "Dollars per job"); null with cost_unknown when unpriced.
        **_cost_fields(cost),
    }


def _cost_fields(cost: JobCost | None) -> dict[str, Any]:
    if cost is None:
        return {}
    return {
        "cost_usd": _usd(cost.cost_usd),
        "cost_lost_usd": _usd(cost.cost_lost_usd),
        "on_demand_equivalent_usd": _usd(cost.on_demand_equivalent_usd),
        "savings_usd": _usd(cost.savings_usd),
        "savings_pct": None if cost.savings_pct is None else round(cost.savings_pct, 2),
        "price_sources": cost.price_sources,
        "cost_unknown": cost.unknown_reasons,
    }


def _usd(value: float | None) -> float | None:
    return None if value is None else round(value, 4)


def money(value: float | None) -> str:
    return "?" if value is None else f"{value:,.2f}"


def rate_text(rate: float | None) -> str:
    return "" if rate is None else f"{rate:.3g}"


def state_text(job: Job) -> str:
    """The state as a table shows it: a running job that was cancelled is still saving its step."""
    return "cancelling" if job.cancel_requested_at is not None and not job.state.terminal else job.state.value
