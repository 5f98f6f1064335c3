"""`gpucloud job logs` on a cluster: the supervisor ships the attempt's log to the
checkpoint bucket while the attempt runs and when it ends, and `job logs` on an aws:// queue reads it
from there, after the node (and its copy) is gone. The AWS queue and S3 are moto's."""

from __future__ import annotations

import re
import threading

import boto3

from gpucloud.jobs import logs
from gpucloud.jobs.runner import supervise_job
from gpucloud.lifecycle.model import JobSpec, JobState
from gpucloud.queue.connect import open_queue
from helpers.notices import Inbox
from helpers.waiting import wait_for
from jobs.test_cli import run
from jobs.test_logs import SUPERVISOR_LINE, TICKING
from jobs.test_runner import FAST, script


def shipped(s3, prefix: str) -> bytes:
    listed = s3.list_objects_v2(Bucket="ckpt-bucket", Prefix=prefix).get("Contents", [])
    return b"".join(s3.get_object(Bucket="ckpt-bucket", Key=o["Key"])["Body"].read() for o in listed)


def test_a_cluster_attempt_ships_its_log_while_it_runs_and_job_logs_reads_it_from_the_bucket(
    aws_job_plane, tmp_path, monkeypatch, capsys
):
    monkeypatch.setattr(logs, "SHIP_EVERY_S", 0.2)
    s3 = boto3.client("s3")
    s3.create_bucket(Bucket="ckpt-bucket")
    queue = open_queue(aws_job_plane["uri"])
    gate = tmp_path / "gate"
    command = [*script(tmp_path, "train.py", TICKING), str(gate)]
    job = queue.submit(JobSpec(command=command, checkpoint_uri="s3://ckpt-bucket/ckpt"))
    supervisor = threading.Thread(
        target=lambda: supervise_job(queue, job.id, notices=Inbox(), config=FAST, worker="w"), daemon=True
    )
    supervisor.start()
    try:
        prefix = f"logs/{job.id}/attempt-1/"
        wait_for(lambda: b"tick 2\n" in shipped(s3, prefix), what="a part shipped while the attempt runs")
        assert queue.get(job.id).state is JobState.RUNNING
    finally:
        gate.touch()
        supervisor.join(timeout=60)
    assert queue.get(job.id).state is JobState.FINISHED
    logs.attempt_log_path(job.id, 1).unlink()  # the node is gone, and its copy with it
    capsys.readouterr()  # the supervisor's echo of the output, on its stderr
    code, out, err = run(capsys, "job", "logs", job.id, "--queue", aws_job_plane["uri"], "--follow")
    assert code == 0 and err == ""
    assert out.startswith("==> attempt 1 (finished) <==\n") and "tick 1\n" in out and "gate open, done\n" in out
    assert re.search(SUPERVISOR_LINE.pattern + "job finished", out, re.M) and logs.END_MARKER not in out
    queue.close()
