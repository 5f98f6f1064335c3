"""``gpucloud teardown`` against the moto server: the stack's own AWS queue (from its outputs) is
drained with a simulated agent committing through it, the checkpoint bucket's unfinished multipart
upload is aborted before the destroy, and what AWS still holds tagged with the stack afterwards is
named with a non-zero exit. Only the Automation API boundary is fake (``FakeStack``)."""

from __future__ import annotations

import json

import boto3
import pytest
from tests.cli_run import run_cli
from tests.jobqueue.aws_fixtures import REGION, aws_job_plane  # noqa: F401  (fixture)
from tests.teardown.teardown_fakes import SPEC, STACK, FakeStack, SimulatedAgent, running_job

from gpucloud.cluster.tags import STACK_TAG
from gpucloud.infra import automation
from gpucloud.queue.connect import open_queue
from gpucloud.teardown.destroy import EXIT_LEFT_OVER

BUCKET = "ckpt-teardown-test"


def test_teardown_on_aws_drains_aborts_uploads_and_names_what_aws_holds(
    monkeypatch: pytest.MonkeyPatch, capsys, aws_job_plane: dict[str, str]
) -> None:
    queue = open_queue(aws_job_plane["uri"])
    job = running_job(queue)
    archived = queue.submit(SPEC.model_copy(update={"checkpoint_uri": "s3://team-archive/run-3"}))
    s3 = boto3.client("s3", region_name=REGION)
    s3.create_bucket(Bucket=BUCKET)
    s3.create_multipart_upload(Bucket=BUCKET, Key="ckpt/step-7/shard-0")  # a save cut off mid-upload
    ec2 = boto3.client("ec2", region_name=REGION)
    vpc = ec2.create_vpc(
        CidrBlock="10.42.0.0/16",
        TagSpecifications=[{"ResourceType": "vpc", "Tags": [{"Key": STACK_TAG, "Value": STACK}]}],
    )["Vpc"]["VpcId"]
    ec2.create_vpc(CidrBlock="10.43.0.0/16")  # untagged: not the stack's, never named
    outputs = {
        "jobTableName": aws_job_plane["table"],
        "jobQueueUrl": aws_job_plane["queue_url"],
        "checkpointBucket": BUCKET,
        "checkpointBucketProtected": False,
    }
    at_destroy: list[str] = []
    fake = FakeStack(outputs, on_destroy=lambda: at_destroy.append(queue.get(job.id).state.value))
    monkeypatch.setattr(automation, "open_stack", lambda stack, work_dir=None: fake)
    agent = SimulatedAgent(lambda: open_queue(aws_job_plane["uri"]), job.id, job.attempt, step=7)
    agent.start()
    code, out, err = run_cli(capsys, "teardown", "--stack", STACK, "--region", REGION, "--yes", "-o", "json")
    agent.join(timeout=60)
    assert agent.error is None
    assert code == EXIT_LEFT_OVER, err
    summary = json.loads(out)
    assert at_destroy == ["queued"] and summary["drain"]["stopped"][0]["committed_step"] == 7
    assert summary["multipart_uploads_aborted"] == 1
    # the stack's queue goes with the destroy: both jobs are named, with where their checkpoints go
    unfinished = {j["job_id"]: j for j in summary["unfinished_jobs"]}
    assert set(unfinished) == {job.id, archived.id}
    assert unfinished[job.id]["committed_step"] == 7 and unfinished[job.id]["state"] == "queued"
    assert (unfinished[job.id]["checkpoint_uri"], unfinished[job.id]["checkpoint"]) == (
        f"s3://{BUCKET}/checkpoints",
        "deleted",
    )
    assert unfinished[archived.id]["checkpoint"] == "outside the stack"
    assert "2 unfinished job(s)" in err and "the checkpoints of 1 outlive the destroy" in err
    assert s3.list_multipart_uploads(Bucket=BUCKET).get("Uploads", []) == []
    assert summary["leftovers"] == []  # the state is empty ...
    assert [found["arn"].rsplit("/", 1)[-1] for found in summary["aws_leftovers"]] == [vpc]  # ... AWS is not
    last = err.splitlines()[-1]
    assert last.startswith("gpucloud: error: ") and vpc in last and "gpucloud sweep" in last
    queue.close()


def test_a_queue_that_is_gone_stops_the_teardown_pointing_at_no_drain(
    monkeypatch: pytest.MonkeyPatch, capsys, aws_job_plane: dict[str, str]
) -> None:
    outputs = {"jobTableName": "gone-jobs", "jobQueueUrl": aws_job_plane["queue_url"]}  # a half-destroyed stack
    fake = FakeStack(outputs)
    monkeypatch.setattr(automation, "open_stack", lambda stack, work_dir=None: fake)
    code, _, err = run_cli(capsys, "teardown", "--stack", STACK, "--region", REGION, "--yes", "--no-check-aws")
    assert code == 2
    line = err.splitlines()[-1]  # after the "draining" progress line
    assert line.startswith("gpucloud: error: ")
    assert f"cannot drain stack {STACK}'s queue, nothing was destroyed" in line and "--no-drain" in line
    assert fake.destroyed_with == []


def test_without_a_drain_the_running_jobs_the_destroy_takes_are_still_named(
    monkeypatch: pytest.MonkeyPatch, capsys, aws_job_plane: dict[str, str]
) -> None:
    queue = open_queue(aws_job_plane["uri"])
    job = running_job(queue)
    outputs = {"jobTableName": aws_job_plane["table"], "jobQueueUrl": aws_job_plane["queue_url"]}
    fake = FakeStack(outputs)
    monkeypatch.setattr(automation, "open_stack", lambda stack, work_dir=None: fake)
    args = ("teardown", "--stack", STACK, "--region", REGION, "--yes", "--no-drain", "--no-check-aws")
    code, out, err = run_cli(capsys, *args)
    assert code == 0, err
    assert fake.destroyed_with == [False]
    assert queue.stop_request(job.id, 1) is None  # not drained ...
    assert "jobs destroyed with the stack's queue" in out and job.id in out  # ... but named
    assert "1 unfinished job(s)" in err
    queue.close()
