"""A gang member's node dies (agent, torchrun and ranks killed with SIGKILL): the attempt fails over
to attempt 2 exactly once, the survivor and a standby run it from the last committed checkpoint,
and the job finishes.

Two routes lead to attempt 2 and both go through the queue's exactly-once ``end_attempt``: the
survivor's ranks lose their gloo peer and fail (attempt 1 CRASHED, what a dead node usually
causes), or, for a member that hangs instead, its slot lease runs out and an agent's sweep requeues
the attempt (``gang.fail_over``, contract-tested on both backends)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from gpucloud.lifecycle.model import AttemptState, JobSpec, JobState
from gpucloud.offline.local_fleet import free_port
from gpucloud.queue.sqlite import SqliteQueue
from helpers.waiting import wait_for

from .conftest import CLI
from .gated_train import GATED_EXAMPLE, held_marker


def descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (torchrun's ranks run in sessions of their own, not its group)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry.name))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def start_agent(env, tmp_path: Path, name: str, port: int) -> subprocess.Popen:
    return subprocess.Popen(
        [
            *CLI,
            "agent",
            "--no-imds",
            "--poll-interval",
            "0.2",
            "--rendezvous-port",
            str(port),
            "--run-dir",
            str(tmp_path / name / "run"),
            "--slot-lease",
            "4",
            "--idle-exit",
            "6",
            "--output",
            "json",
        ],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


@pytest.mark.slow
def test_a_killed_member_fails_the_attempt_over_once_and_the_job_finishes(tmp_path, env, gpucloud_home):
    queue = SqliteQueue(gpucloud_home / "queue.db")
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc-per-node=1",
        str(GATED_EXAMPLE),
        "--steps",
        "20",
        "--seed",
        "3",
        "--step-seconds",
        "0.15",
        "--every-steps",
        "2",
        "--out",
        str(tmp_path / "out.pt"),
    ]
    job = queue.submit(
        JobSpec(command=command, checkpoint_uri=str(tmp_path / "durable"), nodes=2, max_attempts=3), job_id="lost"
    )
    # Training holds past step 4 until the gate opens: attempt 1 cannot finish before node b dies, however
    # slowly a loaded machine starts the standby (gated_train.py).
    gate = tmp_path / "b-killed"
    env = {**env, "GPUCLOUD_TEST_GATE": str(gate), "GPUCLOUD_TEST_GATE_AFTER": "4"}
    port = free_port()
    procs = {"a": start_agent(env, tmp_path, "a", port), "b": start_agent(env, tmp_path, "b", port)}
    try:
        wait_for(lambda: queue.get(job.id).state is JobState.RUNNING, 60, "the gang to start")
        wait_for(held_marker(gate).exists, 90, "attempt 1 to reach step 4")
        procs["standby"] = start_agent(env, tmp_path, "standby", port)
        wait_for(lambda: len(queue.nodes()) == 3, 60, "the standby to report itself")
        # Node b dies: its agent, torchrun and ranks, all at once, with no chance to clean up.
        victims = [procs["b"].pid, *descendants(procs["b"].pid)]
        for pid in victims:
            os.kill(pid, signal.SIGKILL)
        gate.touch()  # rank a cannot pass a step without b; attempt 2 must not be held
        outputs = {name: procs[name].communicate(timeout=180) for name in ("a", "standby")}
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.kill()
    assert {n: procs[n].returncode for n in ("a", "standby")} == {"a": 0, "standby": 0}, {
        n: o[1][-2000:] for n, o in outputs.items()
    }
    after = queue.get(job.id)
    assert (after.state, after.attempt) == (JobState.FINISHED, 2)
    assert [e.kind for e in queue.events(job.id)].count("requeue") == 1
    ran_2 = {
        name for name, (out, _) in outputs.items() for r in json.loads(out.splitlines()[-1])["ran"] if r["attempt"] == 2
    }
    assert ran_2 == {"a", "standby"}
    first = queue.attempts(job.id)[0]
    assert first.state in (AttemptState.CRASHED, AttemptState.REQUEUED), first
    resumed = [e.data.get("step") for e in queue.events(job.id) if e.kind == "resume" and e.attempt == 2]
    assert resumed and all(step is not None and step >= 4 for step in resumed)
