"""Real torchrun (2 ranks, gloo) under `gpucloud spot-train`: interrupted through the IMDS emulator,
requeued, resumed by `gpucloud worker` on a "new node", bitwise identical to an uninterrupted run."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gpucloud import control
from gpucloud.offline.demo import opening_lines, training_command, weights_identical
from gpucloud.offline.imds_emulator import ImdsEmulator

GPUCLOUD = [sys.executable, "-m", "gpucloud"]
STEPS = 30


def gpucloud(env, *argv, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([*GPUCLOUD, *argv], env=env, capture_output=True, text=True, timeout=180, **kw)


@pytest.mark.slow
def test_torchrun_interrupted_by_a_spot_notice_resumes_elsewhere_bitwise_identical(tmp_path, e2e_env):
    durable = tmp_path / "durable"
    home = Path(e2e_env["GPUCLOUD_HOME"])
    command = training_command(steps=STEPS, seed=7, step_seconds=0.1, out=tmp_path / "interrupted.pt")
    reference = training_command(steps=STEPS, seed=7, step_seconds=0.0, out=tmp_path / "reference.pt")
    assert (
        gpucloud(e2e_env, "submit", "--job-id", "e2e", "--checkpoint-uri", str(durable), "--", *command).returncode == 0
    )

    # The uninterrupted reference trains alongside (its own job, same seed).
    ref_proc = subprocess.Popen(
        [*GPUCLOUD, "spot-train", "--no-imds", "--checkpoint-uri", str(durable), "--output", "json", "--", *reference],
        env=e2e_env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    with ImdsEmulator() as node_a:
        proc = subprocess.Popen(
            [
                *GPUCLOUD,
                "spot-train",
                "--job-id",
                "e2e",
                "--imds-endpoint",
                node_a.endpoint,
                "--poll-interval",
                "0.2",
                "--local-checkpoint-dir",
                str(tmp_path / "node-a"),
                "--output",
                "json",
            ],
            env=e2e_env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        ctl = home / "run" / "e2e" / "attempt-1" / "control"
        deadline = time.monotonic() + 120
        while (progress := control.read(ctl, control.PROGRESS)) is None or progress["step"] < 5:
            assert proc.poll() is None, proc.communicate()[1]
            assert time.monotonic() < deadline, "attempt 1 never reached step 5"
            time.sleep(0.02)  # polling a file the training process writes
        node_a.spot_interruption("terminate", lead_seconds=120)
        out, err = proc.communicate(timeout=120)
    assert proc.returncode == 75, err
    assert "ChildFailedError" not in err and "Traceback" not in err, err  # a requeue is no crash
    first = json.loads(out)
    assert first["state"] == "queued" and first["attempt"] == 2
    assert not (tmp_path / "interrupted.pt").exists()

    # Attempt 2 on a "new node": a fresh emulator and an empty local tier; restores from durable.
    with ImdsEmulator() as node_b:
        done = gpucloud(
            e2e_env,
            "worker",
            "--once",
            "--imds-endpoint",
            node_b.endpoint,
            "--local-checkpoint-dir",
            str(tmp_path / "node-b"),
            "--output",
            "json",
        )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["jobs"] == [{"job_id": "e2e", "state": "finished", "exit_code": 0}]

    _, ref_err = ref_proc.communicate(timeout=180)
    assert ref_proc.returncode == 0, ref_err
    assert weights_identical(tmp_path / "interrupted.pt", tmp_path / "reference.pt")

    report = json.loads(gpucloud(e2e_env, "job", "show", "e2e", "--output", "json").stdout)
    (stop,) = report["interruptions"]
    assert stop["cause"] == "spot-interruption" and stop["stopped_with"] is None  # the ranks exited by themselves
    assert stop["steps_lost"] is not None and stop["steps_lost"] <= 1
    assert stop["resumed_step"] == stop["committed_step"] >= 5
    resume_2 = [e for e in report["timeline"] if e["kind"] == "resume" and e["attempt"] == 2]
    assert "source_tier=durable" in resume_2[0]["detail"]
    kinds = [e["kind"] for e in report["timeline"]]
    assert kinds.count("requeue") == 1 and kinds.count("flag") == 1


@pytest.mark.slow
def test_demo_reports_at_most_one_step_lost_and_bitwise_identical_weights(e2e_env):
    done = subprocess.run(
        [*GPUCLOUD, "demo", "--output", "json"], env=e2e_env, capture_output=True, text=True, timeout=180
    )
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["bitwise_identical"] is True
    assert report["steps_lost"] is not None and report["steps_lost"] <= 1
    assert report["attempts"] == 2 and report["resumed_from_tier"] == "durable"
    assert report["notice_to_commit_s"] is not None and report["commit_before_deadline_s"] > 0
    # Without --keep nothing of the demo stays behind: not its work directory, not its attempts' logs.
    home = Path(e2e_env["GPUCLOUD_HOME"])
    assert not list(home.glob("logs/demo-*")), sorted(p.name for p in home.glob("logs/*"))


def test_demo_opening_lines_fit_80_columns():
    for device in ("cpu", "cuda"):
        for line in opening_lines("demo-0123ab", "demo-ref-0123ab", 1_000_000, nproc=2, device=device):
            assert len(line) <= 80, line
