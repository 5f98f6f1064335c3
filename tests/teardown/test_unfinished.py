"""What a destroy takes with the stack's queue (gpucloud.teardown.unfinished), on the real SQLite
queue: every unfinished job, the newest step the queue knows committed, and whether its checkpoints
outlive the destroy. The AWS queue's case runs in test_teardown_moto.py, through the command."""

from __future__ import annotations

from pathlib import Path

import pytest
from tests.teardown.teardown_fakes import SPEC, running_job

from gpucloud.lifecycle.model import AttemptEnd, AttemptState
from gpucloud.queue.sqlite import SqliteQueue
from gpucloud.teardown.unfinished import CheckpointFate, checkpoint_fate, unfinished_jobs

BUCKET = "ckpt-1"


@pytest.mark.parametrize(
    ("uri", "bucket", "kept", "fate"),
    [
        ("s3://ckpt-1/checkpoints", BUCKET, False, CheckpointFate.DELETED),
        ("s3://ckpt-1", BUCKET, False, CheckpointFate.DELETED),
        ("s3://ckpt-1/checkpoints", BUCKET, True, CheckpointFate.KEPT),
        ("s3://ckpt-10/checkpoints", BUCKET, False, CheckpointFate.OUTSIDE),  # a name that only starts alike
        ("s3://team-archive/llama", BUCKET, False, CheckpointFate.OUTSIDE),
        ("s3://team-archive/llama", None, False, CheckpointFate.OUTSIDE),
        ("/fsx/checkpoints", BUCKET, True, CheckpointFate.CLUSTER_STORAGE),
        ("file:///fsx/checkpoints", BUCKET, False, CheckpointFate.CLUSTER_STORAGE),
        (None, BUCKET, False, CheckpointFate.NONE),
    ],
)
def test_checkpoint_fate(uri: str | None, bucket: str | None, kept: bool, fate: CheckpointFate) -> None:
    assert checkpoint_fate(uri, bucket=bucket, bucket_kept=kept) is fate


def test_every_unfinished_job_is_listed_with_its_commit_and_where_its_checkpoints_go(tmp_path: Path) -> None:
    queue = SqliteQueue(tmp_path / "queue.db")
    running = running_job(queue)
    drained = running_job(queue, worker="node-b")
    queue.end_attempt(
        drained.id,
        1,
        AttemptEnd(state=AttemptState.REQUEUED, exit_code=75, last_step=7, committed_step=7, resume_from=7),
    )
    elsewhere = queue.submit(SPEC.model_copy(update={"checkpoint_uri": "s3://team-archive/llama", "name": "llama"}))
    finished = running_job(queue, worker="node-c")
    queue.end_attempt(finished.id, 1, AttemptEnd(state=AttemptState.FINISHED, exit_code=0, last_step=9))

    listed = {j.job_id: j for j in unfinished_jobs(queue, bucket=BUCKET, bucket_kept=False)}

    assert set(listed) == {running.id, drained.id, elsewhere.id}  # the finished job is not the destroy's loss
    assert (listed[running.id].state, listed[running.id].committed_step) == ("running", None)
    assert (listed[drained.id].state, listed[drained.id].attempt, listed[drained.id].committed_step) == ("queued", 2, 7)
    assert listed[drained.id].checkpoint_uri == f"s3://{BUCKET}/checkpoints"  # the nodes' default
    assert listed[drained.id].checkpoint is CheckpointFate.DELETED
    assert listed[elsewhere.id].checkpoint is CheckpointFate.OUTSIDE and listed[elsewhere.id].name == "llama"
    assert listed[elsewhere.id].to_json()["checkpoint"] == "outside the stack"

    kept = {j.job_id: j.checkpoint for j in unfinished_jobs(queue, bucket=BUCKET, bucket_kept=True)}
    assert kept[drained.id] is CheckpointFate.KEPT and kept[elsewhere.id] is CheckpointFate.OUTSIDE
    queue.close()
