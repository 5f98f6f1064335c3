"""``gpucloud job cancel`` and ``gpucloud job resume``: end a job for good, or give an ended one
a new attempt."""

from __future__ import annotations

from typing import TYPE_CHECKING

import click

from gpucloud.commands.job_format import job_row
from gpucloud.commands.options import queue_option
from gpucloud.output import output_option, print_json, terminal_safe

if TYPE_CHECKING:
    from gpucloud.lifecycle.model import Job


@click.command(
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
def cancel(job_id: str, queue_uri: str | None, grace: float | None, output: str) -> None:
    """Cancel JOB: it ends `cancelled` and is never requeued.

    A queued job is cancelled at once: it never runs, and the slots its gang held are released. A
    running job gets a stop request, as for a spot notice: every rank agrees on a step and saves it,
    then the attempt ends and the job is `cancelled` (its lease released; spot-train exits 130).
    Cancelling a cancelled job again changes nothing; a finished or failed job is refused.
    JOB is a job id or a unique `submit --name`.
    """
    from gpucloud.lifecycle.model import CANCEL_GRACE_S, JobState
    from gpucloud.queue.connect import open_queue
    from gpucloud.queue.names import resolve_job

    queue = open_queue(queue_uri)
    after = queue.cancel(resolve_job(queue, job_id).id, grace_seconds=CANCEL_GRACE_S if grace is None else grace)
    if output == "json":
        print_json(job_row(after))
    elif after.state is JobState.CANCELLED:
        click.echo(f"cancelled {after.id}: {terminal_safe(after.reason or '')}")
    else:
        seconds = CANCEL_GRACE_S if grace is None else grace
        click.echo(
            f"cancelling {after.id}: attempt {after.attempt} saves a step and stops within {seconds:.0f} s, "
            f"then the job is cancelled (`gpucloud job show {after.id}` follows it)"
        )


@click.command(
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
def resume(job_id: str, queue_uri: str | None, output: str) -> None:
    """Give a failed or cancelled JOB a new attempt, keeping its id: the attempt restores the job's
    newest committed checkpoint (<checkpoint-uri>/JOB/LATEST), and a worker or the agents run it.

    The crash count starts again (the job gets --max-attempts crashes anew). Refused, in one line,
    while the job is queued or running (it will run anyway: cancel it first to restart it), and for
    a finished job: its training loop ended, so there is nothing to resume; submit a new job to
    train further. JOB is a job id or a unique `submit --name`.
    """
    from gpucloud.lifecycle.model import resume_refusal
    from gpucloud.queue.connect import open_queue
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
        print_json({**job_row(after), "from_step": step, "from_step_unknown": unknown})
        return
    if unknown:
        where = f"its newest committed checkpoint (not readable from here: {unknown})"
    elif step is None:
        where = "step 0: nothing of it was committed"
    else:
        where = f"step {step}, its newest committed checkpoint"
    click.echo(f"resumed {after.id}: attempt {after.attempt} is queued and restores {where}")


def _newest_committed(job: Job) -> tuple[int | None, str | None]:
    """(the step the next attempt restores, None) or (None, why it cannot be read from here)."""
    from gpucloud.checkpoint.defaults import checkpoint_uri_for
    from gpucloud.checkpoint.store import latest_committed

    try:
        return latest_committed(checkpoint_uri_for(job.spec.checkpoint_uri), job.id), None
    except Exception as err:  # noqa: BLE001 - informational: the attempt's own restore decides
        return None, " ".join(str(err).split())[:160] or type(err).__name__
