"""`gpucloud job cancel` from the shell: text and JSON, `cancelled` shown by `jobs` and `job show`,
one-line refusals."""

from __future__ import annotations

import json
import sys

from gpucloud.lifecycle.model import AttemptEnd, AttemptState
from gpucloud.queue.connect import open_queue

from .test_cli import one_line_error, run


def test_cancel_a_queued_job_then_see_it_everywhere(capsys):
    run(capsys, "submit", "--job-id", "train-1", "--", "python", "train.py")
    code, out, _ = run(capsys, "job", "cancel", "train-1")
    assert code == 0 and out.startswith("cancelled train-1: cancelled while queued")
    code, out, _ = run(capsys, "jobs", "--state", "cancelled", "--output", "json")
    assert [(j["job_id"], j["state"]) for j in json.loads(out)] == [("train-1", "cancelled")]
    code, out, _ = run(capsys, "jobs")
    assert "cancelled" in out
    code, out, _ = run(capsys, "job", "show", "train-1", "--output", "json")
    report = json.loads(out)
    assert report["state"] == "cancelled" and report["attempts"][0]["state"] == "cancelled"
    assert [e["kind"] for e in report["timeline"]][-2:] == ["cancel", "cancelled"]
    code, out, err = run(capsys, "worker", "--once")  # it never runs
    assert code == 0 and "no queued jobs" in err


def test_cancel_a_running_job_as_json_says_it_is_cancelling(capsys):
    run(capsys, "submit", "--job-id", "train-2", "--", "python", "train.py")
    queue = open_queue(None)
    queue.claim("w", lease_seconds=600, job_id="train-2")
    code, out, _ = run(capsys, "job", "cancel", "train-2", "--grace", "30", "--output", "json")
    row = json.loads(out)
    assert code == 0 and row["state"] == "running" and row["cancel_requested_at"] is not None
    code, out, _ = run(capsys, "jobs")
    assert "cancelling" in out
    code, out, _ = run(capsys, "job", "show", "train-2")
    assert "cancel requested" in out
    detail = [e["detail"] for e in json.loads(run(capsys, "job", "show", "train-2", "--output", "json")[1])["timeline"]]
    assert "cancel: every rank saves a step, deadline +30.0s" in detail
    queue.end_attempt("train-2", 1, AttemptEnd(state=AttemptState.REQUEUED, committed_step=4))
    code, out, _ = run(capsys, "job", "show", "train-2", "--output", "json")
    assert json.loads(out)["state"] == "cancelled"


def test_cancel_refuses_a_finished_job_and_an_unknown_one_in_one_line(capsys):
    run(capsys, "submit", "--job-id", "done", "--", sys.executable, "-c", "pass")
    assert run(capsys, "spot-train", "--no-imds", "--job-id", "done")[0] == 0
    code, out, err = run(capsys, "job", "cancel", "done")
    assert code == 2 and out == ""
    assert one_line_error(err).endswith("job done is already finished; there is nothing to cancel")
    code, _, err = run(capsys, "job", "cancel", "nope")
    assert code == 2 and "no job 'nope'" in one_line_error(err)
    code, _, err = run(capsys, "job", "cancel", "done", "--grace", "0")
    assert code == 2 and "--grace" in err


def test_cancel_help_teaches(capsys):
    code, out, _ = run(capsys, "job", "cancel", "--help")
    assert code == 0
    for expected in ("never requeued", "--grace", "130", "gpucloud job cancel j-4f2a9c01de"):
        assert expected in out


def test_names_work_where_ids_do_and_an_ambiguous_one_lists_its_matches(capsys):
    run(capsys, "submit", "--job-id", "a-1", "--name", "llama", "--", "python", "train.py")
    run(capsys, "submit", "--job-id", "b-1", "--name", "sweep", "--", "python", "train.py")
    run(capsys, "submit", "--job-id", "b-2", "--name", "sweep", "--", "python", "train.py")
    assert json.loads(run(capsys, "job", "show", "llama", "--output", "json")[1])["job_id"] == "a-1"
    code, out, _ = run(capsys, "job", "cancel", "llama", "--output", "json")
    assert code == 0 and json.loads(out)["job_id"] == "a-1"
    code, out, _ = run(capsys, "job", "resume", "llama")
    assert code == 0 and out.startswith("resumed a-1:")
    for argv in (["job", "show", "sweep"], ["job", "cancel", "sweep"], ["job", "resume", "sweep"]):
        code, out, err = run(capsys, *argv)
        line = one_line_error(err)
        assert code == 2 and out == "" and "2 jobs are named 'sweep': b-2 (queued" in line and "b-1 (queued" in line
