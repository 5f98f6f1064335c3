"""One CLI language across the commands: exit codes, flag names, error style, JSON keys and times, tables."""

from __future__ import annotations

import datetime
import io
import json
import re
import sys
import time
from pathlib import Path

import pytest

from gpucloud.output import iso_times, print_table

from .test_cli import one_line_error, run

MATRIX = Path(__file__).resolve().parents[2] / "images" / "versions.yaml"
ISO_UTC = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z")


def test_worker_once_exits_non_zero_when_its_job_failed(capsys):
    run(capsys, "submit", "--job-id", "bad", "--max-attempts", "1", "--", sys.executable, "-c", "raise SystemExit(3)")
    code, out, _ = run(capsys, "worker", "--no-imds", "--once", "--output", "json")
    assert json.loads(out)["jobs"] == [{"job_id": "bad", "state": "failed", "exit_code": 3}]
    assert code == 3 and json.loads(out)["exit_code"] == 3


def test_agent_exit_after_attempts_is_its_own_flag_and_not_submits_crash_limit(capsys):
    for n in range(2):
        run(capsys, "submit", "--job-id", f"a-{n}", "--", sys.executable, "-c", "pass")
    agent = ["agent", "--no-imds", "--poll-interval", "0.1", "--output", "json"]
    code, out, err = run(capsys, *agent, "--exit-after-attempts", "1")
    summary = json.loads(out.splitlines()[-1])
    assert code == 0 and [r["job_id"] for r in summary["ran"]] == ["a-0"]
    code, _, err = run(capsys, *agent, "--max-attempts", "1")  # submit's crash limit: no flag of the agent
    assert code == 2 and "No such option '--max-attempts'" in one_line_error(err)
    helped = run(capsys, "agent", "--help")[1]
    assert "--exit-after-attempts" in helped and "--max-attempts" not in helped


@pytest.mark.parametrize(
    "argv, expected",
    [
        (["jobs", "--state", "sleeping"], "Invalid value for '--state'"),
        (["jobs", "--no-such-flag"], "No such option '--no-such-flag' (see `gpucloud jobs --help`)"),
        (["job", "show"], "Missing argument 'JOB'"),
        (["no-such-command"], "No such command 'no-such-command'"),
        (["worker", "--max-jobs", "0"], "--max-jobs"),
        (["image", "check", "--matrix", "/nonexistent/versions.yaml"], "/nonexistent/versions.yaml"),
        (["job", "show", "nope"], "no job 'nope'"),  # a UserError: the same style
    ],
)
def test_usage_errors_and_user_errors_are_one_line_in_one_style(capsys, argv, expected):
    code, out, err = run(capsys, *argv)
    assert code == 2 and out == ""
    assert expected in one_line_error(err)


def test_every_json_output_names_a_job_job_id_and_gives_times_in_iso_8601_utc(capsys):
    outputs = {}
    out = run(capsys, "submit", "--job-id", "j-1", "--output", "json", "--", sys.executable, "-c", "pass")[1]
    outputs["submit"] = json.loads(out)
    outputs["jobs"] = json.loads(run(capsys, "jobs", "--output", "json")[1])[0]
    outputs["worker"] = json.loads(run(capsys, "worker", "--no-imds", "--once", "--output", "json")[1])["jobs"][0]
    outputs["job show"] = json.loads(run(capsys, "job", "show", "j-1", "--output", "json")[1])
    out = run(capsys, "spot-train", "--no-imds", "--output", "json", "--", sys.executable, "-c", "pass")[1]
    outputs["spot-train"] = json.loads(out)
    run(capsys, "submit", "--job-id", "j-2", "--", sys.executable, "-c", "pass")
    out = run(capsys, "agent", "--no-imds", "--poll-interval", "0.1", "--exit-after-attempts", "1", "-o", "json")[1]
    agent_lines = [json.loads(line) for line in out.splitlines()]
    outputs["agent"] = agent_lines[-1]["ran"][0]
    outputs["agent status"] = next(line for line in agent_lines if line.get("job_id"))
    outputs["nodes"] = json.loads(run(capsys, "nodes", "--all", "--output", "json")[1])[0]
    for command, data in outputs.items():
        assert "job_id" in data and "id" not in data, command
    times = [
        outputs["submit"]["created_at"],
        outputs["jobs"]["updated_at"],
        outputs["job show"]["attempts"][0]["started_at"],
        outputs["job show"]["timeline"][0]["at"],
        outputs["agent status"]["at"],
        outputs["nodes"]["updated_at"],
    ]
    for value in times:
        assert ISO_UTC.fullmatch(value), value
        parsed = datetime.datetime.fromisoformat(value.replace("Z", "+00:00"))
        assert abs(parsed.timestamp() - time.time()) < 3600


def test_iso_times_converts_only_numbers_under_time_keys():
    data = {"at": 0, "created_at": 1.5, "deadline_s": 3.0, "nested": [{"ended_at": None, "started_at": "x"}], "n": 7}
    assert iso_times(data) == {
        "at": "1970-01-01T00:00:00.000Z",
        "created_at": "1970-01-01T00:00:01.500Z",
        "deadline_s": 3.0,
        "nested": [{"ended_at": None, "started_at": "x"}],
        "n": 7,
    }


def test_image_check_takes_the_matrix_as_render_and_doctor_do(capsys):
    code, out, _ = run(capsys, "image", "check", "--matrix", str(MATRIX), "--output", "json")
    assert code == 0 and json.loads(out)["file"] == str(MATRIX)
    for sub in ("check", "render"):
        assert "--matrix" in run(capsys, "image", sub, "--help")[1]
    assert "FILE" not in run(capsys, "image", "check", "--help")[1].split("Options")[0]
    code, _, err = run(capsys, "image", "check", str(MATRIX))  # a file is given with --matrix, as everywhere
    assert code == 2 and "unexpected extra argument" in one_line_error(err)


LONG_ID = "llama-70b-pretrain-run-2026-11-24-a"


def test_an_80_column_jobs_table_shows_whole_job_ids_and_states(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "80")
    command = ["python", "-m", "torch.distributed.run", "--nproc-per-node", "8", "train.py", "--config", "x" * 80]
    run(capsys, "submit", "--job-id", LONG_ID, "--name", "pretraining-of-a-big-model", "--", *command)
    code, out, _ = run(capsys, "jobs")
    assert code == 0 and max(len(line) for line in out.splitlines()) <= 80, out
    assert LONG_ID in out and "queued" in out, out


def test_tables_fold_long_values_instead_of_cutting_them():
    from rich.console import Console

    console = Console(width=80, file=io.StringIO(), color_system=None)
    print_table("t", ["job", "state", "reason"], [[LONG_ID, "cancelling", "r" * 150 + "END"]], console=console)
    text = console.file.getvalue()
    assert LONG_ID in text and "cancelling" in text and "END" in text and "…" not in text, text


def test_columns_that_cannot_fit_even_folded_are_left_out_and_named_never_a_key_value():
    from rich.console import Console

    console = Console(width=80, file=io.StringIO(), color_system=None)
    columns = ["id", "state", "worker", "updated", "command"]
    print_table(None, columns, [[LONG_ID, "running", "w" * 30, "2026-11-24 05:40:00", "c" * 70]], console=console)
    text = console.file.getvalue()
    assert LONG_ID in text and "running" in text and max(len(line) for line in text.splitlines()) <= 80, text
    assert "left out at 80 columns: command" in " ".join(text.split()), text
