"""The jobs a destroy takes with it, and whether their checkpoints outlive it.

The stack's job queue (SQS) and job table (DynamoDB) are resources of the stack: the destroy deletes
them, and with them every job not yet finished, drained ones included. What can outlive the stack is
a job's checkpoints: in another bucket, or in the stack's bucket when it is kept (``--keep-bucket`` on a
protected bucket). Teardown lists each such job with its last committed step and the fate of its
checkpoints, so nobody learns of the loss from a missing dashboard line.
"""

from __future__ import annotations

import dataclasses
import enum

from gpucloud.checkpoint.placement import ClusterStorage
from gpucloud.lifecycle.model import Job, JobState
from gpucloud.queue.protocol import JobQueue

UNFINISHED_STATES = (JobState.RUNNING, JobState.QUEUED)


class CheckpointFate(enum.Enum):
    KEPT = "kept"  # in the stack's bucket, which the teardown keeps (--keep-bucket, protected)
    DELETED = "deleted"  # in the stack's bucket, which the destroy empties and deletes
    OUTSIDE = "outside the stack"  # another bucket: the destroy does not touch it
    CLUSTER_STORAGE = "cluster storage"  # a path on the nodes (FSx, shared disks): deleted with them
    NONE = "none"  # no checkpoint location known (a stack without a bucket, a job naming none)


@dataclasses.dataclass(frozen=True)
class UnfinishedJob:
    """A job the stack's queue still holds when the destroy starts."""

    job_id: str
    name: str | None
    state: str  # running (the drain was skipped or timed out) or queued
    attempt: int
    # The newest step the queue knows committed: saved at an attempt's end (the drain's save, a
    # notice's) or restored by one. Periodic saves since then are known only to the checkpoint's LATEST.
    committed_step: int | None
    checkpoint_uri: str | None
    checkpoint: CheckpointFate

    def to_json(self) -> dict[str, object]:
        return {**dataclasses.asdict(self), "checkpoint": self.checkpoint.value}


def checkpoint_fate(uri: str | None, *, bucket: str | None, bucket_kept: bool) -> CheckpointFate:
    """Whether checkpoints at ``uri`` outlive the destroy of a stack whose checkpoint bucket is ``bucket``."""
    if not uri:
        return CheckpointFate.NONE
    if not uri.startswith("s3://"):
        return CheckpointFate.CLUSTER_STORAGE
    if bucket is not None and uri[len("s3://") :].split("/", 1)[0] == bucket:
        return CheckpointFate.KEPT if bucket_kept else CheckpointFate.DELETED
    return CheckpointFate.OUTSIDE


def unfinished_jobs(queue: JobQueue, *, bucket: str | None, bucket_kept: bool) -> list[UnfinishedJob]:
    """Every running or queued job of ``queue``, with where its checkpoints are and their fate.

    A job that names no checkpoint URI uses the cluster's default on the nodes of this stack (its
    bucket's ``checkpoints/`` prefix, ``ClusterStorage.default_uri``)."""
    default_uri = ClusterStorage(bucket=bucket).default_uri()
    return [_unfinished(queue, job, default_uri, bucket, bucket_kept) for job in queue.list_jobs(UNFINISHED_STATES)]


def _unfinished(queue: JobQueue, job: Job, default_uri: str | None, bucket: str | None, kept: bool) -> UnfinishedJob:
    rows = queue.attempts(job.id)
    committed = [s for a in rows for s in (a.committed_step, a.resumed_step) if s is not None]
    uri = job.spec.checkpoint_uri or default_uri
    return UnfinishedJob(
        job_id=job.id,
        name=job.spec.name,
        state=job.state.value,
        attempt=job.attempt,
        committed_step=max(committed) if committed else None,
        checkpoint_uri=uri,
        checkpoint=checkpoint_fate(uri, bucket=bucket, bucket_kept=kept),
    )
