"""Node user data: the node settings as an env file, then ``scripts/node-bootstrap.sh``.

Rendering is a pure function of plain strings (``render_user_data``); ``user_data_output`` waits
for the Outputs (queue URLs, file system DNS name) and base64-encodes the result, as launch
templates require.
"""

from __future__ import annotations

import base64
import re
import shlex
from collections.abc import Mapping
from pathlib import Path

import pulumi

BOOTSTRAP_SCRIPT = Path(__file__).resolve().parents[3] / "scripts" / "node-bootstrap.sh"
ENV_FILE = "/etc/gpucloud/node.env"
USER_DATA_LIMIT = 16 * 1024  # EC2 limit, before base64
# Whole-line comments ("# ..." or a bare "#") are for readers of the script in the repository; EC2's
# 16 KiB counts them, so they are left out of the user data. Code, and "#" inside lines, stay.
_COMMENT_LINE = re.compile(r"^[ \t]*#( .*)?$")


def without_comment_lines(script: str) -> str:
    lines = script.splitlines()
    head, rest = (lines[:1], lines[1:]) if lines and lines[0].startswith("#!") else ([], lines)
    return "\n".join(head + [line for line in rest if not _COMMENT_LINE.match(line)]) + "\n"


def render_user_data(settings: Mapping[str, str], script: str | None = None, env_file: str = ENV_FILE) -> str:
    """``env_file``: where the settings go (the monitor's script reads /etc/gpucloud/monitor.env)."""
    body = without_comment_lines(script if script is not None else BOOTSTRAP_SCRIPT.read_text(encoding="utf-8"))
    env_lines = "\n".join(f"{key}={shlex.quote(str(value))}" for key, value in sorted(settings.items()))
    header = (
        "#!/usr/bin/env bash\n"
        "# gpucloud user data: settings first, then the bootstrap script\n"
        "set -euo pipefail\n"
        f"install -d -m 0755 {Path(env_file).parent}\n"
        f"cat > {env_file} <<'GPUCLOUD_ENV'\n{env_lines}\nGPUCLOUD_ENV\n"
        f"chmod 0644 {env_file}\n"
        "cat > /opt/gpucloud-bootstrap.sh <<'GPUCLOUD_BOOTSTRAP'\n"
    )
    text = f"{header}{body.rstrip()}\nGPUCLOUD_BOOTSTRAP\nexec bash /opt/gpucloud-bootstrap.sh\n"
    if len(text.encode()) > USER_DATA_LIMIT:
        raise ValueError(f"user data is {len(text.encode())} bytes; EC2 allows {USER_DATA_LIMIT}")
    return text


def user_data_output(
    settings: Mapping[str, pulumi.Input[str]], script_path: Path = BOOTSTRAP_SCRIPT, env_file: str = ENV_FILE
) -> pulumi.Output[str]:
    script = script_path.read_text(encoding="utf-8")
    keys = sorted(settings)
    return pulumi.Output.all(*(settings[k] for k in keys)).apply(
        lambda values: base64.b64encode(
            render_user_data(
                dict(zip(keys, (v if v is not None else "" for v in values), strict=True)), script, env_file
            ).encode()
        ).decode()
    )
