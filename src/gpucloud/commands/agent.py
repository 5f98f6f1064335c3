"""``gpucloud agent``: the node agent (a systemd service on every cluster node)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from gpucloud.commands.spot_train import print_event, supervisor_config, supervisor_options
from gpucloud.output import json_line, output_option, print_table

if TYPE_CHECKING:
    from gpucloud.agent.loop import AgentSummary
    from gpucloud.signals.hub import SignalHub

EPILOG = """\b
Examples:
  gpucloud agent                                   # on a cluster node (the bootstrap's service)
  gpucloud agent --no-imds --idle-exit 60 -o json  # offline: run queued jobs, exit when idle
  gpucloud agent --imds-endpoint http://127.0.0.1:1338 --address 127.0.0.1 \\
      --run-dir /tmp/node-a                        # one of several "nodes" on one machine
\b
A job of N nodes (`gpucloud submit --nodes N`) runs on N agents at once: each claims a slot
(slot = node rank), waits for the gang, and runs the job's command under torchrun with
--nnodes N --node-rank SLOT and a static rendezvous on slot 0's address (--rendezvous-port).
A torchrun command is extended (its --standalone is dropped); any other command is started by
torchrun --no-python with --nproc-per-node = the job's --gpus-per-node (at least 1).
\b
A spot notice on any member stops every rank of the gang at the same step; the checkpoint is
committed, the job is requeued once as attempt k+1, the noticed agent exits 75, and the other
members claim slots of k+1 with a standby node. On an Auto Scaling group member (instance id
from IMDS, group from DescribeAutoScalingInstances) the agent also holds scale-in protection
while busy, asks for its replacement at the notice, completes the termination lifecycle action
after the commit, publishes the backlog metric and scales itself in when idle
(GPUCLOUD_SCALE_IN=1, GPUCLOUD_IDLE_MINUTES). Off EC2 those steps are skipped.
\b
Queue mode (--events-queue, set on cluster nodes): every agent also consumes the cluster's
events queue (EventBridge spot warnings, rebalance recommendations, ASG terminate lifecycle
actions). For a noticed node whose agent is dead, the agent that receives the event asks the
gang to stop through the job table (the survivors save the same step; the attempt is requeued,
not counted as a crash), marks the dead agent stopped, asks for the node's replacement, and
completes its lifecycle action once the attempt ended.
\b
Metrics: the agent serves Prometheus' /metrics on --metrics-port (default 9401, beside
dcgm-exporter's 9400) at --metrics-address (default: every interface on an EC2 instance, where
the security group admits the monitor only; 127.0.0.1 off EC2). --metrics-port 0 takes any free
port; the first status line (`"event": "metrics"` with -o json) names the URL. --no-metrics: none.
Another process on the default port: a warning, and the agent runs on without /metrics.
After a stop notice the agent does its work first (commit, requeue, lifecycle action, summary
line), then keeps /metrics up for --metrics-linger seconds (default 30: two 15 s scrapes; never
past the notice's deadline) so Prometheus sees the notice and the save; SIGTERM ends the wait.
The EFA devices' counters (gpucloud_efa_*) are read from /sys/class/infiniband at each scrape.
What it serves: docs/monitoring.md.
\b
Exit codes: 0 idle exit or --exit-after-attempts reached; 75 stopped by an interruption notice.
"""


@click.command("agent", epilog=EPILOG)
@supervisor_options
@click.option(
    "--address",
    metavar="IP",
    help="Private address gang members reach this node on (default: IMDS local-ipv4; 127.0.0.1 with --no-imds).",
)
@click.option(
    "--rendezvous-port",
    type=click.IntRange(1, 65535),
    default=29500,
    show_default=True,
    help="TCP port of the rendezvous store on slot 0's node.",
)
@click.option(
    "--slot-lease",
    type=click.FloatRange(min=1.0),
    default=30.0,
    show_default=True,
    help="Seconds a member may miss renewing its slot before the gang counts it lost.",
)
@click.option(
    "--gang-timeout",
    type=click.FloatRange(min=1.0),
    default=300.0,
    show_default=True,
    help="Seconds to wait for the rest of a gang before giving the slot back.",
)
@click.option(
    "--idle-exit",
    type=click.FloatRange(min=0.0),
    metavar="SECONDS",
    help="Exit after this long with nothing to claim (default: run until stopped).",
)
@click.option(
    "--exit-after-attempts",
    "exit_after_attempts",
    type=click.IntRange(min=1),
    metavar="N",
    help="Exit after running this many attempts (default: run until stopped).",
)
@click.option(
    "--run-dir",
    type=click.Path(file_okay=False, path_type=Path),
    help="This node's per-attempt control directories (default: $GPUCLOUD_HOME/run).",
)
@click.option(
    "--events-queue",
    "events_queue",
    metavar="URL",
    envvar="GPUCLOUD_EVENTS_QUEUE_URL",
    show_envvar=True,
    help="The cluster's events queue (the stack's eventsQueueUrl; node.env sets it). Consumed in the "
    "background so a noticed node whose agent died is still handled. Default: off.",
)
@click.option(
    "--metrics-port",
    type=click.IntRange(0, 65535),
    envvar="GPUCLOUD_METRICS_PORT",
    show_envvar=True,
    help="TCP port of /metrics (0: any free port, printed at start). Default 9401; if another process "
    "holds it the agent warns and runs without /metrics, while a port given here must be free.",
)
@click.option(
    "--metrics-address",
    metavar="IP",
    help="Address /metrics listens on (default: 0.0.0.0 on an EC2 instance, 127.0.0.1 off EC2).",
)
@click.option("--no-metrics", is_flag=True, help="Serve no /metrics.")
@click.option(
    "--metrics-linger",
    type=click.FloatRange(min=0.0),
    default=30.0,  # gpucloud.agent.metrics.DEFAULT_LINGER_SECONDS (not imported: `gpucloud --help` stays light)
    show_default=True,
    metavar="SECONDS",
    envvar="GPUCLOUD_METRICS_LINGER",
    show_envvar=True,
    help="After a stop notice, keep /metrics up this long once the attempt is saved and requeued (at most "
    "until the notice's deadline), so the notice is scraped. 0: exit at once. Not after SIGTERM.",
)
@click.option(  # the EFA counters' sysfs root: tests point it at a fixture tree
    "--sysfs-root", type=click.Path(file_okay=False, path_type=Path), default="/sys", hidden=True
)
@output_option()
def agent(
    queue_uri,
    imds_endpoint,
    no_imds,
    poll_interval,
    grace,
    ack_timeout,
    stop_margin,
    kill_after,
    local_checkpoint_dir,
    address,
    rendezvous_port,
    slot_lease,
    gang_timeout,
    idle_exit,
    exit_after_attempts,
    run_dir,
    events_queue,
    metrics_port,
    metrics_address,
    no_metrics,
    metrics_linger,
    sysfs_root,
    output,
) -> int:
    """Run this node's share of queued jobs: claim a gang slot, wait for the gang, run the attempt
    under the spot supervisor, repeat. Status changes are printed as they happen (JSON Lines with
    --output json: one status object per change, then the summary)."""
    from gpucloud.agent.asg_hooks import OfflineHooks, hooks_for
    from gpucloud.agent.identity import NodeLabels, discover
    from gpucloud.agent.loop import Agent, AgentOptions
    from gpucloud.agent.metrics import NodeMetrics, default_address, linger_seconds, serve
    from gpucloud.agent.node_groups import NodeGroups
    from gpucloud.jobs.node import start_signal_hub
    from gpucloud.queue.connect import open_queue
    from gpucloud.signals.imds import resolve_endpoint

    config = supervisor_config(ack_timeout=ack_timeout, stop_margin=stop_margin, kill_after=kill_after, grace=grace)
    options = AgentOptions(
        slot_lease=slot_lease,
        gang_timeout=gang_timeout,
        poll_interval=poll_interval,
        idle_exit=idle_exit,
        max_attempts=exit_after_attempts,
        rendezvous_port=rendezvous_port,
        local_checkpoint_dir=local_checkpoint_dir,
        run_root=run_dir,
        groups=NodeGroups.from_env(),  # GPUCLOUD_NODE_GROUP(S) from node.env: claims and counts per group
    )
    endpoint = None if no_imds else resolve_endpoint(imds_endpoint)
    identity = discover(endpoint, address=address)
    queue = open_queue(queue_uri, supervising=True)
    hooks = hooks_for(identity.instance_id) if endpoint is not None else OfflineHooks()
    hub = start_signal_hub(
        imds_endpoint=endpoint, use_imds=endpoint is not None, poll_interval=poll_interval, grace=grace
    )
    status = _json_line if output == "json" else _human_line
    metrics = NodeMetrics(NodeLabels.of(identity, options.groups.own))
    watcher = server = None
    try:
        if events_queue:
            from gpucloud.agent.events_handler import watch_events_queue

            watcher = watch_events_queue(events_queue, queue, hooks, node_lease=slot_lease, worker=identity.worker)
        if not no_metrics:  # after every other option is known good: a refused one prints no URL first
            server, why_not = serve(
                metrics, address=metrics_address or default_address(identity), port=metrics_port, sysfs=sysfs_root
            )
            if server is None:
                click.echo(f"gpucloud: warning: {why_not}", err=True)
            else:
                status({"event": "metrics", "worker": identity.worker, "url": server.url, "port": server.port})
        node_agent = Agent(
            queue, identity, hub, hooks, config, options, status=status, on_event=print_event, metrics=metrics
        )
        summary = node_agent.run()
        linger = linger_seconds(metrics_linger, node_agent.stop_notice, time.time()) if server else 0.0
        if linger > 0:  # said before the summary, which stays the last line (JSON Lines: _json_line)
            status({"event": "metrics-linger", "worker": identity.worker, "seconds": round(linger, 1)})
        _print_summary(summary, output)
        if linger > 0:
            _linger(hub, linger)
    finally:
        if server is not None:
            server.close()
        if watcher is not None:
            watcher.stop()
        hub.stop()
        queue.close()
    return summary.exit_code


def _print_summary(summary: AgentSummary, output: str) -> None:
    ran = [
        {
            "job_id": r.job_id,
            "attempt": r.attempt,
            "slot": r.slot,
            "nodes": r.nodes,
            "state": r.state,
            "exit_code": r.exit_code,
        }
        for r in summary.ran
    ]
    if output == "json":
        _json_line(
            {
                "event": "summary",
                "worker": summary.worker,
                "ran": ran,
                "stopped_by": summary.stopped_by,
                "exit_code": summary.exit_code,
            }
        )
    else:
        print_table(
            f"agent {summary.worker}",
            ["job", "attempt", "slot", "nodes", "ended", "exit code"],
            [[r["job_id"], r["attempt"], f"{r['slot']}", r["nodes"], r["state"], r["exit_code"]] for r in ran],
        )


def _linger(hub: SignalHub, seconds: float) -> None:
    """Wait ``seconds`` with /metrics still served (the caller's ``finally`` closes it), or until
    SIGTERM/SIGINT, which the still-running hub turns into a notice."""
    end = time.monotonic() + seconds
    while (left := end - time.monotonic()) > 0:
        notice = hub.get(left)
        if notice is not None and notice.kind == "sigterm":
            return


def _json_line(status: dict[str, Any]) -> None:
    """JSON Lines: every status change, then the summary (``"event": "summary"``)."""
    click.echo(json_line({"event": "status", **status} if "event" not in status else status))


def _human_line(status: dict[str, Any]) -> None:
    if status.get("event") == "metrics":
        click.echo(f"gpucloud: agent {status['worker']} serves metrics on {status['url']}", err=True)
        return
    if status.get("event") == "metrics-linger":
        click.echo(
            f"gpucloud: agent {status['worker']} keeps /metrics up {status['seconds']:g}s for a last scrape", err=True
        )
        return
    where = f" {status['job_id']} attempt {status['attempt']} slot {status['slot']}" if status.get("job_id") else ""
    extra = "".join(
        f", {k}: {v}" for k, v in status.items() if k not in ("worker", "state", "job_id", "attempt", "slot", "at")
    )
    click.echo(f"gpucloud: agent {status['worker']} {status['state']}{where}{extra}", err=True)
