"""The thin, impure part of doctor: run the commands, read the files, probe IMDS on a real node;
or read/write the same outputs as a recorded capture directory."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

from gpucloud.doctor import capture as cap
from gpucloud.doctor.capture import NodeCapture
from gpucloud.errors import UserError

COMMAND_TIMEOUT_S = 20.0  # nvidia-smi can take seconds on a node with 8 GPUs and persistence off
IMDS_TIMEOUT_S = 2.0


def collect_live(units: list[str], imds_endpoint: str | None = None) -> NodeCapture:
    path = os.pathsep.join([os.environ.get("PATH", ""), *cap.EXTRA_PATH])
    outputs: dict[str, str | None] = {}
    for key, argv in cap.COMMANDS.items():
        outputs[key] = _run(argv, path, keep_failure_output=key in cap.KEEP_FAILURE_OUTPUT)
    for key, file in cap.FILES.items():
        outputs[key] = _read(Path(file))
    for unit in units:
        # is-active prints the state and exits non-zero for anything but "active"; the text is what we want.
        outputs[cap.unit_key(unit)] = _run(("systemctl", "is-active", unit), path, accept_failure=True)
    # Only the variables the checks read: a recorded capture must not carry credentials or tokens.
    outputs[cap.ENVIRON] = "".join(
        f"{k}={v}\n" for k, v in sorted(os.environ.items()) if k.startswith(cap.ENV_PREFIXES)
    )
    outputs[cap.IMDS] = json.dumps(probe_imds(imds_endpoint))
    return NodeCapture(outputs)


def _run(
    argv: tuple[str, ...], path: str, accept_failure: bool = False, keep_failure_output: bool = False
) -> str | None:
    exe = shutil.which(argv[0], path=path)
    if exe is None:
        return None
    try:
        done = subprocess.run([exe, *argv[1:]], capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if done.returncode != 0 and not accept_failure:
        return ((done.stdout + done.stderr) or None) if keep_failure_output else None
    return done.stdout


def _read(file: Path) -> str | None:
    try:
        return file.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None


def probe_imds(endpoint: str | None = None, timeout_s: float = IMDS_TIMEOUT_S) -> dict[str, object]:
    """IMDSv2 through the same client the interruption poller uses: token PUT, then a GET with it."""
    from gpucloud.signals.imds import ImdsClient, ImdsUnavailable

    client = ImdsClient(endpoint, connect_timeout=1.0, read_timeout=timeout_s)
    no_token = f"no IMDSv2 token from {client.endpoint} (token PUT timed out or refused: hop limit 1 in a container?)"
    try:
        instance_type = client.get_text("/latest/meta-data/instance-type")
    except ImdsUnavailable as err:
        reason = str(err) if client.tokens_fetched else f"{no_token}; {err}"
        return {"token_ok": False, "instance_type": None, "error": reason}
    if client.tokens_fetched == 0:
        return {"token_ok": False, "instance_type": instance_type, "error": no_token}
    return {"token_ok": True, "instance_type": (instance_type or "").strip() or None, "error": None}


def load_recorded(directory: Path) -> NodeCapture:
    """A capture directory: one file per output name; a missing file means the command was missing."""
    if not directory.is_dir():
        raise UserError(f"{directory}: not a directory of recorded doctor outputs")
    outputs: dict[str, str | None] = {}
    for file in directory.iterdir():
        if file.is_file():
            try:
                outputs[file.name] = file.read_text(encoding="utf-8")
            except (OSError, UnicodeDecodeError) as err:
                raise UserError(f"{file}: cannot read recorded output: {err.__class__.__name__}") from None
    if not outputs:
        raise UserError(f"{directory}: no recorded outputs in it (write some with 'gpucloud doctor --record DIR')")
    return NodeCapture(outputs)


def save_recorded(node: NodeCapture, directory: Path) -> int:
    try:
        directory.mkdir(parents=True, exist_ok=True)
        written = 0
        for key, text in node.outputs.items():
            if text is not None:
                (directory / key).write_text(text, encoding="utf-8")
                written += 1
    except OSError as err:
        raise UserError(f"{directory}: cannot write the capture: {err.strerror}") from None
    return written
