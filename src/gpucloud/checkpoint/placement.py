"""Where a job's checkpoints go, so that the next attempt can read them. Pure; no I/O.

Two decisions:

* **The default location** when a job names none. It is resolved on the node that runs the attempt,
  from the cluster's settings in its environment (``/etc/gpucloud/node.env``, written by the stack:
  ``infra/program.py``), never on the submitter's laptop: the cluster's bucket,
  ``s3://$GPUCLOUD_CHECKPOINT_BUCKET/checkpoints``. Off a cluster (no bucket in the environment)
  it is the embedded ``$GPUCLOUD_HOME/checkpoints``.
* **Whether a location the user gave can be read by the next attempt**, checked at ``submit``
  before anything is queued (``unreadable_reason``).

Why the bucket and not the FSx mount by default:

* the bucket is in every stack; FSx is optional (``storage.fsx``);
* a save to S3 is written from every node at once, so its throughput grows with the number of nodes
  (S3 serves at least 3,500 PUTs per second per partitioned prefix and scales out with parallel
  connections: https://docs.aws.amazon.com/AmazonS3/latest/userguide/optimizing-performance.html),
  while FSx for Lustre PERSISTENT_2 delivers storage capacity x per-unit throughput for the whole
  file system, shared by every node (2.3 TiB x 250 MB/s/TiB, about 0.6 GB/s, for p4d-spot:
  https://docs.aws.amazon.com/fsx/latest/LustreGuide/performance.html);
* the stack links the FSx path ``/checkpoints`` to the same ``checkpoints/`` prefix of the bucket
  (a data repository association with auto-import), so what is saved to the bucket also appears
  under ``<mount>/checkpoints`` on every node.

What counts as shared (readable from another node): ``s3://`` URIs; paths under the cluster's FSx
mount (``GPUCLOUD_FSX_MOUNT_PATH``, which the stack sets only when it has a file system); paths under
a mount the user declares shared in ``GPUCLOUD_SHARED_PATHS`` (``os.pathsep``-separated, e.g. an
EFS or NFS mount, or the cluster's FSx mount named from a laptop). Anything else on a node is its
root disk or its NVMe (``GPUCLOUD_SCRATCH_PATH``): an instance-store volume is lost with the
instance (https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/InstanceStorage.html) and an Auto
Scaling group's root volume is deleted on termination by default
(https://docs.aws.amazon.com/autoscaling/ec2/APIReference/API_Ebs.html, ``DeleteOnTermination``).
"""

from __future__ import annotations

import dataclasses
import os
import posixpath
from collections.abc import Mapping
from urllib.parse import urlparse

BUCKET_ENV = "GPUCLOUD_CHECKPOINT_BUCKET"  # node.env: the stack's checkpoint bucket
FSX_MOUNT_ENV = "GPUCLOUD_FSX_MOUNT_PATH"  # node.env: set only when the stack has FSx for Lustre
SCRATCH_ENV = "GPUCLOUD_SCRATCH_PATH"  # node.env: this node's NVMe scratch (never shared)
SHARED_PATHS_ENV = "GPUCLOUD_SHARED_PATHS"  # the user's own: mounts every node sees
# The bucket prefix the stack links into FSx (spec.model.Fsx.s3_prefix's default).
CLUSTER_PREFIX = "checkpoints"


@dataclasses.dataclass(frozen=True)
class ClusterStorage:
    """The checkpoint-relevant settings of the cluster this process runs on (empty off a cluster)."""

    bucket: str | None = None
    shared_paths: tuple[str, ...] = ()
    scratch_path: str | None = None

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> ClusterStorage:
        shared = [env.get(FSX_MOUNT_ENV, ""), *env.get(SHARED_PATHS_ENV, "").split(os.pathsep)]
        return cls(
            bucket=env.get(BUCKET_ENV, "").strip() or None,
            shared_paths=tuple(_normal(p) for p in shared if p.strip() and posixpath.isabs(p.strip())),
            scratch_path=_normal(env[SCRATCH_ENV]) if env.get(SCRATCH_ENV, "").strip() else None,
        )

    def default_uri(self) -> str | None:
        """The durable tier a job without a URI uses on this cluster; None off a cluster."""
        return f"s3://{self.bucket}/{CLUSTER_PREFIX}" if self.bucket else None


def queue_spans_hosts(queue_uri: str) -> bool:
    """Whether the queue's attempts may run on other machines than the submitter's and each other's.

    An embedded SQLite queue is one file on one machine: every worker and agent of it (every "node"
    of a gang on it) is a process on that host, so any local path is shared among them. An ``aws://``
    queue is served by the cluster's nodes: attempt k+1 may run on any of them."""
    return queue_uri.startswith("aws://")


def unreadable_reason(uri: str, *, spans_hosts: bool, nodes: int, storage: ClusterStorage) -> str | None:
    """Why the next attempt (or another rank's node) could not read checkpoints at ``uri``; None if it can.

    ``uri`` is a path, ``file:///path`` or ``s3://bucket/prefix`` (its form is checked elsewhere)."""
    uri = uri.strip()
    if uri.startswith("s3://") or not spans_hosts:
        return None
    path = _local_path(uri)
    where = (
        f"a job of {nodes} nodes has each node save its own shards, and rank 0 would commit a manifest "
        "for shards left on the other nodes' disks"
        if nodes > 1
        else "the next attempt may run on another node, which cannot read this node's disk"
    )
    if path is None:
        return f"it is neither s3:// nor a path: {where}"
    if not posixpath.isabs(path):
        return f"it is a relative path, which each node resolves on its own disk: {where}"
    path = _normal(path)
    if any(_under(path, mount) for mount in storage.shared_paths):
        return None
    if storage.scratch_path and _under(path, storage.scratch_path):
        return f"it is on the node's NVMe scratch ({storage.scratch_path}), lost with the instance: {where}"
    return f"it is not on a shared file system known here: {where}"


def refusal(uri: str, reason: str, storage: ClusterStorage) -> str:
    """The one-line submit error for ``uri`` that ``unreadable_reason`` refused."""
    known = ", ".join(storage.shared_paths) or "none"
    return (
        f"checkpoint URI {uri!r} cannot be read by the next attempt: {reason}. "
        f"Use s3://BUCKET/PREFIX, omit --checkpoint-uri to use the cluster's bucket, or a path under a shared "
        f"mount (known here: {known}; declare others in ${SHARED_PATHS_ENV})"
    )


def _local_path(uri: str) -> str | None:
    if "://" not in uri:
        return posixpath.expanduser(uri)
    parsed = urlparse(uri)
    return parsed.path if parsed.scheme == "file" and parsed.netloc in ("", "localhost") else None


def _normal(path: str) -> str:
    path = posixpath.normpath(path.strip())
    # normpath keeps a leading "//" (POSIX leaves its meaning to the system); Linux reads it as "/"
    return "/" + path.lstrip("/") if path.startswith("/") else path


def _under(path: str, mount: str) -> bool:
    return path == mount or path.startswith(mount.rstrip("/") + "/")
