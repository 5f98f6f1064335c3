"""``gpucloud spot-train``: run a training command that survives spot interruptions."""

from __future__ import annotations

import re
import sys
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
                                                 # job llama-7b: new the first time, its next attempt after
  gpucloud spot-train --job-id llama-7b          # run the requeued job's next attempt on this node
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
    hint = interpreter_hint(data.get("reason")) if kind == "crash" else None
    if hint and hint not in _hints_given:  # once: every retry of the attempt crashes the same way
        _hints_given.add(hint)
        click.echo(f"gpucloud: {hint}", err=True)


# The training API's modules: a command that cannot import them runs in another Python than gpucloud's
# (the usual cause: the virtualenv was not activated, so `python` is the system's).
_MISSING_MODULE = re.compile(r"ModuleNotFoundError: No module named '(gpucloud|torch|torchdata)(?:[.'])")
_hints_given: set[str] = set()


def interpreter_hint(reason: object) -> str | None:
    """One line naming the interpreter problem behind a crash, or None when it is not one."""
    found = _MISSING_MODULE.search(reason) if isinstance(reason, str) else None
    if found is None:
        return None
    return (
        f"the command's Python has no module '{found.group(1)}': it is not the environment gpucloud runs in "
        f"({sys.prefix}); activate that (source {sys.prefix}/bin/activate) or start the command with {sys.executable}"
    )


@click.command(
    "spot-train",
    epilog=EPILOG,
    context_settings={"ignore_unknown_options": False, "allow_interspersed_args": False},
)
@click.option(
    "--job-id",
    help="The job to run: its next attempt if it exists (after a requeue), else a new job with this id (give its "
    "command after --). Default: a new job with a generated id.",
)
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
    from gpucloud.checkpoint.defaults import checkpoint_uri_to_submit
    from gpucloud.jobs.node import start_signal_hub
    from gpucloud.jobs.runner import supervise_job
    from gpucloud.lifecycle.model import spec_from_flags
    from gpucloud.queue.connect import default_queue_uri, open_queue
    from gpucloud.signals.imds import resolve_endpoint

    config = supervisor_config(ack_timeout=ack_timeout, stop_margin=stop_margin, kill_after=kill_after, grace=grace)
    endpoint = None if no_imds else resolve_endpoint(imds_endpoint)  # validate before recording anything
    queue_uri = queue_uri or default_queue_uri()
    # A new job: refuse a checkpoint location the next attempt could not read before anything is recorded.
    new_job_uri = checkpoint_uri_to_submit(checkpoint_uri, queue_uri=queue_uri, nodes=1) if job_id is None else None
    queue = open_queue(queue_uri, supervising=True)
    existing = _existing_job(queue, job_id, command)
    if existing is not None:  # the job's next attempt: the same command line again is fine
        _check_same_settings(
            existing,
            command,
            {
                "--checkpoint-uri": (checkpoint_uri, existing.spec.checkpoint_uri),
                "--max-attempts": (max_attempts, existing.spec.max_attempts),
                "--gpus-per-node": (gpus_per_node, existing.spec.gpus_per_node),
                "--name": (name, existing.spec.name),
            },
        )
    else:  # a new job, under --job-id when given (as `submit --job-id` does)
        if not command:
            raise UserError(
                "missing command after --; e.g. gpucloud spot-train -- torchrun --nproc-per-node 2 train.py"
            )
        if job_id is not None:
            new_job_uri = checkpoint_uri_to_submit(checkpoint_uri, queue_uri=queue_uri, nodes=1)
        spec = spec_from_flags(
            command=list(command),
            name=name,
            checkpoint_uri=new_job_uri,
            gpus_per_node=gpus_per_node or 0,
            max_attempts=max_attempts or 3,
            workdir=None,
        )
        job_id = queue.submit(spec, job_id=job_id).id
        click.echo(f"gpucloud: job {job_id} recorded in {queue.uri}", err=True)
    assert job_id is not None

    hub = start_signal_hub(imds_endpoint=endpoint, use_imds=not no_imds, poll_interval=poll_interval, grace=grace)
    try:
        result = supervise_job(
            queue,
            job_id,
            notices=hub,
            config=config,
            local_checkpoint_dir=local_checkpoint_dir,
            on_event=print_event,
            node=node_placement(endpoint),  # what the attempt is priced on (docs/cost.md)
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


def _existing_job(queue, job_id: str | None, command: tuple[str, ...]):
    """The job ``--job-id`` names, or None when a new job is to be recorded under it: a command after
    -- starts the job the first time and runs its next attempt afterwards."""
    from gpucloud.queue.protocol import UnknownJob

    if job_id is None:
        return None
    try:
        return queue.get(job_id)
    except UnknownJob as err:
        if command:
            return None
        raise UserError(
            f"{err}; to start it, give its command: gpucloud spot-train --job-id {job_id} -- COMMAND"
        ) from None


def _check_same_settings(job, command: tuple[str, ...], given: dict[str, tuple[Any, Any]]) -> None:
    """An existing job keeps what it was submitted with: flags that differ from it are refused."""
    if command and list(command) != job.spec.command:
        raise UserError(
            f"job {job.id} runs `{' '.join(job.spec.command)}`; omit the command after -- or pass the same one"
        )
    differing = {flag: pair for flag, pair in given.items() if pair[0] is not None and pair[0] != pair[1]}
    if differing:
        asked = ", ".join(f"{flag} {value}" for flag, (value, _) in differing.items())
        kept = ", ".join(f"{flag} {job_value}" for flag, (_, job_value) in differing.items())
        raise UserError(
            f"{asked} only apply to new jobs; job {job.id} keeps the settings it was submitted with ({kept})"
        )


def job_summary(queue, job_id: str) -> dict[str, Any]:
    from gpucloud.cost.timeline import build_timeline

    job = queue.get(job_id)
    report = build_timeline(job, queue.attempts(job_id), queue.events(job_id))
    return {
        "job_id": job.id,
        "state": job.state.value,
        "attempt": job.attempt,
        "attempts": len(report.attempts),
        "steps_lost": report.steps_lost,
        "reason": job.reason,
        "interruptions": [i.model_dump() for i in report.interruptions],
    }


def node_placement(endpoint: str | None, *, worker: str | None = None) -> dict[str, Any] | None:
    """The node an attempt runs on (instance type, AZ, region, life cycle) from IMDS, recorded on
    its started/exit events so ``job show`` can price it; None off EC2 (``--no-imds``, no answer)."""
    from gpucloud.agent.identity import discover

    if endpoint is None:
        return None
    me = discover(endpoint, give_up_early=True)
    if me.instance_id is None:
        return None
    return {**me.placement(), "worker": worker or me.worker}
