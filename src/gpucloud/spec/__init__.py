"""The stack spec: models, loading and validation of ``stacks/Pulumi.<stack>.yaml`` files."""

from gpucloud.spec.loading import available_stacks, load_stack_file, spec_from_config, stack_file_for
from gpucloud.spec.model import (
    Access,
    Ami,
    Capacity,
    CheckpointBucket,
    ClusterSpec,
    Efa,
    Fsx,
    JobPlane,
    Network,
    NodeGroup,
    Scaling,
    Storage,
)

__all__ = [
    "Access",
    "Ami",
    "Capacity",
    "CheckpointBucket",
    "ClusterSpec",
    "Efa",
    "Fsx",
    "JobPlane",
    "Network",
    "NodeGroup",
    "Scaling",
    "Storage",
    "available_stacks",
    "load_stack_file",
    "spec_from_config",
    "stack_file_for",
]
