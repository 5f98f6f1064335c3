"""``gpucloud teardown``'s decisions and order: refuse early, drain, export, destroy, then count what is left.

The I/O is handed in (``Steps``: the drain, the bucket's unfinished uploads, the AWS listing), and
the stack is a ``StackHandle``, so every decision here is tested offline with a fake
handle and real queues. Exit codes (``EXIT_*``) are part of the CLI contract (docs/teardown.md).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

from gpucloud.infra.automation import StackHandle, StackOperationFailed, StackResource
from gpucloud.teardown.drain import DrainResult
from gpucloud.teardown.unfinished import CheckpointFate, UnfinishedJob

EXIT_DONE = 0  # destroyed; nothing left in the state nor (when checked) tagged in AWS
EXIT_LEFT_OVER = 1  # the destroy failed, or resources are left: they are named
EXIT_REFUSED = 2  # refused before destroying anything (UserError): protected bucket, no --yes, no pulumi CLI
EXIT_DRAIN_TIMEOUT = 3  # jobs still running when the drain timed out; nothing destroyed (--force destroys anyway)

PROTECT_SETTING = "storage.checkpointBucket.protect"
MAX_NAMED = 5  # leftovers named in the one-line error; the JSON and the table list them all


@dataclasses.dataclass(frozen=True)
class Steps:
    """What the teardown runs besides the destroy; None: skipped (``--no-drain``, a kept bucket, ``--no-check-aws``)."""

    drain: Callable[[], DrainResult] | None = None
    abort_uploads: Callable[[], int] | None = None  # unfinished multipart uploads aborted
    aws_leftovers: Callable[[], list[dict[str, Any]] | None] | None = None  # tagged in AWS; None: could not list
    # the jobs the stack's queue still holds, which the destroy deletes with it; None: could not list
    unfinished: Callable[[], list[UnfinishedJob] | None] | None = None


@dataclasses.dataclass
class TeardownReport:
    stack: str
    keep_bucket: bool = False
    drain: DrainResult | None = None
    export: FsxExport | None = None
    uploads_aborted: int | None = None
    unfinished: list[UnfinishedJob] | None = None  # None: not listed
    destroyed: bool = False
    destroy_error: str | None = None
    kept: list[StackResource] = dataclasses.field(default_factory=list)
    leftovers: list[StackResource] = dataclasses.field(default_factory=list)
    aws_leftovers: list[dict[str, Any]] | None = None  # None: not checked
    exit_code: int = EXIT_DONE
    exit_reason: str = ""

    def to_json(self) -> dict[str, Any]:
        return {
            "stack": self.stack,
            "drain": self.drain.to_json() if self.drain is not None else None,
            "fsx_export": self.export.to_json() if self.export is not None else None,
            "multipart_uploads_aborted": self.uploads_aborted,
            "unfinished_jobs": [j.to_json() for j in self.unfinished] if self.unfinished is not None else None,
            "destroyed": self.destroyed,
            "destroy_error": self.destroy_error,
            "kept": [_resource_json(r) for r in self.kept],
            "leftovers": [_resource_json(r) for r in self.leftovers],
            "aws_leftovers": self.aws_leftovers,
            "exit_code": self.exit_code,
            "exit_reason": self.exit_reason,
        }


def _resource_json(resource: StackResource) -> dict[str, Any]:
    return {"urn": resource.urn, "type": resource.type, "id": resource.id}


def bucket_refusal(stack: str, outputs: Mapping[str, Any], *, keep_bucket: bool) -> str | None:
    """Why the teardown must not start: the checkpoint bucket is protected and --keep-bucket was not given.

    A protected bucket (``protect: true``) makes ``pulumi destroy`` fail on it after it has deleted
    everything else; refusing first leaves the cluster whole and says how to proceed."""
    if keep_bucket or not outputs.get("checkpointBucketProtected"):
        return None
    bucket = outputs.get("checkpointBucket") or "the checkpoint bucket"
    return (
        f"stack {stack}'s checkpoint bucket {bucket} is protected ({PROTECT_SETTING}: true): to delete it with its "
        f"checkpoints, set {PROTECT_SETTING}: false in stacks/Pulumi.{stack}.yaml and run `pulumi up --stack {stack}` "
        f"(unprotects it and lets the destroy empty it), then teardown again; or add --keep-bucket to destroy "
        f"everything else and keep the bucket"
    )


@dataclasses.dataclass
class FsxExport:
    """The FSx export before deletion, as the destroy's output shows it.

    The export is the stack's own ``before_delete`` hook on the data repository association
    (``infra/fsx_export.py``): the engine runs it inside the destroy (``run_program``), and a failed
    export fails the association's delete, so the file system stays. Here it is only followed: the
    hook's ``fsx export: ...`` lines are picked out of the destroy's output."""

    file_system_id: str
    path: str
    export_path: str
    lines: list[str] = dataclasses.field(default_factory=list)
    succeeded: bool = False

    def follow(self, line: str) -> bool:
        """Whether ``line`` is the hook's (it is then kept)."""
        if EXPORT_LINE not in line:
            return False
        text = line[line.index(EXPORT_LINE) :].strip()
        self.lines.append(text)
        self.succeeded = self.succeeded or " done, " in text
        return True

    def to_json(self) -> dict[str, Any]:
        return {
            "file_system_id": self.file_system_id,
            "path": self.path,
            "export_path": self.export_path,
            "via": "before_delete hook on the data repository association",
            "result": "exported" if self.succeeded else "not finished (see destroy_error)",
            "progress": self.lines,
        }


EXPORT_LINE = "fsx export: "  # how the hook's progress lines begin (infra/fsx_export.py)


def fsx_export_planned(outputs: Mapping[str, Any]) -> FsxExport | None:
    """The export the destroy will run, from the stack's ``fsx`` output (None: no FSx, or exportOnDestroy off)."""
    fsx = outputs.get("fsx")
    if isinstance(fsx, Mapping) and fsx.get("exportOnDestroy") and fsx.get("dataRepositoryAssociationId"):
        return FsxExport(
            file_system_id=str(fsx.get("fileSystemId")),
            path=str(fsx.get("fileSystemPath") or "/"),
            export_path=str(fsx.get("exportPath") or "its bucket"),
        )
    return None


def queue_uri_from_outputs(outputs: Mapping[str, Any], region: str) -> str | None:
    """The cluster's job queue as an ``aws://`` URI, from the stack outputs (None: the stack has none)."""
    table, url = outputs.get("jobTableName"), outputs.get("jobQueueUrl")
    if not table or not url:
        return None
    from gpucloud.queue.aws.uri import AwsQueueAddress

    return AwsQueueAddress(region=region, table=str(table), queue_url=str(url)).uri


def what_remains(
    resources: list[StackResource], *, keep_bucket: bool
) -> tuple[list[StackResource], list[StackResource]]:
    """(kept, leftovers) of the state after a destroy: with --keep-bucket the protected resources
    (the bucket and its settings) stay by request, and so do the components they belong to;
    anything else but the stack and its providers is left over."""
    real = [r for r in resources if not r.bookkeeping]
    protected = [r for r in real if keep_bucket and r.protected]
    # a URN's type part names the parents' types: ...::gpucloud:storage:CheckpointStore$aws:s3/...::name
    parent_types = {t for r in protected for t in _type_chain(r.urn)[:-1]}
    kept = [r for r in real if r in protected or (keep_bucket and r.type in parent_types)]
    return kept, [r for r in real if r not in kept]


def _type_chain(urn: str) -> list[str]:
    parts = urn.split("::")
    return parts[2].split("$") if len(parts) >= 4 else []


def run_teardown(
    handle: StackHandle,
    steps: Steps,
    *,
    keep_bucket: bool = False,
    force: bool = False,
    export: FsxExport | None = None,
    progress: Callable[[str], None] = lambda line: None,
    on_output: Callable[[str], None] | None = None,
) -> TeardownReport:
    """Drain, export, destroy, and look at what is left; the report says how it ended.

    A drain that timed out stops here (a report with ``EXIT_DRAIN_TIMEOUT``, nothing destroyed) unless
    ``force``: a destroy would take the nodes of jobs that have not committed. Refusals that need no drain
    (the protected bucket) are the caller's to check before it asks for confirmation."""
    report = TeardownReport(stack=handle.name, keep_bucket=keep_bucket)
    if steps.drain is not None:
        progress("draining: stop requests to every running job, then waiting for their commits")
        report.drain = steps.drain()
        if report.drain.queued:
            progress(f"left queued: {', '.join(report.drain.queued)}")
        if report.drain.timed_out:
            late = ", ".join(s.job_id for s in report.drain.still_running)
            if not force:
                report.exit_code = EXIT_DRAIN_TIMEOUT
                report.exit_reason = (
                    f"drain timed out with jobs still running ({late}); nothing was destroyed: wait and run teardown "
                    f"again, raise --drain-timeout, or add --force to destroy anyway (their work since their last "
                    f"commit is lost)"
                )
                return report
            progress(f"--force: destroying with jobs still running ({late})")
    else:
        progress("--no-drain: running jobs are not asked to save; what they did since their last commit is lost")
    if steps.abort_uploads is not None:
        report.uploads_aborted = steps.abort_uploads()
        if report.uploads_aborted:
            progress(f"aborted {report.uploads_aborted} unfinished multipart upload(s) in the checkpoint bucket")
    if steps.unfinished is not None:
        report.unfinished = steps.unfinished()
        if report.unfinished:
            progress(unfinished_line(report.unfinished))
    report.export = export
    if export is not None:
        progress(
            f"FSx: exporting {export.file_system_id}:{export.path} to {export.export_path} before deletion "
            "(the stack's before_delete hook, inside the destroy)"
        )
    printed = on_output or progress

    def destroy_output(line: str) -> None:
        if export is not None and export.follow(line):
            progress(line[line.index(EXPORT_LINE) :].strip())
        else:
            printed(line)

    progress(f"destroying stack {handle.name}" + (" (keeping protected resources)" if keep_bucket else ""))
    try:
        # run_program: always; resource hooks need it, and it is harmless without one
        handle.destroy(on_output=destroy_output, exclude_protected=keep_bucket, run_program=True)
        report.destroyed = True
    except StackOperationFailed as err:
        report.destroy_error = str(err)
        progress(f"destroy failed: {err}")
    report.kept, report.leftovers = what_remains(handle.resources(), keep_bucket=keep_bucket)
    if steps.aws_leftovers is not None:
        kept_ids = {r.id for r in report.kept if r.id}
        tagged = steps.aws_leftovers()
        if tagged is not None:
            report.aws_leftovers = [found for found in tagged if not any(i in found["arn"] for i in kept_ids)]
    report.exit_code, report.exit_reason = verdict(report)
    return report


def unfinished_line(jobs: list[UnfinishedJob]) -> str:
    """What the destroy takes with the stack's queue, in one line."""
    survive = sum(1 for j in jobs if j.checkpoint in (CheckpointFate.KEPT, CheckpointFate.OUTSIDE))
    return (
        f"the stack's job queue and table go with it, and {len(jobs)} unfinished job(s) with them "
        f"({', '.join(j.job_id for j in jobs[:MAX_NAMED])}{' ...' if len(jobs) > MAX_NAMED else ''}); "
        f"the checkpoints of {survive} outlive the destroy (the summary lists each)"
    )


def verdict(report: TeardownReport) -> tuple[int, str]:
    """The exit code and the one line that says why."""
    named = [f"{r.type} {r.id or r.urn}" for r in report.leftovers]
    named += [f"{found['type']} {found['arn']}" for found in report.aws_leftovers or []]
    listed = ", ".join(named[:MAX_NAMED]) + (f" and {len(named) - MAX_NAMED} more" if len(named) > MAX_NAMED else "")
    if report.destroy_error is not None:
        left = f"; {len(named)} resource(s) left: {listed}" if named else ""
        return EXIT_LEFT_OVER, f"destroy of stack {report.stack} failed: {report.destroy_error}{left}"
    if named:
        return EXIT_LEFT_OVER, (
            f"stack {report.stack} destroyed with {len(named)} resource(s) left: {listed} "
            f"(`gpucloud sweep --stack {report.stack} --region REGION --delete` deletes tagged ones)"
        )
    kept = f"; kept: {', '.join(str(r.id or r.urn) for r in report.kept)}" if report.kept else ""
    return EXIT_DONE, f"stack {report.stack} destroyed; nothing left{kept}"
