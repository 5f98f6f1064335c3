"""The environment that ties a process to one queue, node or IMDS (its own module: several test
folders have a ``conftest`` of their own, so ``from conftest import`` is ambiguous)."""

from __future__ import annotations

# The settings that tie a process to one queue, node or IMDS: unset for an agent or command under
# test, so it uses what the test gives it (and never a developer's own queue).
NODE_ENV = (
    "GPUCLOUD_QUEUE",
    "AWS_EC2_METADATA_SERVICE_ENDPOINT",
    "GPUCLOUD_REGION",
    "GPUCLOUD_JOB_TABLE",
    "GPUCLOUD_JOB_QUEUE_URL",
    "GPUCLOUD_EVENTS_QUEUE_URL",
    # where checkpoints may go and which group a node is in: the cluster's, never the test's
    "GPUCLOUD_CHECKPOINT_BUCKET",
    "GPUCLOUD_FSX_MOUNT_PATH",
    "GPUCLOUD_SHARED_PATHS",
    "GPUCLOUD_SCRATCH_PATH",
    "GPUCLOUD_NODE_GROUP",
    "GPUCLOUD_NODE_GROUPS",
)
