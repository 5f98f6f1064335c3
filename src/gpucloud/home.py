"""Where gpucloud keeps its embedded state on this machine: ``GPUCLOUD_HOME`` (default ``~/.gpucloud``).

It holds the default queue (``queue.db``), the embedded durable checkpoint tier (``checkpoints/``),
shipped code (``code/``) and per-attempt control and local-tier directories (``run/``).
"""

from __future__ import annotations

import os
from pathlib import Path

HOME_ENV = "GPUCLOUD_HOME"


def gpucloud_home() -> Path:
    return Path(os.environ.get(HOME_ENV) or Path.home() / ".gpucloud").expanduser()
