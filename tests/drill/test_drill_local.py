"""``gpucloud drill --local`` through the real CLI: the offline drill on the local fleet passes and
prints its verdict as JSON; bad input gets one line and exit 2 before anything starts."""

from __future__ import annotations

import json
import os

import pytest

from cli_run import one_line_error, run_cli
from node_env import NODE_ENV
from test_docs_examples import ALL as DOC_EXAMPLES
from test_docs_examples import run_example

CHECKS = ["commit-within-lead", "one-step", "one-requeue", "resumed-at-commit", "steps-lost", "job-finished"]


@pytest.fixture(autouse=True)
def isolated(tmp_path, monkeypatch):
    """No queue, node or AWS credentials of the developer's: the drill must use only its own."""
    monkeypatch.setenv("GPUCLOUD_HOME", str(tmp_path / "home"))
    for name in NODE_ENV:
        monkeypatch.delenv(name, raising=False)
    for name in [k for k in os.environ if k.startswith("AWS_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")


@pytest.mark.slow
def test_the_offline_drill_as_the_docs_print_it_passes_and_prints_its_verdict_as_json(tmp_path):
    """docs/drill.md's example, run as printed (test_docs_examples leaves it to this test): three agents,
    a 2-node gang, a notice on node a's emulator, the standby takes its place (~40 s here: two torchrun
    attempts of a short job; one run for the whole path)."""
    (example,) = [e for e in DOC_EXAMPLES if e.doc == "docs/drill.md" and " --local " in e.command]
    proc = run_example(example, tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    verdict = json.loads(proc.stdout)
    assert verdict["verdict"] == "pass"
    assert [c["name"] for c in verdict["checks"]] == CHECKS
    assert all(c["passed"] and set(c) == {"name", "passed", "value", "limit", "detail"} for c in verdict["checks"])
    assert (verdict["injector"], verdict["target"], verdict["lead_seconds"]) == ("imds-emulator", "a", 120.0)
    assert verdict["stack"] == "p4d-spot" and verdict["experiment"] is None
    assert (verdict["job_state"], verdict["attempts"]) == ("finished", 2)
    assert verdict["injected_at"].endswith("Z")  # ISO 8601 UTC, as every time in gpucloud's JSON
    timeline = verdict["timeline"]
    assert timeline["committed_step"] == timeline["resumed_step"] >= 1
    assert 0 <= timeline["notice_to_commit_s"] < 120 and timeline["steps_lost"] <= 1
    # Progress went to stderr, the verdict alone to stdout.
    assert "spot interruption announced on node a" in proc.stderr


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["--stack", "nope", "--local"], "no stack named 'nope'"),
        (["--stack", "p5-capacity-block", "--local"], "stack p5-capacity-block has no spot node group"),
        (
            ["--stack", "p4d-spot", "--local", "--steps", "5", "--notice-at-step", "5"],
            "--notice-at-step must be between 1 and --steps - 1 (4), got 5",
        ),
        (["--stack", "p4d-spot", "--local", "--steps", "1"], "--steps"),
        (["--stack", "p4d-spot", "--local", "--timeout", "0"], "--timeout"),
        (["--stack", "p4d-spot", "--workdir", "x"], "--workdir and --keep are for the offline drill: add --local"),
        (["--stack", "dev"], "stack dev has no drill template: set `gpucloud:drill: true`"),
        (
            ["--stack", "p4d-spot"],
            "no AWS credentials found for the drill on the cluster; configure them, or add --local",
        ),
        ([], "give exactly one of --stack NAME or --stack-file PATH"),  # --local alone drills p4d-spot
    ],
    ids=[
        "unknown-stack",
        "no-spot-group",
        "notice-after-the-end",
        "too-few-steps",
        "no-time",
        "workdir-on-a-cluster",
        "no-drill-template",
        "no-credentials",
        "no-stack",
    ],
)
def test_bad_input_gets_one_line_and_exit_2(capsys, argv, says):
    code, out, err = run_cli(capsys, "drill", *argv)
    assert code == 2 and out == ""
    assert says in one_line_error(err)


def test_on_a_cluster_the_drill_reads_the_stack_through_the_automation_api(capsys, monkeypatch, tmp_path):
    """With credentials, the cluster path opens the Pulumi stack for its outputs: without the pulumi CLI
    (as here) that is one line saying what to install, before anything is submitted."""
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("PATH", str(tmp_path))  # no pulumi binary on it, whatever this machine has
    code, out, err = run_cli(capsys, "drill", "--stack", "p4d-spot")
    assert code == 2 and out == ""
    assert "the pulumi CLI is not installed" in one_line_error(err)


def test_a_drill_that_runs_out_of_time_says_what_it_waited_for_and_keeps_its_logs(capsys, tmp_path):
    """Past --timeout: exit 1 (no verdict), one error line naming the wait, the agents stopped, the work
    directory kept for their logs."""
    workdir = tmp_path / "drill"
    argv = ["drill", "--stack", "p4d-spot", "--local", "--timeout", "1", "--workdir", str(workdir)]
    code, out, err = run_cli(capsys, *argv)
    assert code == 1 and out == ""
    lines = err.strip().splitlines()
    assert lines[-1].startswith("gpucloud: error: drill timed out after 1s waiting for "), err
    assert lines[-1].endswith(f"(raise --timeout); queue and logs kept in {workdir}")
    assert "Traceback" not in err and all(line.startswith("gpucloud drill: ") for line in lines[:-1])
    assert (workdir / "queue.db").exists() and (workdir / "agent-logs" / "a.err").exists()


def test_a_workdir_that_is_not_empty_is_refused_before_anything_starts(capsys, tmp_path):
    (tmp_path / "old.txt").write_text("someone's files")
    code, out, err = run_cli(capsys, "drill", "--stack", "p4d-spot", "--local", "--workdir", str(tmp_path))
    assert code == 2 and out == ""
    assert f"--workdir {tmp_path} is not empty" in one_line_error(err)
    assert [p.name for p in tmp_path.iterdir()] == ["old.txt"]
