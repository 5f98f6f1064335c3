"""``gpucloud jobs``: the jobs in the queue, each with what it cost so far."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import click

from gpucloud.commands.job_format import job_row, money, rate_text, state_text, when
from gpucloud.commands.options import queue_option
from gpucloud.output import output_option, print_json, print_table

if TYPE_CHECKING:
    from gpucloud.cost.job_cost import JobCost
    from gpucloud.lifecycle.model import Attempt, Event, Job

_STATES = ("queued", "running", "finished", "failed", "cancelled")


def _costs(histories: list[tuple[Job, list[Attempt], list[Event]]]) -> dict[str, JobCost]:
    """Each listed job's dollars, priced from its attempts' nodes as read with the listing."""
    from gpucloud.cost.job_cost import catalog_prices, job_cost

    prices, now = catalog_prices(), time.time()
    return {j.id: job_cost(j, attempts, events, prices, now=now) for j, attempts, events in histories}


@click.command("jobs")
@queue_option()
@click.option(
    "--state", "states", multiple=True, type=click.Choice(_STATES), help="Only jobs in this state (repeatable)."
)
@output_option()
def jobs(queue_uri: str | None, states: tuple[str, ...], output: str) -> None:
    """List jobs, oldest first: state, current attempt, step, what it cost so far (USD), worker, command.

    The cost is priced per node from the instance type, AZ and life cycle each attempt recorded,
    at the price in force when it started ("?" when unknown; --output json says why, and has the
    lost dollars, the on-demand equivalent and the savings; `gpucloud job show` breaks it down).

    A running job shows its current step and steps/s (over the last minute), updated with each
    lease renewal of its attempt (every 15 s, and once as soon as training reports a rate); an
    ended attempt leaves its last step.

    \b
    Example: gpucloud jobs --state queued --state running --output json
    """
    from gpucloud.lifecycle.model import JobState
    from gpucloud.queue.connect import open_queue

    queue = open_queue(queue_uri)
    histories = queue.histories([JobState(s) for s in states] if states else None)
    found = [job for job, _, _ in histories]
    costs = _costs(histories)
    if output == "json":
        print_json([job_row(j, costs[j.id]) for j in found])
        return
    print_table(
        f"jobs in {queue.uri}",
        ["id", "name", "state", "attempt", "step", "usd", "steps/s", "worker", "updated", "command"],
        [
            [
                j.id,
                j.spec.name or "",
                state_text(j),
                j.attempt,
                j.last_step,
                money(costs[j.id].cost_usd),
                rate_text(j.step_rate),
                j.worker or "",
                when(j.updated_at),
                " ".join(j.spec.command)[:60],
            ]
            for j in found
        ],
        markup=False,
    )
