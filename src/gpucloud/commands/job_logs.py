"""``gpucloud job logs``: what a job's attempts printed, each attempt's output kept."""

from __future__ import annotations

import click

from gpucloud.commands.options import queue_option
from gpucloud.output import terminal_safe


@click.command(
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
def logs(job_id: str, queue_uri: str | None, attempt: int | None, follow: bool) -> None:
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
    from gpucloud.queue.connect import open_queue
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
