"""`gpucloud agent` and `gpucloud nodes` as a user runs them (a separate process each)."""

from __future__ import annotations

import json
import subprocess
import sys
import time

from click.testing import CliRunner

from gpucloud.commands.nodes import nodes
from gpucloud.lifecycle.model import JobSpec, NodeRecord, NodeState
from gpucloud.queue.sqlite import SqliteQueue

from .conftest import CLI


def gpucloud(env, *argv, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([*CLI, *argv], env=env, capture_output=True, text=True, timeout=timeout)


def test_agent_runs_queued_jobs_and_prints_json_lines(env, gpucloud_home):
    queue = SqliteQueue(gpucloud_home / "queue.db")
    job = queue.submit(JobSpec(command=[sys.executable, "-c", "print('hello from the job')"]))
    done = gpucloud(env, "agent", "--no-imds", "--idle-exit", "0.5", "--poll-interval", "0.1", "--output", "json")
    assert done.returncode == 0, done.stderr
    lines = [json.loads(line) for line in done.stdout.splitlines()]
    assert [line["state"] for line in lines if line["event"] == "status"][:3] == ["idle", "waiting", "running"]
    summary = lines[-1]
    assert summary["event"] == "summary" and summary["exit_code"] == 0
    assert summary["ran"] == [
        {"job_id": job.id, "attempt": 1, "slot": 0, "nodes": 1, "state": "finished", "exit_code": 0}
    ]
    assert "hello from the job" in done.stderr  # the job's output goes to stderr, stdout stays JSON


def test_agent_bad_flags_are_one_line_errors(env):
    done = gpucloud(env, "agent", "--no-imds", "--stop-margin", "40", "--grace", "30")
    assert done.returncode == 2
    assert done.stderr.strip() == "gpucloud: error: --stop-margin (40s) must be smaller than --grace (30s)"
    bad_queue = gpucloud(env, "agent", "--no-imds", "--queue", "redis://x")
    assert bad_queue.returncode == 2 and "unsupported queue URI 'redis://x'" in bad_queue.stderr
    assert "Traceback" not in bad_queue.stderr


def test_agent_help_teaches_gangs_and_exit_codes(env):
    text = gpucloud(env, "agent", "--help").stdout
    assert "--node-rank SLOT" in text and "75 stopped by an interruption notice" in text


def test_nodes_lists_agents_with_state_type_lifecycle_and_job(gpucloud_home):
    queue = SqliteQueue(gpucloud_home / "queue.db")
    now = time.time()
    queue.register_node(
        NodeRecord(
            id="i-1:10",
            address="10.0.0.1",
            state=NodeState.RUNNING,
            instance_type="p5.48xlarge",
            lifecycle="spot",
            job_id="llama",
            attempt=2,
            slot=1,
            updated_at=now,
        )
    )
    queue.register_node(
        NodeRecord(
            id="i-2:10",
            address="10.0.0.2",
            state=NodeState.IDLE,
            instance_type="p5.48xlarge",
            lifecycle="on-demand",
            updated_at=now - 3600,
        )
    )
    queue.register_node(
        NodeRecord(
            id="i-3:10",
            address="10.0.0.3",
            state=NodeState.STOPPED,
            updated_at=now,
            reason="spot-interruption from the events queue; its agent was dead",
        )
    )
    runner = CliRunner()
    shown = json.loads(runner.invoke(nodes, ["--output", "json"]).output)
    assert [(n["worker"], n["state"], n["lifecycle"], n["job_id"], n["slot"]) for n in shown] == [
        ("i-1:10", "running", "spot", "llama", 1)
    ]
    everything = json.loads(runner.invoke(nodes, ["--all", "--output", "json"]).output)
    assert [n["state"] for n in everything] == ["running", "silent", "stopped"]
    assert [n["reason"] for n in everything] == [
        None,
        None,
        "spot-interruption from the events queue; its agent was dead",
    ]
    table = runner.invoke(nodes, ["--all"], env={"COLUMNS": "250"}).output
    assert "p5.48xlarge" in table and "on-demand" in table and "silent" in table and "its agent was dead" in table
