"""The job environment contract (docs/architecture.md, "Contracts"): variables spot-train gives the command."""

import os

from gpucloud.errors import UserError

JOB_ID = "GPUCLOUD_JOB_ID"
ATTEMPT = "GPUCLOUD_ATTEMPT"
CHECKPOINT_URI = "GPUCLOUD_CHECKPOINT_URI"
CONTROL_DIR = "GPUCLOUD_CONTROL_DIR"
# Optional: a node-local fast tier (NVMe) for the checkpoint store; unset means durable only.
LOCAL_CHECKPOINT_DIR = "GPUCLOUD_LOCAL_CHECKPOINT_DIR"
# Set by the guard (jobs/guard.py) for the command it runs: the processes below it are part of an
# attempt's tree, and a training session there asks to die with its launcher (lifeline.py).
GUARD_PID = "GPUCLOUD_GUARD_PID"

EXIT_OK = 0
EXIT_REQUEUED = 75  # EX_TEMPFAIL: checkpointed and requeued


def attempt() -> int | None:
    """This attempt's number (``GPUCLOUD_ATTEMPT``); None outside spot-train. A malformed value is a
    one-line UserError."""
    if ATTEMPT not in os.environ:
        return None
    raw = os.environ[ATTEMPT].strip() or "0"
    if not raw.isascii() or not raw.lstrip("-").isdigit() or len(raw) > 18:
        raise UserError(f"{ATTEMPT}={raw[:40]!r} is not a whole number")
    try:
        value = int(raw)
    except ValueError:
        raise UserError(f"{ATTEMPT}={raw!r} is not a whole number") from None
    if value < 0:
        raise UserError(f"{ATTEMPT}={raw!r} must be >= 0")
    return value
