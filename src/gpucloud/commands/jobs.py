"""``gpucloud submit``, ``gpucloud jobs`` and ``gpucloud job show``: the job queue from the shell."""

from __future__ import annotations

import time
from typing import Any

import click

from gpucloud.commands.options import queue_option
from gpucloud.errors import UserError
from gpucloud.output import output_option, plain_markup, print_json, print_table, terminal_safe

_STATES = ("queued", "running", "finished", "failed", "cancelled")


def _when(epoch: float | None) -> str:
    """Local time of ``epoch``; a time no calendar holds (a row edited to 1e308, NaN) shown as a number."""
    if epoch is None:
        return ""
    try:
        return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(epoch))
    except (OverflowError, ValueError, OSError):
        return f"{epoch!r} (not a time)"


def _clock(epoch: float) -> str:
    """``HH:MM:SS.mmm`` local time, for the timeline; as ``_when`` for a time no calendar holds."""
    try:
        return time.strftime("%H:%M:%S", time.localtime(epoch)) + f".{int(epoch % 1 * 1000):03d}"
    except (OverflowError, ValueError, OSError):
        return _when(epoch)


def _parse_env(pairs: tuple[str, ...]) -> dict[str, str]:
    env: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key or not key.replace("_", "a").isalnum() or key[0].isdigit():
            raise UserError(f"--env {pair!r} is not NAME=VALUE with NAME made of letters, digits and '_'")
        env[key] = value
    return env


@click.command(
    "submit",
    context_settings={"allow_interspersed_args": False},
    epilog="""\b
Examples:
  gpucloud submit -- torchrun --standalone --nproc-per-node 8 train.py
  gpucloud submit --job-id llama-7b --gpus-per-node 8 --checkpoint-uri s3://ckpt/llama -- torchrun ... train.py
  gpucloud submit --nodes 4 --group p4d-spot --fallback-group p4d-od --fallback-after 10 -- torchrun ... train.py
  gpucloud submit --workdir . --setup "pip install -r requirements.txt" -- python train.py
  gpucloud worker          # on each node: take queued jobs and run them under spot-train
""",
)
@click.option("--job-id", help="Id for the job (letters, digits, '.', '_', '-'); default: generated.")
@click.option(
    "--name",
    help="A human name shown by `gpucloud jobs`; `job show/cancel/resume NAME` take it where an id goes "
    "(a name several jobs share is refused with the list of their ids).",
)
@queue_option()
@click.option(
    "--checkpoint-uri",
    metavar="URI",
    help="Durable checkpoint location every attempt can read: s3://bucket/prefix or a shared path (default: on a "
    "cluster's aws:// queue the cluster's bucket, resolved on the node; else $GPUCLOUD_HOME/checkpoints).",
)
@click.option(
    "--workdir",
    metavar="DIR",
    type=click.Path(file_okay=False, exists=True),
    help="Ship DIR with the job: a snapshot of it (.gitignore honoured, never .git/, named by its content hash so "
    "the same tree is stored once) goes next to the queue ($GPUCLOUD_HOME/code) or to the checkpoint bucket's "
    "code/ prefix, and each attempt runs the command in a verified copy of it on its node "
    "(default: no snapshot; the command runs in the worker's directory).",
)
@click.option(
    "--max-workdir-size",
    metavar="SIZE",
    default="100MiB",
    show_default=True,
    help="Largest --workdir content (uncompressed) to ship, e.g. 250MiB; past it submit names the biggest files.",
)
@click.option(
    "--setup",
    metavar="CMD",
    help="Shell command each node runs once before the job's command, in a virtualenv layered on the image's "
    "Python and torch and cached per node and requirements hash, e.g. 'pip install -r requirements.txt'.",
)
@click.option(
    "--env",
    "env_pairs",
    multiple=True,
    metavar="NAME=VALUE",
    help="Extra environment variable for the command (repeatable).",
)
@click.option("--nodes", type=click.IntRange(min=1), default=1, show_default=True, help="Nodes the job runs on.")
@click.option(
    "--gpus-per-node",
    type=click.IntRange(min=0),
    default=0,
    show_default=True,
    help="GPUs per node, for GPU-hour accounting (0 on CPU).",
)
@click.option(
    "--max-attempts",
    type=click.IntRange(min=1),
    default=3,
    show_default=True,
    help="Crashed attempts allowed before FAILED; spot stops never count.",
)
@click.option(
    "--group",
    metavar="NAME",
    help="Node group whose agents run the job (default: the stack's first group; node.env lists them in "
    "GPUCLOUD_NODE_GROUPS).",
)
@click.option(
    "--fallback-group",
    metavar="NAME",
    help="Another node group (on-demand, capacity block) that may also take the job once an attempt has waited "
    "--fallback-after minutes: a spot pool that took a whole gang rarely comes back at once.",
)
@click.option(
    "--fallback-after",
    metavar="MINUTES",
    help="Minutes an attempt waits in the queue before --fallback-group may take it (default: 10).",
)
@output_option()
@click.argument("command", nargs=-1, type=click.UNPROCESSED, metavar="-- COMMAND [ARGS]...")
def submit(
    job_id,
    name,
    queue_uri,
    checkpoint_uri,
    workdir,
    max_workdir_size,
    setup,
    env_pairs,
    nodes,
    gpus_per_node,
    max_attempts,
    group,
    fallback_group,
    fallback_after,
    output,
    command,
) -> None:
    """Queue COMMAND as a training job; `gpucloud worker` runs it under the spot supervisor."""
    from gpucloud.lifecycle.model import spec_from_flags
    from gpucloud.queue.locations import checkpoint_uri_to_submit, default_queue_uri, open_queue

    if not command:
        raise UserError("missing command after --; e.g. gpucloud submit -- torchrun --nproc-per-node 2 train.py")
    queue_uri = queue_uri or default_queue_uri()
    checkpoint_uri = checkpoint_uri_to_submit(checkpoint_uri, queue_uri=queue_uri, nodes=nodes)
    env = _parse_env(env_pairs)
    if setup is not None and not setup.strip():
        raise UserError("--setup is empty; give a shell command, e.g. --setup 'pip install -r requirements.txt'")
    spec = spec_from_flags(
        command=list(command),
        name=name,
        checkpoint_uri=checkpoint_uri,
        setup=setup,
        env=env,
        nodes=nodes,
        gpus_per_node=gpus_per_node,
        max_attempts=max_attempts,
    )
    queue = open_queue(queue_uri)
    groups = _job_groups(queue, group, fallback_group, fallback_after)
    # Every flag is checked before the snapshot is stored: a refused submit uploads nothing.
    shipped = _ship_workdir(workdir, max_workdir_size, checkpoint_uri=checkpoint_uri, queue_uri=queue_uri)
    code = shipped[0].model_dump() if shipped else None
    spec = spec_from_flags(**{**spec.model_dump(), **groups, "code": code})
    job = queue.submit(spec, job_id=job_id)
    if output == "json":
        print_json({**_job_row(job), "code_uploaded": shipped[1] if shipped else None})
    else:
        click.echo(f"submitted {job.id} to {queue.uri}")
        if shipped:
            code, uploaded = shipped
            click.echo(
                f"code {code.sha256[:12]}: {code.files} files, {_size(code.size_bytes)} from {workdir}, "
                f"{'uploaded to' if uploaded else 'already stored at'} {code.uri}"
            )


def _ship_workdir(workdir, max_size: str, *, checkpoint_uri: str | None, queue_uri: str):
    """Snapshot ``workdir`` and store it where the queue's nodes read it: (CodeRef, uploaded), or None."""
    if workdir is None:
        return None
    import tempfile
    from pathlib import Path

    from gpucloud.jobs.code.snapshot import build, parse_size
    from gpucloud.jobs.code.store import store
    from gpucloud.lifecycle.model import CodeRef

    limit = parse_size(max_size)
    with tempfile.TemporaryDirectory(prefix="gpucloud-snapshot-") as scratch:
        snapshot = build(Path(workdir), Path(scratch), limit=limit)
        stored = store(snapshot, checkpoint_uri=checkpoint_uri, queue_uri=queue_uri)
    ref = CodeRef(uri=stored.uri, sha256=snapshot.sha256, size_bytes=snapshot.size_bytes, files=snapshot.files)
    return ref, stored.uploaded


def _size(n: int) -> str:
    from gpucloud.jobs.code.snapshot import human_size

    return human_size(n)


def _job_groups(queue, group, fallback_group, fallback_after) -> dict[str, Any]:
    """The job's group fields, checked against the cluster's groups (node.env, else the agents' records)."""
    import dataclasses

    from gpucloud.agent.node_groups import NodeGroups, resolve_job_groups

    cluster = NodeGroups.from_env()
    wanted = group is not None or fallback_group is not None
    registered = frozenset(n.group for n in queue.nodes() if n.group) if wanted and not cluster.names else frozenset()
    return dataclasses.asdict(
        resolve_job_groups(group, fallback_group, fallback_after, cluster=cluster, registered=registered)
    )


def _job_row(job, cost=None) -> dict[str, Any]:
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


def _cost_fields(cost) -> dict[str, Any]:
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


def _money(value: float | None) -> str:
    return "?" if value is None else f"{value:,.2f}"


def _costs(histories) -> dict[str, Any]:
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
def jobs(queue_uri, states, output) -> None:
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
    from gpucloud.queue.locations import open_queue

    queue = open_queue(queue_uri)
    histories = queue.histories([JobState(s) for s in states] if states else None)
    found = [job for job, _, _ in histories]
    costs = _costs(histories)
    if output == "json":
        print_json([_job_row(j, costs[j.id]) for j in found])
        return
    print_table(
        f"jobs in {queue.uri}",
        ["id", "name", "state", "attempt", "step", "usd", "steps/s", "worker", "updated", "command"],
        [
            [
                j.id,
                j.spec.name or "",
                _state_text(j),
                j.attempt,
                j.last_step,
                _money(costs[j.id].cost_usd),
                _rate_text(j.step_rate),
                j.worker or "",
                _when(j.updated_at),
                " ".join(j.spec.command)[:60],
            ]
            for j in found
        ],
        markup=False,
    )


def _rate_text(rate: float | None) -> str:
    return "" if rate is None else f"{rate:.3g}"


def _progress_line(report) -> str:
    """e.g. "\nprogress: step 1234 at 2.51 steps/s (12:03:04)" while a step is known."""
    if report.last_step is None:
        return ""
    rate = f" at {_rate_text(report.step_rate)} steps/s" if report.step_rate is not None else ""
    when = f" ({_when(report.progress_at)})" if report.progress_at is not None else ""
    return f"\nprogress: step {report.last_step}{rate}{when}"


def _state_text(job) -> str:
    """The state as a table shows it: a running job that was cancelled is still saving its step."""
    return "cancelling" if job.cancel_requested_at is not None and not job.state.terminal else job.state.value


@click.group("job")
def job() -> None:
    """Inspect or control one job: show, logs, cancel, resume."""


@job.command(
    "cancel",
    epilog="""
Examples:
  gpucloud job cancel j-4f2a9c01de                # queued: never runs; running: saves a step, then stops
  gpucloud job cancel llama-7b --grace 300        # give a large model 5 minutes to save
  gpucloud job cancel j-4f2a9c01de --output json
""",
)
@click.argument("job_id", metavar="JOB")
@queue_option()
@click.option(
    "--grace",
    type=click.FloatRange(min=1.0, max=3600.0),
    default=None,
    metavar="SECONDS",
    help="How long a running attempt has to save its step before its ranks are stopped (default: 120).",
)
@output_option()
def cancel(job_id, queue_uri, grace, output) -> None:
    """Cancel JOB: it ends `cancelled` and is never requeued.

    A queued job is cancelled at once: it never runs, and the slots its gang held are released. A
    running job gets a stop request, as for a spot notice: every rank agrees on a step and saves it,
    then the attempt ends and the job is `cancelled` (its lease released; spot-train exits 130).
    Cancelling a cancelled job again changes nothing; a finished or failed job is refused.
    JOB is a job id or a unique `submit --name`.
    """
    from gpucloud.lifecycle.model import CANCEL_GRACE_S, JobState
    from gpucloud.queue.locations import open_queue
    from gpucloud.queue.names import resolve_job

    queue = open_queue(queue_uri)
    after = queue.cancel(resolve_job(queue, job_id).id, grace_seconds=CANCEL_GRACE_S if grace is None else grace)
    if output == "json":
        print_json(_job_row(after))
    elif after.state is JobState.CANCELLED:
        click.echo(f"cancelled {after.id}: {terminal_safe(after.reason or '')}")
    else:
        seconds = CANCEL_GRACE_S if grace is None else grace
        click.echo(
            f"cancelling {after.id}: attempt {after.attempt} saves a step and stops within {seconds:.0f} s, "
            f"then the job is cancelled (`gpucloud job show {after.id}` follows it)"
        )


@job.command("show")
@click.argument("job_id", metavar="JOB")
@queue_option()
@output_option()
def show(job_id, queue_uri, output) -> None:
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
    from gpucloud.jobs.report import build_report
    from gpucloud.queue.locations import open_queue
    from gpucloud.queue.names import resolve_job

    queue = open_queue(queue_uri)
    current = resolve_job(queue, job_id)
    report = build_report(current, queue.attempts(current.id), queue.events(current.id), prices=catalog_prices())
    spec = current.spec
    if output == "json":
        code = spec.code.model_dump() if spec.code is not None else None
        print_json({**report.model_dump(), "code": code, "setup": spec.setup})
        return
    render_report(report)
    if spec.code is not None:  # what `submit --workdir/--setup` shipped (docs/code-shipping.md)
        click.echo(
            f"code: {spec.code.sha256[:12]} ({spec.code.files} files, {_size(spec.code.size_bytes)}) at "
            + terminal_safe(spec.code.uri)
        )
    if spec.setup is not None:
        click.echo(f"setup: {terminal_safe(spec.setup)}")


@job.command(
    "logs",
    epilog="""\b
Examples:
  gpucloud job logs j-4f2a9c01de                  # every attempt's output, oldest first
  gpucloud job logs llama-7b --attempt 2          # the output of attempt 2 only
  gpucloud job logs llama-7b --follow             # stream the running attempt, then the next ones
""",
)
@click.argument("job_id", metavar="JOB")
@queue_option()
@click.option(
    "--attempt",
    type=click.IntRange(min=1),
    metavar="N",
    help="Only attempt N (default: every attempt, each under a '==> attempt N (state) <==' header).",
)
@click.option(
    "--follow",
    "-f",
    is_flag=True,
    help="Keep printing what the running attempt writes (and, without --attempt, the attempts after it) "
    "until the job ends.",
)
def logs(job_id, queue_uri, attempt, follow) -> None:
    """Print the output of JOB's attempts: the command's stdout and stderr (every rank torchrun
    started on each node), with the supervisor's own lines interleaved, marked `[gpucloud <UTC time>]`.

    Every attempt keeps its output, also one that was interrupted, lost or crashed: the supervisor
    writes it to $GPUCLOUD_HOME/logs/JOB/attempt-N.log on the node that ran it (in a gang, each
    line marked with its node) and, on a cluster, ships it to the checkpoint bucket every 30 s and
    when the attempt ends (s3://BUCKET/logs/JOB/attempt-N/), where this command reads it on an
    aws:// queue. JOB is a job id or a unique `submit --name`.
    """
    import sys

    from gpucloud.jobs.logs import show_logs
    from gpucloud.queue.locations import open_queue
    from gpucloud.queue.names import resolve_job

    queue = open_queue(queue_uri)
    current = resolve_job(queue, job_id)

    # The log file keeps the bytes as written; a terminal gets its control sequences shown, not run
    # (newlines, tabs and the carriage returns of progress bars pass).
    to_terminal = sys.stdout.isatty()

    def out(text: str) -> None:
        sys.stdout.write(terminal_safe(text, keep="\n\t\r") if to_terminal else text)
        sys.stdout.flush()

    try:
        notes = show_logs(queue, current, attempt=attempt, follow=follow, out=out)
    except KeyboardInterrupt:  # Ctrl-C ends --follow; the job goes on
        return
    for note in notes:
        click.echo(f"gpucloud: {terminal_safe(note)}", err=True)


def _checkpoints_line(report) -> str:
    """The durable tier the attempts used, as each resolved it on its node (absent before one started)."""
    used = list(dict.fromkeys(a.checkpoint_uri for a in report.attempts if a.checkpoint_uri))
    return f"\ncheckpoints: {', '.join(used)}" if used else ""


@job.command(
    "resume",
    epilog="""\b
Examples:
  gpucloud job resume j-4f2a9c01de                 # failed or cancelled: a new attempt, same id
  gpucloud job resume llama-7b --output json
""",
)
@click.argument("job_id", metavar="JOB")
@queue_option()
@output_option()
def resume(job_id, queue_uri, output) -> None:
    """Give a failed or cancelled JOB a new attempt, keeping its id: the attempt restores the job's
    newest committed checkpoint (<checkpoint-uri>/JOB/LATEST), and a worker or the agents run it.

    The crash count starts again (the job gets --max-attempts crashes anew). Refused, in one line,
    while the job is queued or running (it will run anyway: cancel it first to restart it), and for
    a finished job: its training loop ended, so there is nothing to resume; submit a new job to
    train further. JOB is a job id or a unique `submit --name`.
    """
    from gpucloud.lifecycle.model import resume_refusal
    from gpucloud.queue.locations import open_queue
    from gpucloud.queue.names import resolve_job
    from gpucloud.queue.protocol import NotResumable

    queue = open_queue(queue_uri)
    current = resolve_job(queue, job_id)
    why = resume_refusal(current)
    if why is not None:  # refused before the checkpoint store is read; the queue checks again
        raise NotResumable(current, why)
    step, unknown = _newest_committed(current)
    after = queue.resume(current.id, from_step=step)
    if output == "json":
        print_json({**_job_row(after), "from_step": step, "from_step_unknown": unknown})
        return
    if unknown:
        where = f"its newest committed checkpoint (not readable from here: {unknown})"
    elif step is None:
        where = "step 0: nothing of it was committed"
    else:
        where = f"step {step}, its newest committed checkpoint"
    click.echo(f"resumed {after.id}: attempt {after.attempt} is queued and restores {where}")


def _newest_committed(job) -> tuple[int | None, str | None]:
    """(the step the next attempt restores, None) or (None, why it cannot be read from here)."""
    from gpucloud.checkpoint.store import latest_committed
    from gpucloud.queue.locations import checkpoint_uri_for

    try:
        return latest_committed(checkpoint_uri_for(job.spec.checkpoint_uri), job.id), None
    except Exception as err:  # noqa: BLE001 - informational: the attempt's own restore decides
        return None, " ".join(str(err).split())[:160] or type(err).__name__


def _cancelling(report) -> bool:
    return getattr(report, "cancel_requested_at", None) is not None and report.state == "running"


def render_report(report) -> None:
    """The human form of a JobReport (also used by `gpucloud demo`)."""
    from rich.console import Console

    console = Console()
    console.print(
        f"[bold]job {plain_markup(report.job_id)}[/bold]: {plain_markup(report.state)}"
        + (" — cancel requested: saving a step, then cancelled" if _cancelling(report) else "")
        + (f" — {plain_markup(report.reason)}" if report.reason else "")
        + f"\ncommand: {plain_markup(' '.join(report.command))}"
        + plain_markup(_checkpoints_line(report))
        + _progress_line(report)
    )
    print_table(
        "attempts",
        ["#", "state", "node", "started", "wall s", "resumed step", "last step", "exit", "reason"],
        [
            [
                a.number,
                a.state,
                a.node,
                _when(a.started_at),
                a.wall_s,
                a.resumed_step,
                a.last_step,
                a.exit_code,
                a.reason,
            ]
            for a in report.attempts
        ],
        markup=False,
    )
    if report.interruptions:
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
                for i in report.interruptions
            ],
            markup=False,
        )
    print_table(
        "timeline",
        ["time", "attempt", "event", "detail"],
        [
            [
                _clock(e.at),
                e.attempt,
                e.kind,
                e.detail,
            ]
            for e in report.timeline
        ],
        markup=False,
    )
    console.print(
        f"steps lost: {report.steps_lost}   GPU-hours used: {report.gpu_hours_used}   lost: {report.gpu_hours_lost}"
        + (f"\n[dim]{report.gpu_note}[/dim]" if report.gpu_note else "")
    )
    if getattr(report, "cost", None) is not None:
        render_cost(report.cost, console)
    for warning in getattr(report, "warnings", []):  # e.g. an emergency save that could not fit
        console.print(f"warning: {terminal_safe(warning)}", markup=False, soft_wrap=True)


def render_cost(cost, console) -> None:
    """Dollars per attempt (one row each; its nodes in the last column) and the job's totals."""
    print_table(
        "cost (USD)",
        ["attempt", "usd", "lost usd", "on-demand usd", "price", "nodes"],
        [
            [
                a.attempt,
                _money(a.cost_usd),
                _money(a.cost_lost_usd),
                _money(a.on_demand_equivalent_usd),
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
        f", saved {_money(cost.savings_usd)} ({cost.savings_pct:.1f}%)"
        if cost.savings_usd is not None and cost.savings_pct is not None
        else ""
    )
    console.print(
        f"cost: {_money(cost.cost_usd)} USD   lost: {_money(cost.cost_lost_usd)}"
        f"\non-demand equivalent: {_money(cost.on_demand_equivalent_usd)}{saved}"
        f"\nprices: {', '.join(cost.price_sources) or 'none'}",
        markup=False,
    )
    for reason in cost.unknown_reasons:
        console.print(f"cost unknown: {terminal_safe(reason)}", markup=False, soft_wrap=True)


def _price_text(node) -> str:
    if node.usd_per_hour is None:
        return "?"
    return f"{node.usd_per_hour:.2f}/h {node.price_source}"
