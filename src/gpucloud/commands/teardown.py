"""``gpucloud teardown``: drain a stack's jobs, then destroy it through Pulumi's Automation API, for CI.

Thin: ``gpucloud.teardown.destroy`` holds the order and the decisions, ``teardown.drain`` the drain,
``infra.automation`` the pulumi CLI; this module resolves the flags, asks for confirmation and prints.
"""

from __future__ import annotations

import sys
from typing import Any

import click

from gpucloud.commands.options import QUEUE_HELP
from gpucloud.errors import UserError, error_line
from gpucloud.output import output_option, print_json, print_table
from gpucloud.teardown.drain import DEFAULT_DRAIN_TIMEOUT_S

EPILOG = """\b
Exit codes: 0 destroyed, nothing left; 1 the destroy failed or left resources (named);
2 refused before destroying anything (protected bucket, no --yes without a terminal, no pulumi CLI);
3 the drain timed out with jobs still running, nothing destroyed (--force destroys anyway);
130 answered no at the confirmation.
"""


@click.command("teardown", epilog=EPILOG)
@click.option("--stack", "-s", "stack", required=True, metavar="NAME", help="The deployed Pulumi stack to destroy.")
@click.option("--yes", "-y", is_flag=True, help="Do not ask for confirmation (CI). Without a terminal it is required.")
@click.option(
    "--no-drain",
    "no_drain",
    is_flag=True,
    help="Destroy without asking running jobs to save first (what they did since their last commit is lost).",
)
@click.option(
    "--drain-timeout",
    "drain_timeout",
    type=click.FloatRange(min=0.0, max=86400.0),
    default=DEFAULT_DRAIN_TIMEOUT_S,
    show_default=True,
    metavar="SECONDS",
    help="How long running jobs get to commit a step and stop (the node groups' default drain timeout).",
)
@click.option("--force", is_flag=True, help="Destroy even when the drain timed out with jobs still running.")
@click.option(
    "--keep-bucket",
    "keep_bucket",
    is_flag=True,
    help="Keep a protected checkpoint bucket (pulumi destroy --exclude-protected) and destroy the rest.",
)
@click.option("--queue", "queue_uri", metavar="URI", help="The queue to drain instead of the stack's. " + QUEUE_HELP)
@click.option("--region", metavar="R", help="The stack's AWS region (default: aws:region of stacks/Pulumi.NAME.yaml).")
@click.option(
    "--check-aws/--no-check-aws",
    "check_aws",
    default=True,
    show_default=True,
    help="After the destroy, list what AWS still holds tagged gpucloud:stack=NAME (a `gpucloud sweep` dry run).",
)
@output_option()
def teardown(
    stack: str,
    yes: bool,
    no_drain: bool,
    drain_timeout: float,
    force: bool,
    keep_bucket: bool,
    queue_uri: str | None,
    region: str | None,
    check_aws: bool,
    output: str,
) -> None:
    """Drain the stack's running jobs, then destroy the stack, and say what is left.

    \b
    1. Refuses at once when the checkpoint bucket is protected (unless --keep-bucket).
    2. Drain: every running job gets a stop request (as for a spot notice), saves a step and is
       requeued; teardown waits for each commit.
    3. Aborts the checkpoint bucket's unfinished multipart uploads (unless it is kept).
    4. `pulumi destroy --run-program` through the Automation API (needs the pulumi CLI), its progress
       streamed; the stack's FSx export (exportOnDestroy) runs inside it, before the association goes.
    5. Lists what the state still holds, and what AWS still holds tagged with the stack.
    The stack's job queue goes with it: the summary lists its unfinished jobs, their last committed
    step, and whether their checkpoints outlive the destroy (another bucket, or --keep-bucket).
    Progress goes to stderr; the summary (--output json: drain, export, leftovers, exit reason) to stdout.

    \b
    gpucloud teardown --stack ci-smoke-42 --yes               # what CI runs
    gpucloud teardown --stack dev --no-drain --keep-bucket     # keep the checkpoints
    """
    from gpucloud.infra import automation
    from gpucloud.teardown.destroy import EXIT_DONE, bucket_refusal, fsx_export_planned, run_teardown

    handle = automation.open_stack(stack)
    outputs = handle.outputs()
    refusal = bucket_refusal(stack, outputs, keep_bucket=keep_bucket)
    if refusal is not None:
        raise UserError(refusal)
    aws = _Aws(stack, region)
    queue = None if no_drain else _open_drain_queue(queue_uri, outputs, aws)
    own_queue = _OwnQueue(outputs, aws, queue if queue_uri is None else None)
    if not yes:
        _confirm(stack, handle.resources(), outputs, queue, own_queue, keep_bucket=keep_bucket)
    steps = _steps(
        stack, outputs, queue, own_queue, aws, drain_timeout=drain_timeout, keep_bucket=keep_bucket, check=check_aws
    )
    report = run_teardown(
        handle,
        steps,
        keep_bucket=keep_bucket,
        force=force,
        export=fsx_export_planned(outputs),
        progress=_progress,
        on_output=lambda line: click.echo(f"  {line.rstrip()}", err=True),
    )
    if output == "json":
        print_json(report.to_json())
    else:
        _print_summary(report)
    if report.exit_code != EXIT_DONE:
        raise UserError(report.exit_reason, exit_code=report.exit_code)


def _progress(line: str) -> None:
    click.echo(f"teardown: {line}", err=True)


class _Aws:
    """The stack's region and boto3 clients, resolved only when a step needs AWS."""

    def __init__(self, stack: str, region: str | None) -> None:
        self.stack, self._region = stack, region
        self._clients: dict[str, Any] = {}

    @property
    def region(self) -> str:
        if self._region is None:
            from gpucloud.spec import load_stack_file, stack_file_for

            try:
                self._region = load_stack_file(stack_file_for(self.stack)).region
            except UserError as err:
                raise UserError(f"cannot tell stack {self.stack}'s region ({err}); give --region") from None
        return self._region

    def client(self, service: str) -> Any:
        if service not in self._clients:
            import boto3

            self._clients[service] = boto3.session.Session(region_name=self.region).client(service)
        return self._clients[service]


def _open_drain_queue(queue_uri: str | None, outputs: dict[str, Any], aws: _Aws):
    from gpucloud.queue.connect import open_queue
    from gpucloud.teardown.destroy import queue_uri_from_outputs

    uri = queue_uri or queue_uri_from_outputs(outputs, aws.region)
    if uri is None:
        raise UserError("the stack has no jobTableName/jobQueueUrl outputs to drain; give --queue URI, or --no-drain")
    return open_queue(uri)


def _confirm(stack: str, resources, outputs: dict[str, Any], queue, own_queue: _OwnQueue, *, keep_bucket: bool) -> None:
    """Ask on the terminal, showing what goes; no terminal: refuse (CI must say --yes)."""
    if not sys.stdin.isatty():
        raise UserError(f"refusing to destroy stack {stack} without --yes: there is no terminal to confirm on")
    from gpucloud.lifecycle.model import JobState

    real = [r for r in resources if not r.bookkeeping]
    click.echo(f"Stack {stack}: {len(real)} resources will be destroyed, among them:", err=True)
    for kind in sorted({r.type for r in real})[:20]:
        click.echo(f"  {kind} x{sum(1 for r in real if r.type == kind)}", err=True)
    bucket = outputs.get("checkpointBucket")
    if bucket:
        kept = keep_bucket and outputs.get("checkpointBucketProtected")
        click.echo(
            f"  checkpoint bucket {bucket}: " + ("kept (protected)" if kept else "deleted, with every checkpoint"),
            err=True,
        )
    if queue is not None:
        running = queue.list_jobs([JobState.RUNNING])
        click.echo(f"  {len(running)} running job(s) will save a step and be requeued", err=True)
    if own_queue.exists:
        click.echo(
            "  the stack's job queue and table, with every unfinished job in them "
            "(the summary lists each, with where its checkpoints are)",
            err=True,
        )
    elif queue is not None:
        queued = queue.list_jobs([JobState.QUEUED])
        click.echo(f"  {len(queued)} queued job(s) stay queued in {queue.uri}", err=True)
    click.confirm(f"Destroy stack {stack}?", abort=True, err=True)


class _OwnQueue:
    """The stack's own job queue (from its outputs), which the destroy deletes: the drain's queue
    when that is the stack's, else opened when first listed; None where the stack has none."""

    def __init__(self, outputs: dict[str, Any], aws: _Aws, drained) -> None:
        self._outputs, self._aws, self._queue = outputs, aws, drained
        self.exists = drained is not None or bool(outputs.get("jobTableName") and outputs.get("jobQueueUrl"))

    def get(self):
        if self._queue is None:
            from gpucloud.queue.connect import open_queue
            from gpucloud.teardown.destroy import queue_uri_from_outputs

            uri = queue_uri_from_outputs(self._outputs, self._aws.region)
            self._queue = open_queue(uri) if uri else None
        return self._queue


def _steps(
    stack: str,
    outputs: dict[str, Any],
    queue,
    own_queue: _OwnQueue,
    aws: _Aws,
    *,
    drain_timeout: float,
    keep_bucket: bool,
    check: bool,
):
    from gpucloud.teardown.destroy import Steps
    from gpucloud.teardown.drain import drain

    drain_step = None
    if queue is not None:

        def drain_step():
            try:
                return drain(queue, stack, timeout_s=drain_timeout, progress=_progress)
            except UserError as err:  # e.g. the table of a half-destroyed stack is gone
                raise UserError(
                    f"cannot drain stack {stack}'s queue, nothing was destroyed: {err}; add --no-drain to destroy "
                    "without saving running jobs"
                ) from None

    bucket = outputs.get("checkpointBucket")
    abort_step = None
    if bucket and not outputs.get("checkpointBucketProtected"):

        def abort_step() -> int:
            return _abort_uploads(aws, str(bucket))

    leftovers_step = (lambda: _aws_leftovers(aws)) if check else None
    unfinished_step = None
    if own_queue.exists:
        kept = keep_bucket and bool(outputs.get("checkpointBucketProtected"))

        def unfinished_step():
            return _unfinished(own_queue, str(bucket) if bucket else None, bucket_kept=kept)

    return Steps(drain=drain_step, abort_uploads=abort_step, aws_leftovers=leftovers_step, unfinished=unfinished_step)


def _unfinished(own_queue: _OwnQueue, bucket: str | None, *, bucket_kept: bool):
    """The jobs the destroy takes with the stack's queue; None (and a line) where it cannot be read."""
    from botocore.exceptions import BotoCoreError, ClientError

    from gpucloud.teardown.unfinished import unfinished_jobs

    try:
        queue = own_queue.get()
        return None if queue is None else unfinished_jobs(queue, bucket=bucket, bucket_kept=bucket_kept)
    except (UserError, ClientError, BotoCoreError) as err:
        _progress(f"could not list the stack's unfinished jobs ({error_line(err)}); destroying anyway")
        return None


def _abort_uploads(aws: _Aws, bucket: str) -> int:
    """Unfinished multipart uploads: the provider's force_destroy empties versions, not uploads."""
    from botocore.exceptions import BotoCoreError, ClientError

    from gpucloud.teardown.delete import abort_multipart_uploads

    try:
        return abort_multipart_uploads(aws.client("s3"), bucket)
    except (ClientError, BotoCoreError) as err:
        _progress(f"could not list the bucket's unfinished uploads ({error_line(err)}); destroying anyway")
        return 0


def _aws_leftovers(aws: _Aws) -> list[dict[str, Any]] | None:
    import datetime as dt

    from botocore.exceptions import BotoCoreError, ClientError

    from gpucloud.teardown.plan import Selection
    from gpucloud.teardown.sweep import sweep

    _progress(f"checking what AWS still holds tagged gpucloud:stack={aws.stack} (a sweep dry run)")
    try:
        outcomes = sweep(
            aws.client,
            aws.region,
            Selection(stack=aws.stack),
            delete=False,
            now=dt.datetime.now(dt.timezone.utc),
            progress=lambda line: _progress(f"sweep: {line}"),
        )
    except (ClientError, BotoCoreError) as err:
        _progress(f"could not list what AWS holds ({error_line(err)}); not checked")
        return None
    return [o.to_json() for o in outcomes if o.action == "would delete"]


def _print_summary(report) -> None:
    drained = report.drain
    if drained is not None:
        rows = [
            (s.job_id, s.attempt, s.ended or "still running", s.committed_step, s.job_state) for s in drained.stopped
        ]
        if rows:
            print_table("drained jobs", ["job", "attempt", "ended", "committed step", "job now"], rows)
    if report.unfinished:
        rows = [
            (j.job_id, j.state, j.committed_step, j.checkpoint_uri or "", j.checkpoint.value) for j in report.unfinished
        ]
        print_table(
            "jobs destroyed with the stack's queue", ["job", "state", "committed step", "checkpoints", "they are"], rows
        )
    if report.export is not None:
        summary = report.export.to_json()
        click.echo(f"FSx export of {summary['file_system_id']}:{summary['path']}: {summary['result']}")
    left = [(r.type, r.id or "", r.urn) for r in report.leftovers]
    left += [(found["type"], found["arn"], "tagged in AWS") for found in report.aws_leftovers or []]
    if left:
        print_table(f"left over from stack {report.stack}", ["type", "id", "where"], left)
    click.echo(report.exit_reason)
