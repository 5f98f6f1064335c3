"""The job environment contract (ARCHITECTURE.md): variables spot-train gives the command."""

JOB_ID = "GPUCLOUD_JOB_ID"
ATTEMPT = "GPUCLOUD_ATTEMPT"
CHECKPOINT_URI = "GPUCLOUD_CHECKPOINT_URI"
CONTROL_DIR = "GPUCLOUD_CONTROL_DIR"
# Optional: a node-local fast tier (NVMe) for the checkpoint store; unset means durable only.
LOCAL_CHECKPOINT_DIR = "GPUCLOUD_LOCAL_CHECKPOINT_DIR"

EXIT_OK = 0
EXIT_REQUEUED = 75  # EX_TEMPFAIL: checkpointed and requeued
