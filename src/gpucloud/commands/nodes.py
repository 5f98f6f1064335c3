"""``gpucloud nodes``: the agents of the cluster as they last reported themselves."""

from __future__ import annotations

import time

import click

from gpucloud.commands.options import queue_option
from gpucloud.output import output_option, print_json, print_table

STALE_AFTER_S = 120.0  # an agent renews its record at least every quarter slot lease, and every idle poll


@click.command(
    "nodes",
    epilog="""\b
Examples:
  gpucloud nodes                     # state, instance type, spot/on-demand, job of every agent
  gpucloud nodes --output json       # the same for scripts
  gpucloud nodes --all               # include agents that stopped or went silent
\b
States: idle (nothing to claim), waiting (holds a slot, its gang is forming), running,
stopping (an interruption notice arrived), stopped (the agent exited). An agent silent for
longer than --stale-after seconds is shown as "silent" (killed, or its node is gone). "why"
says what closed a record another agent closed (an interruption for a node whose agent had died).
""",
)
@queue_option()
@click.option("--all", "show_all", is_flag=True, help="Also list stopped and silent agents.")
@click.option(
    "--stale-after",
    type=click.FloatRange(min=1.0),
    default=STALE_AFTER_S,
    show_default=True,
    metavar="SECONDS",
    help="Seconds without a report after which an agent counts as silent.",
)
@output_option()
def nodes(queue_uri, show_all, stale_after, output) -> None:
    """List the node agents recorded in the queue: state, instance type, life cycle (spot or
    on-demand) and the job, attempt and slot each one holds."""
    from gpucloud.queue.connect import open_queue

    queue = open_queue(queue_uri)
    try:
        records = queue.nodes()
    finally:
        queue.close()
    now = time.time()
    rows = []
    for node in records:
        silent = node.state.value != "stopped" and now - node.updated_at > stale_after
        state = "silent" if silent else node.state.value
        if not show_all and state in ("stopped", "silent"):
            continue
        rows.append(
            {
                "worker": node.id,  # the agent's worker id, as `agent -o json` and `worker -o json` name it
                "state": state,
                "address": node.address,
                "instance_id": node.instance_id,
                "instance_type": node.instance_type,
                "lifecycle": node.lifecycle,
                "job_id": node.job_id,
                "attempt": node.attempt,
                "slot": node.slot,
                "updated_at": node.updated_at,
                "seen_seconds_ago": round(now - node.updated_at, 1),
                "reason": node.reason,
            }
        )
    if output == "json":
        print_json(rows)
        return
    print_table(
        f"{len(rows)} node agent(s)",
        ["agent", "state", "instance type", "lifecycle", "job", "attempt", "slot", "seen", "why"],
        [
            [
                r["worker"],
                r["state"],
                r["instance_type"] or "-",
                r["lifecycle"] or "-",
                r["job_id"] or "-",
                r["attempt"] or "-",
                "-" if r["slot"] is None else r["slot"],
                f"{r['seen_seconds_ago']:.0f}s ago",
                r["reason"] or "-",
            ]
            for r in rows
        ],
    )
