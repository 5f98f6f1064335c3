"""Export an FSx for Lustre data repository association's files to S3 before the association goes.

Deleting a data repository association (DRA) only unlinks the file system from the bucket
(https://docs.aws.amazon.com/fsx/latest/APIReference/API_DeleteDataRepositoryAssociation.html);
nothing is exported on the way out, and the file system is deleted right after it in a destroy.
Automatic export runs behind the writes (AgeOfOldestQueuedMessage), so the last checkpoint a job
wrote may not be in the bucket yet. AWS's advice before deleting an S3-linked file system: wait for
that metric to be zero, or run an export data repository task, with automatic export turned off
first, because "automatic export and export data repository tasks cannot run at the same time"
(https://docs.aws.amazon.com/fsx/latest/LustreGuide/delete-file-system.html,
https://docs.aws.amazon.com/fsx/latest/LustreGuide/export-changed-data-meta-dra.html).

So, in order: turn the DRA's automatic export off (UpdateDataRepositoryAssociation), wait until the
DRA is AVAILABLE again, create an EXPORT_TO_REPOSITORY task for the DRA's path
(CreateDataRepositoryTask; "paths ... relative to the mount point": ``/checkpoints`` -> ``checkpoints``,
https://docs.aws.amazon.com/fsx/latest/APIReference/API_CreateDataRepositoryTask.html) and follow it
(DescribeDataRepositoryTasks) until SUCCEEDED. FAILED, CANCELED or the timeout: ``FsxExportError``.

The stack runs this as a Pulumi ``before_delete`` resource hook on the DRA (``export_hook``), so
``pulumi destroy --run-program`` (Automation API: ``destroy(run_program=True)``) exports first; a
failed export fails the DRA's delete and nothing after it is deleted.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Mapping
from typing import Any

import pulumi

from gpucloud.errors import UserError

EXPORT_TIMEOUT_S = 3600.0  # an hour: tasks move "up to hundreds of GB/s"; a checkpoint is GBs to TBs
POLL_S = 15.0
FINISHED = {"SUCCEEDED", "FAILED", "CANCELED"}


class FsxExportError(UserError):
    """The export before deletion did not finish; the association and its file system stay."""


@dataclasses.dataclass(frozen=True)
class ExportProgress:
    task_id: str
    lifecycle: str  # PENDING | EXECUTING | SUCCEEDED | FAILED | CANCELED | CANCELING
    total: int | None  # files the task found to export (None until FSx reports it)
    succeeded: int | None
    failed: int | None

    def line(self) -> str:
        counts = "" if self.total is None else f" {self.succeeded or 0}/{self.total} files"
        failed = f", {self.failed} failed" if self.failed else ""
        return f"fsx export: {self.task_id} {self.lifecycle}{counts}{failed}"


def task_path(file_system_path: str) -> str:
    """The DRA's file system path as an export task wants it: relative to the mount point."""
    return file_system_path.strip("/")


def export_before_delete(
    fsx: Any,
    *,
    file_system_id: str,
    association_id: str,
    file_system_path: str,
    timeout_s: float = EXPORT_TIMEOUT_S,
    poll_s: float = POLL_S,
    on_progress: Callable[[ExportProgress], None] | None = None,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> ExportProgress:
    """Export the association's files to its bucket and wait for the task; ``fsx`` is a boto3 FSx client.
    Returns the task's last progress, SUCCEEDED."""
    deadline = clock() + timeout_s
    _stop_automatic_export(fsx, association_id, deadline, poll_s, sleep, clock)
    created = fsx.create_data_repository_task(
        Type="EXPORT_TO_REPOSITORY",
        FileSystemId=file_system_id,
        Paths=[task_path(file_system_path)],
        Report={"Enabled": False},  # required; the bucket would get a report object per export
    )["DataRepositoryTask"]
    task_id = created["TaskId"]
    while True:
        task = fsx.describe_data_repository_tasks(TaskIds=[task_id])["DataRepositoryTasks"][0]
        progress = _progress(task)
        if on_progress is not None:
            on_progress(progress)
        if progress.lifecycle == "SUCCEEDED":
            return progress
        if progress.lifecycle in FINISHED:
            reason = (task.get("FailureDetails") or {}).get("Message") or "no reason given"
            raise FsxExportError(
                f"FSx export {task_id} of {file_system_id}:{file_system_path} ended {progress.lifecycle}: {reason} "
                f"(the association and file system were kept; see the task in the FSx console)"
            )
        if clock() >= deadline:
            raise FsxExportError(
                f"FSx export {task_id} of {file_system_id}:{file_system_path} still {progress.lifecycle} "
                f"after {timeout_s:.0f} s (the association and file system were kept; the task goes on)"
            )
        sleep(poll_s)


def _stop_automatic_export(
    fsx: Any,
    association_id: str,
    deadline: float,
    poll_s: float,
    sleep: Callable[[float], None],
    clock: Callable[[], float],
) -> None:
    association = _association(fsx, association_id)
    s3 = association.get("S3") or {}
    if (s3.get("AutoExportPolicy") or {}).get("Events"):
        # automatic import stays as it is: only export competes with the task
        fsx.update_data_repository_association(AssociationId=association_id, S3={"AutoExportPolicy": {"Events": []}})
        association = _association(fsx, association_id)
    while association["Lifecycle"] != "AVAILABLE":
        if association["Lifecycle"] in ("FAILED", "MISCONFIGURED", "DELETING"):
            reason = (association.get("FailureDetails") or {}).get("Message") or "no reason given"
            raise FsxExportError(
                f"FSx data repository association {association_id} is {association['Lifecycle']} ({reason}); "
                "cannot export before deletion"
            )
        if clock() >= deadline:
            raise FsxExportError(
                f"FSx data repository association {association_id} still {association['Lifecycle']} "
                "after turning automatic export off; nothing was exported"
            )
        sleep(poll_s)
        association = _association(fsx, association_id)


def _association(fsx: Any, association_id: str) -> dict[str, Any]:
    found = fsx.describe_data_repository_associations(AssociationIds=[association_id])["Associations"]
    return dict(found[0])


def _progress(task: Mapping[str, Any]) -> ExportProgress:
    status = task.get("Status") or {}
    return ExportProgress(
        task_id=task["TaskId"],
        lifecycle=task["Lifecycle"],
        total=status.get("TotalCount"),
        succeeded=status.get("SucceededCount"),
        failed=status.get("FailedCount"),
    )


HOOK_NAME = "gpucloud-fsx-export-before-delete"


def hook_function(
    region: str, client_factory: Callable[[str], Any] | None = None
) -> Callable[[pulumi.ResourceHookArgs], None]:
    """What the engine calls before it deletes the DRA: export, printing progress as engine log lines.
    The DRA's state gives the ids (``old_outputs``: fileSystemId, associationId, fileSystemPath)."""

    def run(args: pulumi.ResourceHookArgs) -> None:
        state = dict(args.old_outputs or {})
        fsx = (client_factory or _boto3_fsx)(region)
        result = export_before_delete(
            fsx,
            file_system_id=state["fileSystemId"],
            association_id=state.get("associationId") or args.id,
            file_system_path=state["fileSystemPath"],
            on_progress=lambda p: pulumi.log.info(p.line()),
        )
        pulumi.log.info(f"fsx export: {result.task_id} done, {result.succeeded or 0} files exported")

    return run


def export_hook(name: str, region: str) -> pulumi.ResourceHook:
    """The named hook (delete hooks must be named: the engine finds them again at destroy time)."""
    return pulumi.ResourceHook(f"{name}-{HOOK_NAME}", hook_function(region))


def _boto3_fsx(region: str) -> Any:
    import boto3

    return boto3.client("fsx", region_name=region)
