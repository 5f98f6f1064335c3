"""``gpucloud worker``: take queued jobs and run each under the spot supervisor (in this process)."""

from __future__ import annotations

import time

import click

from gpucloud.commands.spot_train import print_event, supervisor_config, supervisor_options
from gpucloud.output import output_option, print_json, print_table

IDLE_POLL_S = 1.0


@click.command(
    "worker",
    epilog="""\b
Examples:
  gpucloud worker                          # run jobs until stopped (SIGTERM = a spot notice)
  gpucloud worker --once                   # run one job if one is queued, then exit
  gpucloud worker --max-jobs 5 --idle-exit 300
""",
)
@supervisor_options
@click.option(
    "--once",
    is_flag=True,
    help="Run at most one job, then exit with its spot-train exit code: 0 finished (or nothing was queued), "
    "75 requeued, 130 cancelled, other non-zero failed.",
)
@click.option("--max-jobs", type=click.IntRange(min=1), help="Exit after running this many jobs.")
@click.option(
    "--idle-exit", type=click.FloatRange(min=0.0), metavar="SECONDS", help="Exit after this long with nothing to claim."
)
@output_option()
def worker(
    queue_uri,
    imds_endpoint,
    no_imds,
    poll_interval,
    grace,
    ack_timeout,
    stop_margin,
    kill_after,
    local_checkpoint_dir,
    once,
    max_jobs,
    idle_exit,
    output,
) -> int:
    """Claim queued single-node jobs one at a time (atomic claim with a renewed lease, so a dead worker's job
    becomes claimable again) and supervise each exactly as `gpucloud spot-train` does.

    Jobs submitted with more than one node are left in the queue for the node agents
    (`gpucloud agent`), which form their gang; the worker logs each one it skips.

    After a stop notice the worker requeues the job and exits 75: the node is going away. With
    --once it exits as `spot-train --job-id` would for the job it ran (a failed job: non-zero).
    """
    from gpucloud.commands.spot_train import node_placement
    from gpucloud.jobs.node import start_signal_hub
    from gpucloud.jobs.runner import claim_single_node_job, default_worker_id, supervise_job
    from gpucloud.queue.connect import open_queue
    from gpucloud.signals.imds import resolve_endpoint

    config = supervisor_config(ack_timeout=ack_timeout, stop_margin=stop_margin, kill_after=kill_after, grace=grace)
    endpoint = None if no_imds else resolve_endpoint(imds_endpoint)
    queue = open_queue(queue_uri, supervising=True)
    try:
        _refuse_node_groups(queue)
    except BaseException:
        queue.close()
        raise
    me = default_worker_id()
    limit = 1 if once else max_jobs
    ran: list[dict] = []
    exit_code = 0
    skipped: set[tuple[str, int]] = set()

    def skip_gang(job) -> None:
        if (job.id, job.attempt) not in skipped:  # once per attempt, not on every poll
            skipped.add((job.id, job.attempt))
            click.echo(
                f"gpucloud: worker {me} skips job {job.id}: it needs a gang of {job.spec.nodes} nodes, "
                "which `gpucloud agent` runs (a worker runs single-node jobs only)",
                err=True,
            )

    hub = start_signal_hub(imds_endpoint=endpoint, use_imds=not no_imds, poll_interval=poll_interval, grace=grace)
    placement = node_placement(endpoint, worker=me)
    try:
        idle_since = time.monotonic()
        while limit is None or len(ran) < limit:
            notice = hub.get(timeout=0)  # a stop notice between jobs: take no more work
            if notice is not None and notice.is_stop:
                click.echo(f"gpucloud: {notice.kind} notice; worker {me} takes no more jobs", err=True)
                break
            job = claim_single_node_job(
                queue, me, lease_seconds=config.lease_seconds, node=me.split(":")[0], on_skip=skip_gang
            )
            if job is None:
                if once or (idle_exit is not None and time.monotonic() - idle_since >= idle_exit):
                    break
                # Nothing to claim: wait for the next poll of the queue, waking early for a stop notice.
                notice = hub.get(timeout=IDLE_POLL_S)
                if notice is not None and notice.is_stop:
                    click.echo(f"gpucloud: {notice.kind} notice; worker {me} takes no more jobs", err=True)
                    break
                continue
            click.echo(f"gpucloud: worker {me} runs job {job.id} attempt {job.attempt}", err=True)
            result = supervise_job(
                queue,
                job.id,
                worker=me,
                notices=hub,
                config=config,
                local_checkpoint_dir=local_checkpoint_dir,
                on_event=print_event,
                claimed=job,
                node=placement,  # what the attempt is priced on (docs/cost.md)
            )
            ran.append({"job_id": job.id, "state": result.job.state.value, "exit_code": result.exit_code})
            idle_since = time.monotonic()
            if result.node_stopping:
                exit_code = result.exit_code
                break
    finally:
        hub.stop()
        queue.close()
    if once and ran and exit_code == 0:  # one job: its outcome is the worker's, as for spot-train --job-id
        exit_code = ran[0]["exit_code"]
    if output == "json":
        print_json({"worker": me, "jobs": ran, "exit_code": exit_code})
    elif ran:
        print_table(
            f"worker {me}", ["job", "state", "exit code"], [[r["job_id"], r["state"], r["exit_code"]] for r in ran]
        )
    else:
        click.echo(f"gpucloud: worker {me}: no queued jobs", err=True)
    return exit_code


def _refuse_node_groups(queue) -> None:
    """A worker claims any single-node job: it cannot keep a job to its node group (``--group``) or
    wait out a ``--fallback-after``. On a cluster node, or on a queue whose agents serve node
    groups, that would run a job on the wrong hardware, so it is refused; the agent honours groups."""
    from gpucloud.agent.node_groups import GROUP_ENV, NodeGroups
    from gpucloud.errors import UserError

    own = NodeGroups.from_env().own
    registered = sorted({n.group for n in queue.nodes() if n.group})
    if own or registered:
        where = (
            f"this node is in node group {own!r} ({GROUP_ENV})"
            if own
            else (f"this queue's agents serve node groups ({', '.join(registered)})")
        )
        raise UserError(
            f"gpucloud worker takes any group's jobs and {where}; run `gpucloud agent`, which takes only "
            "its group's jobs (and fallbacks once due)"
        )
