"""`gpucloud jobs` and `gpucloud job show` follow a real `spot-train` run: the
example training script under the supervisor, its step and steps/s shown while it trains, its last
step once it ended (here cancelled, which saves a step)."""

from __future__ import annotations

import json
import re
import subprocess
import sys

from gpucloud.offline.demo import EXAMPLE
from gpucloud.queue.connect import open_queue
from helpers.waiting import wait_for

from .test_cli import run


def test_jobs_and_job_show_follow_a_real_spot_train_run(capsys, monkeypatch, tmp_path):
    monkeypatch.setenv("COLUMNS", "200")  # the table's columns whole, whatever the terminal
    train = [sys.executable, str(EXAMPLE), "--steps", "1000000", "--step-seconds", "0.02"]
    assert run(capsys, "submit", "--job-id", "live", "--", *train)[0] == 0
    stderr = tmp_path / "spot-train.err"
    with open(stderr, "w") as err_file:
        proc = subprocess.Popen(
            [sys.executable, "-m", "gpucloud", "spot-train", "--no-imds", "--job-id", "live"],
            stdout=subprocess.DEVNULL,
            stderr=err_file,
        )
    queue = open_queue(None)

    def reported_rate() -> float | None:
        assert proc.poll() is None, stderr.read_text()
        return queue.get("live").step_rate

    try:
        wait_for(reported_rate, timeout=120, what="spot-train to report a step rate")
        code, out, _ = run(capsys, "jobs", "--output", "json")
        [row] = json.loads(out)
        assert code == 0 and row["state"] == "running" and row["last_step"] >= 1 and row["step_rate"] > 0
        assert row["progress_at"] is not None
        code, out, _ = run(capsys, "jobs")
        assert code == 0 and "steps/s" in out and re.search(r"live .*running", out)
        code, out, _ = run(capsys, "job", "show", "live")
        assert code == 0 and re.search(r"progress: step \d+ at [\d.e+-]+ steps/s", out), out
        report = json.loads(run(capsys, "job", "show", "live", "--output", "json")[1])
        [attempt] = report["attempts"]
        assert attempt["state"] == "running" and attempt["last_step"] >= row["last_step"] and attempt["step_rate"]
        assert report["last_step"] == attempt["last_step"] and report["step_rate"] == attempt["step_rate"]
        assert run(capsys, "job", "cancel", "live", "--grace", "60")[0] == 0
        proc.wait(timeout=120)
    finally:
        queue.close()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130, stderr.read_text()
    [ended] = json.loads(run(capsys, "jobs", "--output", "json")[1])
    assert ended["state"] == "cancelled" and ended["step_rate"] is None
    assert ended["last_step"] >= row["last_step"]
    [attempt] = json.loads(run(capsys, "job", "show", "live", "--output", "json")[1])["attempts"]
    assert attempt["last_step"] == ended["last_step"] and attempt["step_rate"] is None
