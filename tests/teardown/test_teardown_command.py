"""``gpucloud teardown``'s decisions around the destroy, run through the real CLI with a fake of the
Automation API boundary only (``open_stack`` returns a ``FakeStack``) and a real SQLite queue."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
from tests.cli_run import one_line_error, run_cli
from tests.teardown.teardown_fakes import BUCKET, SPEC, STACK, STATE, FakeStack, SimulatedAgent, running_job

from gpucloud.infra import automation
from gpucloud.infra.automation import StackResource
from gpucloud.lifecycle.model import JobState
from gpucloud.queue.sqlite import SqliteQueue
from gpucloud.teardown.destroy import EXIT_DRAIN_TIMEOUT, EXIT_LEFT_OVER, EXIT_REFUSED

OFFLINE = ("--no-check-aws",)  # the AWS listing runs in the moto test


@pytest.fixture
def queue_path(tmp_path: Path) -> Path:
    return tmp_path / "queue.db"


def _use(monkeypatch: pytest.MonkeyPatch, fake: FakeStack) -> FakeStack:
    opened: list[str] = []

    def open_stack(stack: str, work_dir: Path | None = None) -> FakeStack:
        opened.append(stack)
        assert stack == fake.name
        return fake

    monkeypatch.setattr(automation, "open_stack", open_stack)
    return fake


def _teardown(capsys, queue_path: Path, *extra: str) -> tuple[int, str, str]:
    return run_cli(capsys, "teardown", "--stack", STACK, "--queue", f"sqlite:///{queue_path}", *OFFLINE, *extra)


def test_teardown_drains_running_jobs_before_the_destroy(monkeypatch, capsys, queue_path) -> None:
    queue = SqliteQueue(queue_path)
    job = running_job(queue)
    at_destroy: list[tuple[str, int]] = []
    fake = _use(monkeypatch, FakeStack(on_destroy=lambda: at_destroy.append(_state(queue, job.id))))
    agent = SimulatedAgent(lambda: SqliteQueue(queue_path), job.id, job.attempt, step=7)
    agent.start()
    code, out, err = _teardown(capsys, queue_path, "--yes", "-o", "json")
    agent.join(timeout=60)
    assert agent.error is None
    assert code == 0, err
    assert at_destroy == [("queued", 2)]  # the destroy came after attempt 1 committed and left running
    assert fake.destroyed_with == [False]
    summary = json.loads(out)
    assert summary["drain"]["stopped"][0]["committed_step"] == 7
    assert summary["drain"]["left_queued"] == [job.id]
    assert summary["destroyed"] is True and summary["leftovers"] == [] and summary["exit_code"] == 0
    assert "stop requested" in err and f"left queued: {job.id}" in err
    assert summary["unfinished_jobs"] is None  # --queue names another queue: the destroy does not delete it
    assert "aws:autoscaling/group:Group p4d deleting" in err  # the destroy's progress, streamed


def test_no_drain_destroys_without_a_stop_request(monkeypatch, capsys, queue_path) -> None:
    queue = SqliteQueue(queue_path)
    job = running_job(queue)
    fake = _use(monkeypatch, FakeStack())
    code, _, err = _teardown(capsys, queue_path, "--yes", "--no-drain")
    assert code == 0, err
    assert fake.destroyed_with == [False]
    assert queue.stop_request(job.id, 1) is None and queue.get(job.id).state is JobState.RUNNING
    assert "--no-drain" in err


def test_a_protected_bucket_is_refused_before_anything_happens(monkeypatch, capsys, queue_path) -> None:
    queue = SqliteQueue(queue_path)
    job = running_job(queue)
    outputs = {"checkpointBucket": "ckpt-1", "checkpointBucketProtected": True}
    fake = _use(monkeypatch, FakeStack(outputs))
    code, _, err = _teardown(capsys, queue_path, "--yes")
    assert code == EXIT_REFUSED
    line = one_line_error(err)
    assert "ckpt-1 is protected" in line and "storage.checkpointBucket.protect: false" in line
    assert f"pulumi up --stack {STACK}" in line and "--keep-bucket" in line
    assert fake.destroyed_with == [] and queue.stop_request(job.id, 1) is None


def test_keep_bucket_destroys_the_rest_and_keeps_the_protected_bucket(monkeypatch, capsys, queue_path) -> None:
    store = "gpucloud:storage:CheckpointStore"
    component = StackResource(f"urn:pulumi:ci::gpucloud::{store}::p4d-checkpoints", store)
    bucket = StackResource(
        f"urn:pulumi:ci::gpucloud::{store}$aws:s3/bucketV2:BucketV2::ckpt", BUCKET.type, "ckpt-1", True
    )
    versioning_type = "aws:s3/bucketVersioningV2:BucketVersioningV2"
    versioning = StackResource(
        f"urn:pulumi:ci::gpucloud::{store}${versioning_type}::v", versioning_type, "ckpt-1", True
    )
    state = [r for r in STATE if r != BUCKET] + [component, bucket, versioning]
    outputs = {"checkpointBucket": "ckpt-1", "checkpointBucketProtected": True}
    fake = _use(monkeypatch, FakeStack(outputs, state, left=(component,)))  # the bucket's component stays with it
    code, out, err = _teardown(capsys, queue_path, "--yes", "--keep-bucket", "-o", "json")
    assert code == 0, err
    assert fake.destroyed_with == [True]  # pulumi destroy --exclude-protected
    summary = json.loads(out)
    assert [r["type"] for r in summary["kept"]] == [store, BUCKET.type, versioning_type]
    assert summary["leftovers"] == []


def test_without_keep_bucket_a_left_component_is_a_leftover(monkeypatch, capsys, queue_path) -> None:
    store = "gpucloud:storage:CheckpointStore"
    component = StackResource(f"urn:pulumi:ci::gpucloud::{store}::p4d-checkpoints", store)
    _use(monkeypatch, FakeStack({}, [*STATE, component], left=(component,)))
    code, out, _ = _teardown(capsys, queue_path, "--yes", "-o", "json")
    assert code == EXIT_LEFT_OVER and [r["type"] for r in json.loads(out)["leftovers"]] == [store]


FSX = {
    "fileSystemId": "fs-0123456789abcdef0",
    "dataRepositoryAssociationId": "dra-0123456789abcdef0",
    "fileSystemPath": "/checkpoints",
    "exportPath": "s3://ckpt-1/checkpoints/",
    "exportOnDestroy": True,
}
HOOK_LINES = (
    "    info: fsx export: task-0a1b EXECUTING 10/40 files",
    "    info: fsx export: task-0a1b done, 40 files exported",
)


def test_the_fsx_export_hook_is_announced_and_followed(monkeypatch, capsys, queue_path) -> None:
    _use(monkeypatch, FakeStack({"fsx": FSX}, lines=HOOK_LINES))
    code, out, err = _teardown(capsys, queue_path, "--yes", "-o", "json")
    assert code == 0, err
    assert "FSx: exporting fs-0123456789abcdef0:/checkpoints to s3://ckpt-1/checkpoints/ before deletion" in err
    assert "teardown: fsx export: task-0a1b EXECUTING 10/40 files" in err
    export = json.loads(out)["fsx_export"]
    assert export["result"] == "exported" and export["progress"] == [line.split("info: ")[1] for line in HOOK_LINES]


def test_a_failed_fsx_export_fails_the_destroy_and_says_so(monkeypatch, capsys, queue_path) -> None:
    failure = "FSx export task-0a1b of fs-0123456789abcdef0:/checkpoints ended FAILED: Access denied"
    _use(monkeypatch, FakeStack({"fsx": FSX}, lines=HOOK_LINES[:1], error=failure))
    code, out, err = _teardown(capsys, queue_path, "--yes", "-o", "json")
    assert code == EXIT_LEFT_OVER and failure in err.splitlines()[-1]
    assert json.loads(out)["fsx_export"]["result"] == "not finished (see destroy_error)"


def test_no_fsx_export_when_the_stack_turns_it_off(monkeypatch, capsys, queue_path) -> None:
    _use(monkeypatch, FakeStack({"fsx": {**FSX, "exportOnDestroy": False}}))
    code, out, err = _teardown(capsys, queue_path, "--yes", "-o", "json")
    assert code == 0, err
    assert json.loads(out)["fsx_export"] is None and "FSx: exporting" not in err


def test_resources_left_after_the_destroy_exit_non_zero_naming_them(monkeypatch, capsys, queue_path) -> None:
    _use(monkeypatch, FakeStack(left=(STATE[2],)))
    code, out, err = _teardown(capsys, queue_path, "--yes")
    assert code == EXIT_LEFT_OVER
    line = err.splitlines()[-1]  # after the progress lines
    assert line.startswith("gpucloud: error: ")
    assert "1 resource(s) left: aws:ec2/vpc:Vpc vpc-0a1b2c3d" in line and "gpucloud sweep" in line
    assert "vpc-0a1b2c3d" in out  # the table of what is left


def test_a_failed_destroy_is_one_line_and_non_zero(monkeypatch, capsys, queue_path) -> None:
    _use(monkeypatch, FakeStack(error="deleting S3 Bucket (ckpt-1): BucketNotEmpty"))
    code, out, err = _teardown(capsys, queue_path, "--yes", "-o", "json")
    assert code == EXIT_LEFT_OVER
    assert err.splitlines()[-1] == (
        f"gpucloud: error: destroy of stack {STACK} failed: pulumi destroy ({STACK}): deleting S3 Bucket (ckpt-1): "
        "BucketNotEmpty; 3 resource(s) left: aws:ec2/vpc:Vpc vpc-0a1b2c3d, aws:autoscaling/group:Group p4d, "
        "aws:s3/bucketV2:BucketV2 ckpt-1"
    )
    summary = json.loads(out)
    assert summary["destroyed"] is False and len(summary["leftovers"]) == 3 and summary["exit_code"] == 1


def test_without_yes_and_without_a_terminal_it_refuses(monkeypatch, capsys, queue_path) -> None:
    fake = _use(monkeypatch, FakeStack())
    monkeypatch.setattr("sys.stdin", io.StringIO("y\n"))  # not a terminal
    code, _, err = _teardown(capsys, queue_path)
    assert code == EXIT_REFUSED
    assert "without --yes: there is no terminal to confirm on" in one_line_error(err)
    assert fake.destroyed_with == []


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.mark.parametrize(("answer", "destroyed"), [("n\n", []), ("y\n", [False])])
def test_on_a_terminal_it_asks_showing_what_goes(monkeypatch, capsys, queue_path, answer, destroyed) -> None:
    queue = SqliteQueue(queue_path)
    queue.submit(SPEC)
    fake = _use(monkeypatch, FakeStack({"checkpointBucket": "ckpt-1"}))
    monkeypatch.setattr("sys.stdin", _Terminal(answer))
    monkeypatch.setattr("gpucloud.commands.teardown._abort_uploads", lambda aws, bucket: 0)  # no AWS here
    code, _, err = _teardown(capsys, queue_path)
    assert fake.destroyed_with == destroyed
    assert code == (130 if answer == "n\n" else 0), err
    assert "3 resources will be destroyed" in err and "checkpoint bucket ckpt-1: deleted, with every checkpoint" in err
    assert "0 running job(s) will save a step and be requeued" in err
    assert f"1 queued job(s) stay queued in sqlite:///{queue_path}" in err


def test_a_drain_that_times_out_destroys_nothing_unless_forced(monkeypatch, capsys, queue_path) -> None:
    job = running_job(SqliteQueue(queue_path))
    fake = _use(monkeypatch, FakeStack())
    code, out, err = _teardown(capsys, queue_path, "--yes", "--drain-timeout", "0", "-o", "json")
    assert code == EXIT_DRAIN_TIMEOUT
    assert err.splitlines()[-1].startswith("gpucloud: error: drain timed out with jobs still running")
    assert fake.destroyed_with == []
    summary = json.loads(out)  # CI still gets the report: which job is still running, and nothing destroyed
    assert summary["exit_code"] == EXIT_DRAIN_TIMEOUT and summary["destroyed"] is False
    assert summary["drain"]["timed_out"] is True
    assert summary["drain"]["still_running"] == [job.id]
    code, _, err = _teardown(capsys, queue_path, "--yes", "--drain-timeout", "0", "--force")
    assert code == 0, err
    assert fake.destroyed_with == [False]


def test_no_pulumi_cli_is_one_line(monkeypatch, capsys, tmp_path) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    code, _, err = run_cli(capsys, "teardown", "--stack", STACK, "--yes")
    assert code == EXIT_REFUSED
    assert "the pulumi CLI is not installed" in one_line_error(err)


def _state(queue: SqliteQueue, job_id: str) -> tuple[str, int]:
    job = queue.get(job_id)
    return job.state.value, job.attempt


def test_help_teaches_the_exit_codes_and_imports_neither_pulumi_nor_boto3() -> None:
    import subprocess
    import sys

    code = (
        "import sys\n"
        "from gpucloud.cli import main\n"
        "try:\n"
        "    main(['teardown', '--help'])\n"
        "except SystemExit:\n"
        "    pass\n"
        "heavy = sorted(m for m in sys.modules if m.split('.')[0] in ('pulumi', 'boto3', 'botocore'))\n"
        "print('HEAVY', heavy)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "HEAVY []" in proc.stdout
    assert "3 the drain timed out" in proc.stdout and "--keep-bucket" in proc.stdout and "--no-drain" in proc.stdout


def test_without_a_stack_file_or_region_the_stack_queue_cannot_be_drained(monkeypatch, capsys) -> None:
    outputs = {"jobTableName": "ci-jobs", "jobQueueUrl": "https://sqs.us-east-1.amazonaws.com/123456789012/ci-jobs"}
    fake = _use(monkeypatch, FakeStack(outputs))
    code, _, err = run_cli(capsys, "teardown", "--stack", STACK, "--yes", "--no-check-aws")
    assert code == EXIT_REFUSED
    line = one_line_error(err)
    assert f"cannot tell stack {STACK}'s region" in line and line.endswith("give --region")
    assert fake.destroyed_with == []
