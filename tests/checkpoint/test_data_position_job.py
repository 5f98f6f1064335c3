"""`gpucloud job show` says whether a resume brought the data position back:
examples/train_data.py under `gpucloud spot-train`, interrupted by a spot notice from the IMDS
emulator, resumed by `gpucloud worker --once`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import REPO
from gpucloud import control
from gpucloud.offline.imds_emulator import ImdsEmulator

GPUCLOUD = [sys.executable, "-m", "gpucloud"]
STEPS = 30


def _gpucloud(env, *argv) -> subprocess.CompletedProcess:
    return subprocess.run([*GPUCLOUD, *argv], env=env, capture_output=True, text=True, timeout=240)


def _records(path: Path) -> list[list[int]]:
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    return [row["samples"] for row in rows]


@pytest.mark.slow
@pytest.mark.parametrize(
    ("forget", "expected"),
    [(False, "data_position=restored"), (True, "data_position=not restored: no extra_state")],
    ids=["stateful-loader", "no-extra-state"],
)
def test_job_show_says_whether_the_data_position_came_back(tmp_path, forget, expected):
    env = dict(os.environ, GPUCLOUD_HOME=str(tmp_path / "home"), PYTHONPATH=str(REPO / "src"))
    for name in ("GPUCLOUD_QUEUE", "AWS_EC2_METADATA_SERVICE_ENDPOINT"):
        env.pop(name, None)
    record = tmp_path / "batches.jsonl"
    example = [sys.executable, str(REPO / "examples" / "train_data.py"), "--steps", str(STEPS), "--step-seconds", "0.2"]
    flags = ["--forget-data-position"] if forget else []
    command = [*example, "--record", str(record), *flags]
    submitted = _gpucloud(env, "submit", "--job-id", "data", "--checkpoint-uri", str(tmp_path / "ck"), "--", *command)
    assert submitted.returncode == 0, submitted.stderr
    with ImdsEmulator() as node_a:
        proc = subprocess.Popen(
            [*GPUCLOUD, "spot-train", "--job-id", "data", "--imds-endpoint", node_a.endpoint, "--poll-interval", "0.2"],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        ctl = tmp_path / "home" / "run" / "data" / "attempt-1" / "control"
        deadline = time.monotonic() + 180
        while (progress := control.read(ctl, control.PROGRESS)) is None or progress["step"] < 3:
            assert proc.poll() is None, proc.communicate()[1]
            assert time.monotonic() < deadline, "attempt 1 never reached step 3"
            time.sleep(0.02)  # polling a file the training process writes
        node_a.spot_interruption("terminate", lead_seconds=120)
        _, err = proc.communicate(timeout=180)
    assert proc.returncode == 75, err
    with ImdsEmulator() as node_b:
        done = _gpucloud(env, "worker", "--once", "--imds-endpoint", node_b.endpoint)
    assert done.returncode == 0, done.stderr

    report = json.loads(_gpucloud(env, "job", "show", "data", "--output", "json").stdout)
    (resume,) = [e for e in report["timeline"] if e["kind"] == "resume" and e["attempt"] == 2]
    assert expected in resume["detail"]
    human = _gpucloud(env, "job", "show", "data").stdout
    assert "data_position" in human

    # What the line says is true: the resumed run's batches are (or are not) the uninterrupted run's.
    (stop,) = report["interruptions"]
    resumed_at = stop["resumed_step"]
    assert resumed_at >= 3
    seen = _records(record)  # attempt 1's steps 1..resumed_at, then attempt 2's
    assert len(seen) == STEPS
    reference = tmp_path / "reference.jsonl"
    uri = ["--checkpoint-uri", str(tmp_path / "ref"), "--job-id", "ref"]
    ran = subprocess.run(
        [*example, "--record", str(reference), *uri, *flags], env=env, capture_output=True, text=True, timeout=240
    )
    assert ran.returncode == 0, ran.stderr
    uninterrupted = _records(reference)
    assert seen[:resumed_at] == uninterrupted[:resumed_at]
    assert (seen[resumed_at:] == uninterrupted[resumed_at:]) is (not forget)
