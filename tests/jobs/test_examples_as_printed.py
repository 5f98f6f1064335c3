"""The documented examples run as printed (spot-train --job-id of a new job; a command run by a
Python without the training API says so)."""

from __future__ import annotations

import json
import sys

from gpucloud.commands import spot_train

from .test_cli import one_line_error, run


def test_spot_train_job_id_records_a_new_job_under_that_id(capsys, tmp_path):
    ckpt = str(tmp_path / "ckpt")
    argv = ["spot-train", "--no-imds", "--job-id", "llama-7b", "--checkpoint-uri", ckpt, "--output", "json"]
    code, out, err = run(capsys, *argv, "--", sys.executable, "-c", "pass")
    assert code == 0, err
    summary = json.loads(out)
    assert summary["job_id"] == "llama-7b" and summary["state"] == "finished"
    shown = json.loads(run(capsys, "jobs", "--output", "json")[1])
    assert [(j["job_id"], j["command"]) for j in shown] == [("llama-7b", [sys.executable, "-c", "pass"])]


def test_spot_train_job_id_of_a_queued_job_accepts_the_same_command_line_again(capsys, tmp_path):
    ckpt = str(tmp_path / "ckpt")
    command = ["--", sys.executable, "-c", "pass"]
    run(capsys, "submit", "--job-id", "again", "--checkpoint-uri", ckpt, *command)
    code, _, err = run(capsys, "spot-train", "--no-imds", "--job-id", "again", "--checkpoint-uri", ckpt, *command)
    assert code == 0, err
    run(capsys, "submit", "--job-id", "other", "--checkpoint-uri", ckpt, *command)
    code, _, err = run(
        capsys, "spot-train", "--no-imds", "--job-id", "other", "--checkpoint-uri", str(tmp_path / "elsewhere")
    )
    assert code == 2 and "only apply to new jobs; job other keeps the settings it was submitted with" in err
    assert f"--checkpoint-uri {ckpt})" in one_line_error(err)


def test_spot_train_job_id_of_no_job_without_a_command_says_how_to_start_it(capsys):
    code, _, err = run(capsys, "spot-train", "--no-imds", "--job-id", "nope")
    line = one_line_error(err)
    assert code == 2 and "no job 'nope'" in line and "gpucloud spot-train --job-id nope -- COMMAND" in line


def test_a_command_whose_python_lacks_torch_gets_one_line_naming_the_interpreter(capsys, monkeypatch):
    monkeypatch.setattr(spot_train, "_hints_given", set())
    # -S: no site-packages, as a system python run because the virtualenv was not activated
    code, _, err = run(
        capsys, "spot-train", "--no-imds", "--max-attempts", "2", "--", sys.executable, "-S", "-c", "import torch"
    )
    assert code == 1
    hints = [line for line in err.splitlines() if "is not the environment gpucloud runs in" in line]
    assert len(hints) == 1 and "no module 'torch'" in hints[0] and sys.executable in hints[0], err


def test_a_crash_for_another_reason_gets_no_interpreter_line():
    assert spot_train.interpreter_hint("command exited with code 1; last output: ValueError: bad lr") is None
    assert spot_train.interpreter_hint("ModuleNotFoundError: No module named 'torchvision'") is None
    assert spot_train.interpreter_hint("ModuleNotFoundError: No module named 'gpucloud.checkpoint'") is not None
