"""``gpucloud spot-train``: run a training command that survives spot interruptions."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import click

from gpucloud.commands.options import queue_option
from gpucloud.errors import UserError
from gpucloud.output import output_option, print_json, print_table

EPILOG = """\b
Examples:
  gpucloud spot-train -- torchrun --standalone --nproc-per-node 8 train.py
  gpucloud spot-train --job-id llama-7b --checkpoint-uri /fsx/ckpt -- torchrun ... train.py
  gpucloud spot-train --job-id llama-7b          # resume a requeued job on this node
  gpucloud spot-train --imds-endpoint http://127.0.0.1:1338 -- python train.py   (with the emulator)

\b
The command gets GPUCLOUD_JOB_ID, GPUCLOUD_ATTEMPT, GPUCLOUD_CHECKPOINT_URI, GPUCLOUD_CONTROL_DIR
(and GPUCLOUD_LOCAL_CHECKPOINT_DIR) in its environment; gpucloud.checkpoint.TrainingSession reads them.
Its stdout and stderr go to this command's stderr, so --output json stays clean.

\b
Exit codes: 0 finished; 75 checkpointed and requeued (run the job again, e.g. with `gpucloud worker`);
other non-zero: failed (the reason is on the job: `gpucloud job show ID`).
"""


def supervisor_options(func: Callable[..., Any]) -> Callable[..., Any]:
    """Options shared by every command that supervises attempts (spot-train, worker)."""
    options = [
        queue_option(),
        click.option(
            "--imds-endpoint",
            metavar="URL",
            help="EC2 metadata endpoint (default: $AWS_EC2_METADATA_SERVICE_ENDPOINT or http://169.254.169.254).",
        ),
        click.option(
            "--no-imds", is_flag=True, help="Do not poll IMDS (off EC2); only SIGTERM/SIGINT count as notices."
        ),
        click.option(
            "--poll-interval",
            type=click.FloatRange(min=0.05),
            default=1.0,
            show_default=True,
            help="Seconds between IMDS polls.",
        ),
        click.option(
            "--grace",
            type=click.FloatRange(min=1.0),
            default=30.0,
            show_default=True,
            help="Deadline, in seconds, given by a SIGTERM/SIGINT to spot-train.",
        ),
        click.option(
            "--ack-timeout",
            type=click.FloatRange(min=0.1),
            default=30.0,
            show_default=True,
            help="Seconds to wait for the ranks to acknowledge the stop flag before signalling them (never past the deadline).",
        ),
        click.option(
            "--stop-margin",
            type=click.FloatRange(min=0.0),
            default=5.0,
            show_default=True,
            help="Seconds before the notice deadline by which the checkpoint must be committed.",
        ),
        click.option(
            "--kill-after",
            type=click.FloatRange(min=0.1),
            default=10.0,
            show_default=True,
            help="Seconds between SIGTERM and SIGKILL when the group must be stopped.",
        ),
        click.option(
            "--local-checkpoint-dir",
            type=click.Path(file_okay=False),
            help="Node-local fast checkpoint tier (NVMe); default: durable tier only.",
        ),
    ]
    for option in reversed(options):
        func = option(func)
    return func


def supervisor_config(*, ack_timeout: float, stop_margin: float, kill_after: float, grace: float):
    from gpucloud.jobs.supervisor import SupervisorConfig

    if stop_margin >= grace:
        raise UserError(f"--stop-margin ({stop_margin:g}s) must be smaller than --grace ({grace:g}s)")
    return SupervisorConfig(ack_timeout=ack_timeout, stop_margin=stop_margin, kill_after=kill_after)


def print_event(kind: str, data: dict[str, Any]) -> None:
    from gpucloud.jobs.node import describe_event

    line = describe_event(kind, data)
    if line:
        click.echo(f"gpucloud: {line}", err=True)


@click.command(
    "spot-train",
    epilog=EPILOG,
    context_settings={"ignore_unknown_options": False, "allow_interspersed_args": False},
)
@click.option("--job-id", help="Run this queued job (e.g. after a requeue); without it a new job is recorded.")
@click.option("--name", help="A human name for a new job.")
@click.option(
    "--checkpoint-uri",
    metavar="URI",
    help="Durable checkpoint location for a new job that every attempt can read: s3://bucket/prefix, a shared path "
    "or file:// (default: on a cluster node the cluster's bucket; else $GPUCLOUD_HOME/checkpoints).",
)
@click.option(
    "--max-attempts",
    type=click.IntRange(min=1),
    help="Crashed attempts allowed before the job is FAILED (new jobs; default 3). Spot stops never count.",
)
@click.option(
    "--gpus-per-node",
    type=click.IntRange(min=0),
    help="GPUs per node, for GPU-hour accounting (new jobs; default 0 = CPU).",
)
@supervisor_options
@output_option()
@click.argument("command", nargs=-1, type=click.UNPROCESSED, metavar="-- COMMAND [ARGS]...")
def spot_train(
    job_id: str | None,
    name: str | None,
    checkpoint_uri: str | None,
    max_attempts: int | None,
    gpus_per_node: int | None,
    queue_uri: str | None,
    imds_endpoint: str | None,
    no_imds: bool,
    poll_interval: float,
    grace: float,
    ack_timeout: float,
    stop_margin: float,
    kill_after: float,
    local_checkpoint_dir: str | None,
    output: str,
    command: tuple[str, ...],
) -> int:
    """Run COMMAND under the spot supervisor: on an interruption notice every rank saves the same
    step, the checkpoint is committed, the job is requeued exactly once, and spot-train exits 75.

    A command that ignores the training API still gets SIGTERM (then SIGKILL) before the deadline.
    Crashes are retried here from the last committed checkpoint until --max-attempts attempts crashed.
    """
    from gpucloud.jobs.model import spec_from_flags
    from gpucloud.jobs.node import start_signal_hub
    from gpucloud.jobs.runner import supervise_job
    from gpucloud.queue.locations import checkpoint_uri_to_submit, default_queue_uri, open_queue
    from gpucloud.signals.imds import resolve_endpoint

    config = supervisor_config(ack_timeout=ack_timeout, stop_margin=stop_margin, kill_after=kill_after, grace=grace)
    endpoint = None if no_imds else resolve_endpoint(imds_endpoint)  # validate before recording anything
    queue_uri = queue_uri or default_queue_uri()
    if job_id is None:  # a new job: refuse a checkpoint location the next attempt could not read
        checkpoint_uri = checkpoint_uri_to_submit(checkpoint_uri, queue_uri=queue_uri, nodes=1)
    queue = open_queue(queue_uri, supervising=True)
    if job_id is not None:
        job = queue.get(job_id)
        given = {
            "--checkpoint-uri": checkpoint_uri,
            "--max-attempts": max_attempts,
            "--gpus-per-node": gpus_per_node,
            "--name": name,
        }
        clashing = [flag for flag, value in given.items() if value is not None]
        if clashing:
            raise UserError(
                f"{', '.join(clashing)} only apply to new jobs; job {job_id} keeps the settings it was submitted with"
            )
        if command and list(command) != job.spec.command:
            raise UserError(
                f"job {job_id} runs `{' '.join(job.spec.command)}`; omit the command after -- or pass the same one"
            )
    else:
        if not command:
            raise UserError(
                "missing command after --; e.g. gpucloud spot-train -- torchrun --nproc-per-node 2 train.py"
            )
        spec = spec_from_flags(
            command=list(command),
            name=name,
            checkpoint_uri=checkpoint_uri,
            gpus_per_node=gpus_per_node or 0,
            max_attempts=max_attempts or 3,
            workdir=None,
        )
        job_id = queue.submit(spec).id
        click.echo(f"gpucloud: job {job_id} recorded in {queue.uri}", err=True)

    hub = start_signal_hub(imds_endpoint=endpoint, use_imds=not no_imds, poll_interval=poll_interval, grace=grace)
    try:
        result = supervise_job(
            queue,
            job_id,
            notices=hub,
            config=config,
            local_checkpoint_dir=local_checkpoint_dir,
            on_event=print_event,
        )
    finally:
        hub.stop()
    summary = job_summary(queue, result.job.id)
    summary["exit_code"] = result.exit_code
    if output == "json":
        print_json(summary)
    else:
        print_table(
            f"job {summary['job_id']}",
            ["state", "attempts", "steps lost", "exit code", "reason"],
            [
                [
                    summary["state"],
                    summary["attempts"],
                    summary["steps_lost"],
                    summary["exit_code"],
                    summary["reason"] or "",
                ]
            ],
        )
    queue.close()
    return result.exit_code


def job_summary(queue, job_id: str) -> dict[str, Any]:
    from gpucloud.jobs.report import build_report

    job = queue.get(job_id)
    report = build_report(job, queue.attempts(job_id), queue.events(job_id))
    return {
        "job_id": job.id,
        "state": job.state.value,
        "attempt": job.attempt,
        "attempts": len(report.attempts),
        "steps_lost": report.steps_lost,
        "reason": job.reason,
        "interruptions": [i.model_dump() for i in report.interruptions],
    }
