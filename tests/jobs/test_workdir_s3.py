"""Code reaches the node on a cluster: `submit --workdir` to an aws:// queue puts the
snapshot in the checkpoint bucket under code/<hash>.tar.gz (once per tree), and a node fetches it
from there, verifies it and runs the command in it. The queue (SQS + DynamoDB) and S3 are moto's."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import boto3

from gpucloud.jobs.runner import supervise_job
from gpucloud.lifecycle.model import JobState
from gpucloud.queue.connect import open_queue
from helpers.notices import Inbox
from jobqueue.aws_fixtures import aws_job_plane  # noqa: F401  (fixture)
from jobs.test_cli import one_line_error, run
from jobs.test_runner import FAST


def test_a_cluster_job_ships_its_workdir_through_the_bucket(aws_job_plane, tmp_path: Path, gpucloud_home, capsys):
    s3 = boto3.client("s3")
    s3.create_bucket(Bucket="ckpt-bucket")
    work = tmp_path / "project"
    work.mkdir()
    (work / "train.py").write_text("import pathlib, sys; pathlib.Path(sys.argv[1]).write_text(open('data.txt').read())")
    (work / "data.txt").write_text("shipped through S3\n")
    result = tmp_path / "result.txt"
    argv = ["submit", "--queue", aws_job_plane["uri"], "--checkpoint-uri", "s3://ckpt-bucket/ckpt", "--workdir"]
    code, out, err = run(capsys, *argv, str(work), "--output", "json", "--", sys.executable, "train.py", str(result))
    assert code == 0, err
    job = json.loads(out)
    key = f"code/{job['code']['sha256']}.tar.gz"
    assert job["code"]["uri"] == f"s3://ckpt-bucket/{key}" and job["code_uploaded"] is True
    assert s3.head_object(Bucket="ckpt-bucket", Key=key)["ContentLength"] > 0
    code, out, err = run(capsys, *argv, str(work), "--output", "json", "--", sys.executable, "train.py", str(result))
    assert code == 0 and json.loads(out)["code_uploaded"] is False  # the same tree: not uploaded again
    assert [o["Key"] for o in s3.list_objects_v2(Bucket="ckpt-bucket", Prefix="code/")["Contents"]] == [key]

    assert not (gpucloud_home / "code").exists()  # nothing local: the node can only have it from the bucket
    queue = open_queue(aws_job_plane["uri"])
    done = supervise_job(queue, job["job_id"], notices=Inbox(), config=FAST, worker="node-a")
    assert done.job.state is JobState.FINISHED, done.job.reason
    assert result.read_text() == "shipped through S3\n"
    queue.close()


def test_an_aws_queue_without_a_bucket_is_refused_in_one_line_before_anything_is_queued(
    aws_job_plane, tmp_path: Path, capsys, monkeypatch
):
    monkeypatch.delenv("GPUCLOUD_CHECKPOINT_BUCKET", raising=False)
    (tmp_path / "train.py").write_text("")
    code, _, err = run(capsys, "submit", "--queue", aws_job_plane["uri"], "--workdir", str(tmp_path), "--", "x")
    assert code == 2
    line = one_line_error(err)
    assert "--workdir on an aws:// queue needs a bucket the nodes can read" in line
    assert "--checkpoint-uri s3://BUCKET/PREFIX" in line and "GPUCLOUD_CHECKPOINT_BUCKET" in line
    queue = open_queue(aws_job_plane["uri"])
    assert queue.list_jobs() == []
    queue.close()


def test_the_clusters_bucket_from_node_env_takes_the_snapshot_when_the_job_names_none(
    aws_job_plane, tmp_path: Path, capsys, monkeypatch
):
    boto3.client("s3").create_bucket(Bucket="cluster-bucket")
    monkeypatch.setenv("GPUCLOUD_CHECKPOINT_BUCKET", "cluster-bucket")
    (tmp_path / "train.py").write_text("")
    code, out, err = run(
        capsys, "submit", "--queue", aws_job_plane["uri"], "--workdir", str(tmp_path), "--output", "json", "--", "x"
    )
    assert code == 0, err
    assert json.loads(out)["code"]["uri"].startswith("s3://cluster-bucket/code/")
