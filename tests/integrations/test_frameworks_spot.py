"""HF Trainer and Lightning under `gpucloud spot-train`, with the real libraries: a spot notice
(IMDS emulator) stops attempt 1 at an agreed step, saved through the framework's own
checkpointing and committed; attempt 2 resumes from it and finishes; the final weights are
bitwise those of an uninterrupted run."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gpucloud.offline.demo import weights_identical
from gpucloud.offline.imds_emulator import ImdsEmulator
from helpers.waiting import wait_for

GPUCLOUD = [sys.executable, "-m", "gpucloud"]
HERE = Path(__file__).parent
STEPS = 20
PAUSE_AT = 5  # attempt 1 holds at this step until the stop flag is there: the notice's step is known


def _env(tmp_path: Path) -> dict[str, str]:
    env = dict(os.environ)
    for name in ("GPUCLOUD_QUEUE", "AWS_EC2_METADATA_SERVICE_ENDPOINT", "GPUCLOUD_CHECKPOINT_URI", "GPUCLOUD_JOB_ID"):
        env.pop(name, None)
    env["GPUCLOUD_HOME"] = str(tmp_path / "home")
    env["OMP_NUM_THREADS"] = "1"
    return env


def _gpucloud(env: dict[str, str], *argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([*GPUCLOUD, *argv], env=env, capture_output=True, text=True, timeout=300)


def _interrupted_then_resumed(tmp_path: Path, script: str, framework_dir: str) -> None:
    env = _env(tmp_path)
    durable = tmp_path / "durable"
    train = [sys.executable, str(HERE / script), "--steps", str(STEPS)]
    command = [*train, "--out", str(tmp_path / "interrupted.pt"), "--pause-at", str(PAUSE_AT)]
    command += ["--paused-file", str(tmp_path / "paused")]
    submitted = _gpucloud(env, "submit", "--job-id", "fw", "--checkpoint-uri", str(durable), "--", *command)
    assert submitted.returncode == 0, submitted.stderr

    # The uninterrupted reference trains alongside, outside spot-train (the callback then does nothing).
    reference = subprocess.Popen(
        [*train, "--out", str(tmp_path / "reference.pt"), "--output-dir", str(tmp_path / "reference")],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    with ImdsEmulator() as node:
        spot = [*GPUCLOUD, "spot-train", "--job-id", "fw", "--imds-endpoint", node.endpoint, "--poll-interval", "0.1"]
        proc = subprocess.Popen(
            [*spot, "--output", "json"], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        wait_for((tmp_path / "paused").exists, 240, f"attempt 1 to reach step {PAUSE_AT}", proc=proc)
        node.spot_interruption("terminate", lead_seconds=120)
        out, err = proc.communicate(timeout=240)
    assert proc.returncode == 75, err[-3000:]
    first = json.loads(out)
    assert first["state"] == "queued" and first["attempt"] == 2
    assert not (tmp_path / "interrupted.pt").exists()
    pointer = json.loads((durable / "fw" / framework_dir / "LATEST").read_text())
    assert pointer["step"] == PAUSE_AT and pointer["attempt"] == 1

    resumed = _gpucloud(env, "spot-train", "--job-id", "fw", "--no-imds", "--output", "json")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert json.loads(resumed.stdout)["state"] == "finished"
    _, ref_err = reference.communicate(timeout=240)
    assert reference.returncode == 0, ref_err[-3000:]
    assert weights_identical(tmp_path / "interrupted.pt", tmp_path / "reference.pt")

    report = json.loads(_gpucloud(env, "job", "show", "fw", "--output", "json").stdout)
    (stop,) = report["interruptions"]
    assert stop["cause"] == "spot-interruption" and stop["stopped_with"] is None  # the ranks exited by themselves
    assert stop["committed_step"] == stop["resumed_step"] == PAUSE_AT
    assert stop["steps_lost"] == 0


@pytest.mark.slow
def test_hf_trainer_interrupted_by_a_notice_resumes_bitwise_identical(tmp_path: Path) -> None:
    pytest.importorskip("transformers", reason="pip install 'gpucloud[frameworks]'")
    _interrupted_then_resumed(tmp_path, "hf_train.py", "hf-trainer")


@pytest.mark.slow
def test_lightning_interrupted_by_a_notice_resumes_bitwise_identical(tmp_path: Path) -> None:
    pytest.importorskip("lightning", reason="pip install 'gpucloud[frameworks]'")
    _interrupted_then_resumed(tmp_path, "lightning_train.py", "lightning")
