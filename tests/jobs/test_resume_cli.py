"""`gpucloud job resume` from the shell: text, JSON, one-line refusals, --help."""

from __future__ import annotations

import json
import sys

from .test_cli import one_line_error, run


def test_resume_a_cancelled_job_then_it_runs_under_its_id(capsys):
    run(capsys, "submit", "--job-id", "train-1", "--", sys.executable, "-c", "pass")
    run(capsys, "job", "cancel", "train-1")
    code, out, _ = run(capsys, "job", "resume", "train-1")
    assert (
        code == 0
        and out.strip() == "resumed train-1: attempt 2 is queued and restores step 0: nothing of it was committed"
    )
    code, out, _ = run(capsys, "worker", "--once", "--output", "json")
    assert code == 0 and json.loads(out)["jobs"] == [{"job_id": "train-1", "state": "finished", "exit_code": 0}]
    report = json.loads(run(capsys, "job", "show", "train-1", "--output", "json")[1])
    assert [a["state"] for a in report["attempts"]] == ["cancelled", "finished"]
    assert "resubmit" in [e["kind"] for e in report["timeline"]]


def test_resume_refuses_queued_running_and_finished_jobs_in_one_line(capsys):
    run(capsys, "submit", "--job-id", "waiting", "--", sys.executable, "-c", "pass")
    code, out, err = run(capsys, "job", "resume", "waiting")
    assert code == 2 and out == ""
    assert "job waiting is queued (attempt 1); resume takes failed or cancelled jobs" in one_line_error(err)
    run(capsys, "worker", "--once")
    code, _, err = run(capsys, "job", "resume", "waiting")
    assert code == 2 and "finished; there is nothing to resume" in one_line_error(err)
    code, _, err = run(capsys, "job", "resume", "nope")
    assert code == 2 and "no job 'nope'" in one_line_error(err)


def test_spot_train_on_a_cancelled_job_points_at_resume(capsys):
    run(capsys, "submit", "--job-id", "stopped", "--", sys.executable, "-c", "pass")
    run(capsys, "job", "cancel", "stopped")
    code, _, err = run(capsys, "spot-train", "--no-imds", "--job-id", "stopped")
    assert code == 2 and "`gpucloud job resume stopped` gives it a new attempt" in one_line_error(err)


def test_resume_help_teaches(capsys):
    code, out, _ = run(capsys, "job", "resume", "--help")
    assert code == 0
    for expected in ("failed or cancelled", "newest committed checkpoint", "finished job", "gpucloud job resume"):
        assert expected in " ".join(out.split())
