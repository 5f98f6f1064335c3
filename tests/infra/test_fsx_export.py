"""The FSx export before deletion, against botocore's real FSx model (Stubber: every request and
response is checked against it): automatic export off first, an EXPORT_TO_REPOSITORY task for the
association's path, followed to SUCCEEDED; FAILED, CANCELED, a broken association and the timeout
are one-line errors. Also the Pulumi hook function the stack binds to the association."""

from __future__ import annotations

import datetime as dt
from typing import Any

import botocore.session
import pulumi
import pytest
from botocore.stub import Stubber
from tests.signals.helpers import FakeClock

from gpucloud.errors import UserError
from gpucloud.infra.fsx_export import (
    ExportProgress,
    FsxExportError,
    export_before_delete,
    hook_function,
    task_path,
)

FS = "fs-0123456789abcdef0"
DRA = "dra-0123456789abcdef0"
TASK = "task-0123456789abcdef0"
NOW = dt.datetime(2026, 11, 24, 12, 0, tzinfo=dt.UTC)
AUTO_EXPORT = {"Events": ["NEW", "CHANGED", "DELETED"]}


def fsx_client() -> Any:
    return botocore.session.get_session().create_client(
        "fsx", region_name="us-east-1", aws_access_key_id="x", aws_secret_access_key="y"
    )


def association(lifecycle: str, auto_export: dict | None = AUTO_EXPORT, failure: str | None = None) -> dict:
    s3: dict[str, Any] = {"AutoImportPolicy": {"Events": ["NEW", "CHANGED", "DELETED"]}}
    if auto_export is not None:
        s3["AutoExportPolicy"] = auto_export
    found: dict[str, Any] = {
        "AssociationId": DRA,
        "FileSystemId": FS,
        "Lifecycle": lifecycle,
        "FileSystemPath": "/checkpoints",
        "DataRepositoryPath": "s3://bucket/checkpoints/",
        "S3": s3,
    }
    if failure is not None:
        found["FailureDetails"] = {"Message": failure}
    return {"Associations": [found]}


def task(lifecycle: str, total: int | None = None, done: int | None = None, failure: str | None = None) -> dict:
    found: dict[str, Any] = {
        "TaskId": TASK,
        "Lifecycle": lifecycle,
        "Type": "EXPORT_TO_REPOSITORY",
        "CreationTime": NOW,
        "FileSystemId": FS,
        "Paths": ["checkpoints"],
    }
    if total is not None:
        found["Status"] = {"TotalCount": total, "SucceededCount": done or 0, "FailedCount": 0}
    if failure is not None:
        found["FailureDetails"] = {"Message": failure}
    return found


DESCRIBE_DRA = {"AssociationIds": [DRA]}
CREATE = {
    "Type": "EXPORT_TO_REPOSITORY",
    "FileSystemId": FS,
    "Paths": ["checkpoints"],
    "Report": {"Enabled": False},
}
TURN_OFF = {"AssociationId": DRA, "S3": {"AutoExportPolicy": {"Events": []}}}


def queue_until_task_created(stub: Stubber, *, auto_export: dict | None = AUTO_EXPORT) -> None:
    stub.add_response("describe_data_repository_associations", association("AVAILABLE", auto_export), DESCRIBE_DRA)
    if auto_export is not None and auto_export.get("Events"):
        stub.add_response("update_data_repository_association", {}, TURN_OFF)
        stub.add_response("describe_data_repository_associations", association("UPDATING", None), DESCRIBE_DRA)
        stub.add_response("describe_data_repository_associations", association("AVAILABLE", None), DESCRIBE_DRA)
    stub.add_response("create_data_repository_task", {"DataRepositoryTask": task("PENDING")}, CREATE)


def run_export(client: Any, clock: FakeClock, progress: list[ExportProgress] | None = None, timeout_s: float = 3600):
    return export_before_delete(
        client,
        file_system_id=FS,
        association_id=DRA,
        file_system_path="/checkpoints",
        timeout_s=timeout_s,
        poll_s=15,
        on_progress=None if progress is None else progress.append,
        sleep=clock.sleep,
        clock=clock,
    )


def test_the_export_turns_automatic_export_off_then_exports_the_link_path_and_waits_for_it() -> None:
    client, clock, progress = fsx_client(), FakeClock(start=0.0), []
    with Stubber(client) as stub:
        queue_until_task_created(stub)
        described = {"TaskIds": [TASK]}
        stub.add_response("describe_data_repository_tasks", {"DataRepositoryTasks": [task("PENDING")]}, described)
        stub.add_response(
            "describe_data_repository_tasks", {"DataRepositoryTasks": [task("EXECUTING", 40, 10)]}, described
        )
        stub.add_response(
            "describe_data_repository_tasks", {"DataRepositoryTasks": [task("SUCCEEDED", 40, 40)]}, described
        )
        result = run_export(client, clock, progress)
        stub.assert_no_pending_responses()
    assert (result.task_id, result.lifecycle, result.succeeded, result.total) == (TASK, "SUCCEEDED", 40, 40)
    assert [p.line() for p in progress] == [
        f"fsx export: {TASK} PENDING",
        f"fsx export: {TASK} EXECUTING 10/40 files",
        f"fsx export: {TASK} SUCCEEDED 40/40 files",
    ]
    assert clock.slept == [15, 15, 15]  # once for the association's update, twice between task polls


def test_automatic_export_already_off_is_left_alone() -> None:
    client, clock = fsx_client(), FakeClock(start=0.0)
    with Stubber(client) as stub:  # an update call here would find no queued response and fail
        queue_until_task_created(stub, auto_export={"Events": []})
        stub.add_response(
            "describe_data_repository_tasks", {"DataRepositoryTasks": [task("SUCCEEDED", 1, 1)]}, {"TaskIds": [TASK]}
        )
        assert run_export(client, clock).lifecycle == "SUCCEEDED"
        stub.assert_no_pending_responses()


@pytest.mark.parametrize("lifecycle", ["FAILED", "CANCELED"])
def test_a_task_that_does_not_succeed_is_a_one_line_error_naming_it(lifecycle: str) -> None:
    client, clock = fsx_client(), FakeClock(start=0.0)
    with Stubber(client) as stub:
        queue_until_task_created(stub)
        finished = task(lifecycle, 3, 1, failure="1 of 3 files failed to export: AccessDenied")
        stub.add_response("describe_data_repository_tasks", {"DataRepositoryTasks": [finished]}, {"TaskIds": [TASK]})
        with pytest.raises(FsxExportError) as raised:
            run_export(client, clock)
    message = str(raised.value)
    assert isinstance(raised.value, UserError) and "\n" not in message
    assert TASK in message and lifecycle in message and "AccessDenied" in message and "kept" in message


def test_a_task_still_running_at_the_timeout_is_a_one_line_error() -> None:
    client, clock = fsx_client(), FakeClock(start=0.0)
    with Stubber(client) as stub:
        queue_until_task_created(stub, auto_export=None)
        for _ in range(5):
            stub.add_response(
                "describe_data_repository_tasks",
                {"DataRepositoryTasks": [task("EXECUTING", 9, 1)]},
                {"TaskIds": [TASK]},
            )
        with pytest.raises(FsxExportError) as raised:
            run_export(client, clock, timeout_s=60)
    message = str(raised.value)
    assert "\n" not in message and "still EXECUTING after 60 s" in message and TASK in message
    assert clock.now == 60  # it gave up at the deadline, not before and not much after


def test_a_broken_association_is_a_one_line_error_and_no_task_is_created() -> None:
    client, clock = fsx_client(), FakeClock(start=0.0)
    with Stubber(client) as stub:  # no create_data_repository_task queued: calling it would fail
        stub.add_response(
            "describe_data_repository_associations",
            association("MISCONFIGURED", None, failure="bucket policy denies FSx"),
            DESCRIBE_DRA,
        )
        with pytest.raises(FsxExportError) as raised:
            run_export(client, clock)
        stub.assert_no_pending_responses()
    assert "MISCONFIGURED" in str(raised.value) and "bucket policy denies FSx" in str(raised.value)


def test_task_paths_are_relative_to_the_mount_point() -> None:
    assert task_path("/checkpoints") == "checkpoints"
    assert task_path("/ns1/subdir/") == "ns1/subdir"


def test_the_hook_exports_the_association_the_engine_is_about_to_delete() -> None:
    """What the engine hands a before_delete hook: the DRA's last state (camelCase outputs)."""
    client = fsx_client()
    regions: list[str] = []

    def factory(region: str) -> Any:
        regions.append(region)
        return client

    hook = hook_function("eu-west-1", client_factory=factory)
    args = pulumi.ResourceHookArgs(
        urn="urn:pulumi:dev::gpucloud::aws:fsx/dataRepositoryAssociation:DataRepositoryAssociation::c-fsx-checkpoints",
        id=DRA,
        name="c-fsx-checkpoints",
        type="aws:fsx/dataRepositoryAssociation:DataRepositoryAssociation",
        old_inputs={},
        old_outputs={"fileSystemId": FS, "associationId": DRA, "fileSystemPath": "/checkpoints"},
    )
    with Stubber(client) as stub:
        queue_until_task_created(stub, auto_export=None)
        stub.add_response(
            "describe_data_repository_tasks", {"DataRepositoryTasks": [task("SUCCEEDED", 2, 2)]}, {"TaskIds": [TASK]}
        )
        hook(args)
        stub.assert_no_pending_responses()
    assert regions == ["eu-west-1"]
