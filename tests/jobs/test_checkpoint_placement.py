"""Checkpoints go where the next attempt can read them.

The pure rule (``checkpoint/placement.py``), what ``submit`` refuses and records, and the cluster
case end to end: a job submitted from a laptop to a cluster's ``aws://`` queue without a URI saves
to the cluster's bucket (resolved on the node from its ``node.env``), attempt 2 on another node
resumes from it, and ``job show`` names the URI the attempts used.
"""

from __future__ import annotations

import json
import sys
import textwrap
import threading

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fuzzing import fuzz_settings
from gpucloud.checkpoint.defaults import default_checkpoint_uri
from gpucloud.checkpoint.placement import ClusterStorage, refusal, unreadable_reason
from gpucloud.jobs.runner import supervise_job
from gpucloud.jobs.supervisor import SupervisorConfig
from gpucloud.lifecycle.model import AttemptState, JobState
from gpucloud.queue.connect import open_queue
from helpers.notices import Inbox, spot_notice
from helpers.waiting import wait_for
from jobqueue.aws_fixtures import aws_job_plane  # noqa: F401  (fixture)

from .test_cli import one_line_error, run

FAST = SupervisorConfig(ack_timeout=5.0, stop_margin=1.0, exit_grace=10.0, kill_after=2.0, tick=0.02)
# What the stack writes into node.env (infra/program.py) that decides where checkpoints go.
CLUSTER_ENV = (
    "GPUCLOUD_CHECKPOINT_BUCKET",
    "GPUCLOUD_FSX_MOUNT_PATH",
    "GPUCLOUD_SCRATCH_PATH",
    "GPUCLOUD_SHARED_PATHS",
)
CLUSTER = ClusterStorage(bucket="ckpt-bucket", shared_paths=("/fsx",), scratch_path="/scratch")


@pytest.fixture(autouse=True)
def off_cluster(monkeypatch: pytest.MonkeyPatch) -> None:
    """Start every test off a cluster, whatever the developer's shell holds."""
    for name in CLUSTER_ENV:
        monkeypatch.delenv(name, raising=False)


# ---------------------------------------------------------------------------------- the pure rule


@pytest.mark.parametrize(
    "uri",
    [
        "s3://ckpt-bucket/llama",
        "/fsx/ckpt",
        "/fsx",
        "file:///fsx/ckpt",
        "/fsx/../fsx/ckpt",
    ],
)
def test_shared_locations_are_readable_by_any_node(uri):
    assert unreadable_reason(uri, spans_hosts=True, nodes=4, storage=CLUSTER) is None


@pytest.mark.parametrize(
    "uri, nodes, expected",
    [
        ("/home/ubuntu/.gpucloud/checkpoints", 1, "the next attempt may run on another node"),
        ("/home/ubuntu/ckpt", 2, "rank 0 would commit a manifest for shards left on the other nodes' disks"),
        ("/scratch/ckpt", 1, "on the node's NVMe scratch (/scratch)"),
        ("/fsxdata/ckpt", 1, "not on a shared file system"),  # a sibling of the mount is not under it
        ("/fsx/../home/ckpt", 1, "not on a shared file system"),
        ("ckpt", 1, "relative path"),
        ("~/ckpt", 1, "not on a shared file system"),
        ("file:///var/ckpt", 8, "a job of 8 nodes"),
    ],
)
def test_node_local_locations_are_refused_on_a_queue_that_spans_hosts(uri, nodes, expected):
    reason = unreadable_reason(uri, spans_hosts=True, nodes=nodes, storage=CLUSTER)
    assert reason is not None and expected in reason


@pytest.mark.parametrize("uri", ["/home/me/ckpt", "ckpt", "/scratch/ckpt"])
def test_an_embedded_queue_keeps_every_attempt_on_this_host(uri):
    # one SQLite file, one machine: every worker and every "node" of a gang on it shares its disk
    assert unreadable_reason(uri, spans_hosts=False, nodes=4, storage=CLUSTER) is None


def test_cluster_storage_comes_from_node_env():
    env = {
        "GPUCLOUD_CHECKPOINT_BUCKET": "gpucloud-p4d-ckpt",
        "GPUCLOUD_FSX_MOUNT_PATH": "/fsx/",
        "GPUCLOUD_SCRATCH_PATH": "/scratch",
        "GPUCLOUD_SHARED_PATHS": "/efs:relative:",
    }
    storage = ClusterStorage.from_env(env)
    assert storage == ClusterStorage("gpucloud-p4d-ckpt", ("/fsx", "/efs"), "/scratch")
    assert storage.default_uri() == "s3://gpucloud-p4d-ckpt/checkpoints"
    assert ClusterStorage.from_env({}).default_uri() is None


def test_the_default_is_the_clusters_bucket_on_a_node_and_the_home_directory_elsewhere(gpucloud_home, monkeypatch):
    assert default_checkpoint_uri() == str(gpucloud_home / "checkpoints")
    monkeypatch.setenv("GPUCLOUD_CHECKPOINT_BUCKET", "gpucloud-p4d-ckpt")
    assert default_checkpoint_uri() == "s3://gpucloud-p4d-ckpt/checkpoints"


# ------------------------------------------------------------------------------------------ submit

AWS_QUEUE = "aws://us-east-1?table=jobs&queue=https://sqs.us-east-1.amazonaws.com/123456789012/jobs"


@pytest.mark.parametrize(
    "flags, expected",
    [
        (["--checkpoint-uri", "/home/me/ckpt"], "checkpoint URI '/home/me/ckpt' cannot be read by the next attempt"),
        (["--checkpoint-uri", "ckpt"], "relative path"),
        (["--nodes", "2", "--checkpoint-uri", "/data/ckpt"], "a job of 2 nodes"),
        (["--checkpoint-uri", "gs://bucket/x"], "scheme 'gs' is not supported"),
    ],
)
def test_submit_refuses_a_location_the_next_attempt_cannot_read_before_queueing(capsys, flags, expected):
    # the queue is never opened: the refusal comes first (no AWS is reachable here)
    code, _, err = run(capsys, "submit", "--queue", AWS_QUEUE, *flags, "--", "python", "train.py")
    assert code == 2 and expected in one_line_error(err)


def test_spot_train_refuses_a_node_local_location_on_a_clusters_queue(capsys, monkeypatch):
    monkeypatch.setenv("GPUCLOUD_SCRATCH_PATH", "/scratch")
    code, _, err = run(
        capsys, "spot-train", "--no-imds", "--queue", AWS_QUEUE, "--checkpoint-uri", "/scratch/c", "--", "true"
    )
    assert code == 2 and "NVMe scratch (/scratch)" in one_line_error(err)


def test_a_declared_shared_mount_is_accepted(capsys, monkeypatch, aws_job_plane):
    monkeypatch.setenv("GPUCLOUD_SHARED_PATHS", "/efs")
    code, out, err = run(
        capsys, "submit", "--queue", aws_job_plane["uri"], "--nodes", "2", "--checkpoint-uri", "/efs/ckpt",
        "--output", "json", "--", "python", "train.py",
    )  # fmt: skip
    assert code == 0, err
    assert open_queue(aws_job_plane["uri"]).get(json.loads(out)["job_id"]).spec.checkpoint_uri == "/efs/ckpt"


def test_the_embedded_queue_still_records_the_local_default(capsys, gpucloud_home):
    code, out, _ = run(capsys, "submit", "--output", "json", "--", "python", "train.py")
    assert code == 0
    job = open_queue().get(json.loads(out)["job_id"])
    assert job.spec.checkpoint_uri == str(gpucloud_home / "checkpoints")


# ------------------------------------------------------------------------------ the cluster case

# A training script: restores, records where it saved and from which step it started, then trains
# until the supervisor's preempt flag makes the session save, commit and exit 75.
TRAIN = """
    import os, sys, time
    import torch
    from gpucloud.checkpoint import TrainingSession

    model = torch.nn.Linear(4, 2)
    session = TrainingSession(model, torch.optim.SGD(model.parameters(), lr=0.1))
    start = session.restore()
    with open(sys.argv[1], "a") as out:
        out.write(f"{os.environ['GPUCLOUD_ATTEMPT']} {start} {os.environ['GPUCLOUD_CHECKPOINT_URI']}\\n")
    if start > 0:
        session.finish()
        sys.exit(0)
    step = 0
    while True:
        time.sleep(0.01)
        step += 1
        session.step_done(step)
"""


def test_a_job_without_uri_on_a_clusters_queue_checkpoints_to_its_bucket_and_resumes_on_another_node(
    capsys,
    tmp_path,
    monkeypatch,
    aws_job_plane,
):
    import boto3

    bucket = "gpucloud-test-ckpt"
    boto3.client("s3").create_bucket(Bucket=bucket)
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(TRAIN))
    seen = tmp_path / "seen.txt"

    # the laptop: no cluster settings; its own GPUCLOUD_HOME
    monkeypatch.setenv("GPUCLOUD_HOME", str(tmp_path / "laptop"))
    code, out, err = run(
        capsys,
        "submit",
        "--queue",
        aws_job_plane["uri"],
        "--output",
        "json",
        "--",
        sys.executable,
        str(script),
        str(seen),
    )
    assert code == 0, err
    job_id = json.loads(out)["job_id"]
    queue = open_queue(aws_job_plane["uri"], supervising=True)
    assert queue.get(job_id).spec.checkpoint_uri is None  # resolved on the node, not on the laptop

    def node(name: str) -> None:  # what node.env gives the agent on each node of the cluster
        monkeypatch.setenv("GPUCLOUD_HOME", str(tmp_path / name))
        monkeypatch.setenv("GPUCLOUD_CHECKPOINT_BUCKET", bucket)
        monkeypatch.setenv("GPUCLOUD_SCRATCH_PATH", str(tmp_path / name / "scratch"))

    node("node-a")
    inbox = Inbox()

    def interrupt_once_training() -> None:
        wait_for(seen.exists, 120, "attempt 1 to restore and start training")
        inbox.put(spot_notice(60.0))

    watcher = threading.Thread(target=interrupt_once_training)
    watcher.start()
    ran = {"a": supervise_job(queue, job_id, notices=inbox, config=FAST)}
    watcher.join()
    assert ran["a"].exit_code == 75 and queue.get(job_id).state is JobState.QUEUED

    node("node-b")
    ran["b"] = supervise_job(queue, job_id, notices=Inbox(), config=FAST)
    assert ran["b"].exit_code == 0

    uri = f"s3://{bucket}/checkpoints"
    lines = [line.split() for line in seen.read_text().splitlines()]
    assert [(attempt, used) for attempt, _, used in lines] == [("1", uri), ("2", uri)]
    assert int(lines[1][1]) > 0  # attempt 2, on another node, resumed from attempt 1's save
    keys = [o["Key"] for o in boto3.client("s3").list_objects_v2(Bucket=bucket)["Contents"]]
    assert f"checkpoints/{job_id}/LATEST" in keys
    assert not (tmp_path / "laptop" / "checkpoints").exists() and not (tmp_path / "node-a" / "checkpoints").exists()

    code, out, _ = run(capsys, "job", "show", job_id, "--queue", aws_job_plane["uri"], "--output", "json")
    report = json.loads(out)
    assert [(a["state"], a["checkpoint_uri"]) for a in report["attempts"]] == [
        (AttemptState.REQUEUED.value, uri),
        (AttemptState.FINISHED.value, uri),
    ]
    code, out, _ = run(capsys, "job", "show", job_id, "--queue", aws_job_plane["uri"])
    assert f"checkpoints: {uri}" in out
    queue.close()


# ------------------------------------------------------------------------------------ keep it found

SEGMENTS = st.sampled_from(["fsx", "fsxdata", "efs", "scratch", "home", "ckpt", "..", ".", ""])
MOUNTS = st.lists(st.sampled_from(["/fsx", "/fsx/", "//fsx", "/efs/team", "/fsx/ckpt/../shared"]), max_size=3)


def resolved(path: str) -> list[str]:
    """An absolute path's components after '.', '..' and repeated slashes (Linux's reading, without links)."""
    parts: list[str] = []
    for part in path.split("/"):
        if part == "..":
            parts = parts[:-1]
        elif part not in ("", "."):
            parts.append(part)
    return parts


@fuzz_settings(200)
@given(
    lead=st.sampled_from(["/", "//", "file:///", "file://localhost/", " /"]),
    segments=st.lists(SEGMENTS, max_size=6),
    mounts=MOUNTS,
    nodes=st.integers(1, 16),
)
def test_fuzz_a_path_is_accepted_exactly_when_it_lies_under_a_shared_mount(lead, segments, mounts, nodes):
    uri = lead + "/".join(segments)
    storage = ClusterStorage.from_env({"GPUCLOUD_SHARED_PATHS": ":".join(mounts), "GPUCLOUD_SCRATCH_PATH": "/scratch"})
    reason = unreadable_reason(uri, spans_hosts=True, nodes=nodes, storage=storage)
    path = uri.strip().removeprefix("file://localhost").removeprefix("file://")
    target = resolved(path)
    under = any(target[: len(resolved(m))] == resolved(m) for m in mounts)
    assert (reason is None) == under, (uri, mounts, reason)
    if reason is not None:
        assert "\n" not in refusal(uri, reason, storage)
