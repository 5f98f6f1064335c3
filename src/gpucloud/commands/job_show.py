"""``gpucloud job show``: one job's attempts, timeline, interruptions, steps and GPU-hours lost,
and dollars, as a table (``render_timeline``, also the benchmark's) or ``--output json``."""

from __future__ import annotations

from typing import TYPE_CHECKING

import click

from gpucloud.commands.job_format import clock, money, rate_text, size_text, when
from gpucloud.commands.options import queue_option
from gpucloud.output import output_option, plain_markup, print_json, print_table, terminal_safe

if TYPE_CHECKING:
    from rich.console import Console

    from gpucloud.cost.job_cost import JobCost, NodeCost
    from gpucloud.cost.timeline import JobTimeline


@click.command("show")
@click.argument("job_id", metavar="JOB")
@queue_option()
@output_option()
def show(job_id: str, queue_uri: str | None, output: str) -> None:
    """Attempts, the timeline with timestamps, steps lost per interruption, GPU-hours used and lost,
    and dollars; while the job runs, its current step and steps/s.

    Dollars (docs/cost.md, "Dollars per job"): each node an attempt ran on is priced at the catalog
    price in force when it started (spot price history for its AZ where `gpucloud catalog refresh`
    stored it, else the spot estimate, or on-demand), times its wall time. cost lost = the lost
    steps' share of the attempt's cost + the restart overhead (interruption to the next attempt's
    restored step) the job paid for. Savings are against the same hours on demand.

    JOB is a job id, or the name it was submitted with (`submit --name`); a name several jobs share
    is refused with the list of their ids.

    \b
    Example: gpucloud job show j-4f2a9c01de --output json
    """
    from gpucloud.cost.job_cost import catalog_prices
    from gpucloud.cost.timeline import build_timeline
    from gpucloud.queue.connect import open_queue
    from gpucloud.queue.names import resolve_job

    queue = open_queue(queue_uri)
    current = resolve_job(queue, job_id)
    timeline = build_timeline(current, queue.attempts(current.id), queue.events(current.id), prices=catalog_prices())
    spec = current.spec
    if output == "json":
        code = spec.code.model_dump() if spec.code is not None else None
        print_json({**timeline.model_dump(), "code": code, "setup": spec.setup})
        return
    render_timeline(timeline)
    if spec.code is not None:  # what `submit --workdir/--setup` shipped (docs/code-shipping.md)
        click.echo(
            f"code: {spec.code.sha256[:12]} ({spec.code.files} files, {size_text(spec.code.size_bytes)}) at "
            + terminal_safe(spec.code.uri)
        )
    if spec.setup is not None:
        click.echo(f"setup: {terminal_safe(spec.setup)}")


def _progress_line(timeline: JobTimeline) -> str:
    """e.g. "\nprogress: step 1234 at 2.51 steps/s (12:03:04)" while a step is known."""
    if timeline.last_step is None:
        return ""
    rate = f" at {rate_text(timeline.step_rate)} steps/s" if timeline.step_rate is not None else ""
    at = f" ({when(timeline.progress_at)})" if timeline.progress_at is not None else ""
    return f"\nprogress: step {timeline.last_step}{rate}{at}"


def _checkpoints_line(timeline: JobTimeline) -> str:
    """The durable tier the attempts used, as each resolved it on its node (absent before one started)."""
    used = list(dict.fromkeys(a.checkpoint_uri for a in timeline.attempts if a.checkpoint_uri))
    return f"\ncheckpoints: {', '.join(used)}" if used else ""


def _cancelling(timeline: JobTimeline) -> bool:
    return timeline.cancel_requested_at is not None and timeline.state == "running"


def render_timeline(timeline: JobTimeline) -> None:
    """The human form of a JobTimeline (``job show``; the benchmark times it)."""
    from rich.console import Console

    console = Console()
    console.print(
        f"[bold]job {plain_markup(timeline.job_id)}[/bold]: {plain_markup(timeline.state)}"
        + (" — cancel requested: saving a step, then cancelled" if _cancelling(timeline) else "")
        + (f" — {plain_markup(timeline.reason)}" if timeline.reason else "")
        + f"\ncommand: {plain_markup(' '.join(timeline.command))}"
        + plain_markup(_checkpoints_line(timeline))
        + _progress_line(timeline)
    )
    print_table(
        "attempts",
        ["#", "state", "node", "started", "wall s", "resumed step", "last step", "exit", "reason"],
        [
            [
                a.number,
                a.state,
                a.node,
                when(a.started_at),
                a.wall_s,
                a.resumed_step,
                a.last_step,
                a.exit_code,
                a.reason,
            ]
            for a in timeline.attempts
        ],
        markup=False,
    )
    if timeline.interruptions:
        print_table(
            "interruptions",
            [
                "attempt",
                "cause",
                "last step",
                "committed",
                "resumed",
                "steps lost",
                "notice→flag s",
                "notice→ack s",
                "notice→commit s",
                "requeue→resume s",
                "stopped with",
            ],
            [
                [
                    i.attempt,
                    i.cause,
                    i.last_step,
                    i.committed_step,
                    i.resumed_step,
                    i.steps_lost,
                    i.notice_to_flag_s,
                    i.notice_to_ack_s,
                    i.notice_to_commit_s,
                    i.requeue_to_resume_s,
                    i.stopped_with or "",
                ]
                for i in timeline.interruptions
            ],
            markup=False,
        )
    print_table(
        "timeline",
        ["time", "attempt", "event", "detail"],
        [
            [
                clock(e.at),
                e.attempt,
                e.kind,
                e.detail,
            ]
            for e in timeline.timeline
        ],
        markup=False,
    )
    console.print(
        f"steps lost: {timeline.steps_lost}   GPU-hours used: {timeline.gpu_hours_used}   lost: {timeline.gpu_hours_lost}"
        + (f"\n[dim]{timeline.gpu_note}[/dim]" if timeline.gpu_note else "")
    )
    if timeline.cost is not None:
        render_cost(timeline.cost, console)
    for warning in timeline.warnings:  # e.g. an emergency save that could not fit
        console.print(f"warning: {terminal_safe(warning)}", markup=False, soft_wrap=True)


def render_cost(cost: JobCost, console: Console) -> None:
    """Dollars per attempt (one row each; its nodes in the last column) and the job's totals."""
    print_table(
        "cost (USD)",
        ["attempt", "usd", "lost usd", "on-demand usd", "price", "nodes"],
        [
            [
                a.attempt,
                money(a.cost_usd),
                money(a.cost_lost_usd),
                money(a.on_demand_equivalent_usd),
                ", ".join(sorted({_price_text(n) for n in a.nodes})),
                ", ".join(
                    f"{n.instance_type or '?'} {n.lifecycle or '?'} {n.availability_zone or n.region or '?'}"
                    for n in a.nodes
                ),
            ]
            for a in cost.attempts
        ],
        console=console,
        markup=False,
    )
    saved = (
        f", saved {money(cost.savings_usd)} ({cost.savings_pct:.1f}%)"
        if cost.savings_usd is not None and cost.savings_pct is not None
        else ""
    )
    console.print(
        f"cost: {money(cost.cost_usd)} USD   lost: {money(cost.cost_lost_usd)}"
        f"\non-demand equivalent: {money(cost.on_demand_equivalent_usd)}{saved}"
        f"\nprices: {', '.join(cost.price_sources) or 'none'}",
        markup=False,
    )
    for reason in cost.unknown_reasons:
        console.print(f"cost unknown: {terminal_safe(reason)}", markup=False, soft_wrap=True)


def _price_text(node: NodeCost) -> str:
    if node.usd_per_hour is None:
        return "?"
    return f"{node.usd_per_hour:.2f}/h {node.price_source}"
