"""Queue mode end to end: a 2-node gang whose node a loses its AGENT (killed -9). a's training does
not outlive its supervisor (its guard kills it), but it does not die unsaved either: a's guard flags a's ranks
as a notice would, the ranks' collective makes b's ranks save the same step, and the attempt is
requeued exactly once as REQUEUED (no crash counted) before a's ranks go. When the EventBridge spot
warning for a's instance then arrives on the events queue (moto SQS), the surviving agent's consumer
finds a's agent dead and closes its record as stopped; there is no running attempt left to stop.

a's agent dies while its own events-queue consumer is in a long poll; SQS may hand the warning to
that dead poll, and the consumer's short receive visibility brings it back to b within seconds
(the printed flag latency is then about 5 s instead of about 1 s)."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import boto3
import pytest

from gpucloud import control
from gpucloud.agent.loop import EXIT_STOPPED
from gpucloud.checkpoint.store import latest_committed
from gpucloud.lifecycle.model import AttemptState, Job, JobSpec, JobState, NodeState
from gpucloud.offline.demo import EXAMPLE
from gpucloud.offline.imds_emulator import ImdsEmulator
from gpucloud.offline.local_fleet import free_port, start_agent
from gpucloud.queue.sqlite import SqliteQueue
from helpers.waiting import wait_for
from signals import eventbridge_samples as samples  # the reference's EventBridge payloads

from .test_lost_member import descendants

SLOT_LEASE = 3.0


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


@dataclasses.dataclass(frozen=True)
class DeadAgentRun:
    """What one run of the scenario left behind (every process has exited)."""

    killed_at: float  # time.time() when node a's agent was killed
    warned_at: float  # time.time() when the spot warning was put on the events queue
    instances: dict[str, str]  # node name -> instance id
    a_worker: str  # node a's agent (killed)
    controls: dict[str, Path]  # node name -> attempt 1's control directory
    survivor: tuple[int, str, str]  # node b's agent (stopped by SIGTERM at the end): exit code, stdout, stderr


def run_dead_agent_gang(
    queue: SqliteQueue,
    job_id: str,
    env: dict[str, str],
    work: Path,
    sqs,
    events_queue: str,
    *,
    warn_after_step: int = 3,
) -> DeadAgentRun:
    """The scenario (this test and ``benchmarks/bench_dead_agent.py``): agents a and b, each with its
    own IMDS emulator, run the 2-node gang ``job_id`` and consume ``events_queue``; once b's rank
    passed ``warn_after_step``, a's agent is killed -9 (its guard flags a's ranks to save, then they
    go); once the attempt ended and a's record is silent for a slot lease, a spot warning for a's
    instance goes on the events queue; once b's consumer closed a's record, b is stopped (SIGTERM).
    Returns when b's agent exited and a's ranks are gone."""
    port = free_port()
    instances = {"a": samples.INSTANCE, "b": samples.OTHER_INSTANCE}
    emulators = {
        name: ImdsEmulator(instance_id=i, instance_type="g5.xlarge", instance_life_cycle="spot").__enter__()
        for name, i in instances.items()
    }
    procs: dict[str, subprocess.Popen] = {}
    orphans: list[int] = []
    try:
        for name in ("a", "b"):
            procs[name] = start_agent(
                env,
                work,
                name,
                emulators[name],
                port,
                slot_lease=SLOT_LEASE,
                # b must outlive the warning's delivery, which can take a visibility timeout when
                # SQS handed it to a's dead poll first: the test stops b once it was handled.
                idle_exit=3 if name == "a" else 300,
                extra=("--gang-timeout", "2", "--events-queue", events_queue),
            )
        wait_for(lambda: queue.get(job_id).state is JobState.RUNNING, 60, "the gang of a and b to start")
        controls = {name: work / name / "run" / job_id / "attempt-1" / "control" for name in ("a", "b")}
        wait_for(
            lambda: (p := control.read(controls["b"], control.PROGRESS)) is not None and p["step"] >= warn_after_step,
            90,
            f"attempt 1 to reach step {warn_after_step}",
        )
        # Node a's agent dies; its guard asks a's ranks to save before they go with it.
        orphans = descendants(procs["a"].pid)
        if not orphans:
            raise AssertionError("node a's torchrun should be running")
        killed_at = time.time()
        procs["a"].send_signal(signal.SIGKILL)
        procs["a"].wait(10)
        wait_for(lambda: queue.get(job_id).attempt == 2, 120, "attempt 1 to be requeued after a's agent died")
        a_worker = next(n.id for n in queue.nodes() if n.instance_id == instances["a"])
        wait_for(
            lambda: time.time() - next(n for n in queue.nodes() if n.id == a_worker).updated_at > SLOT_LEASE,
            30,
            "node a's agent record to go silent for a slot lease",
        )
        warned_at = time.time()
        warning = samples.spot_warning(instances["a"], time=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(warned_at)))
        sqs.send_message(QueueUrl=events_queue, MessageBody=json.dumps(warning))
        wait_for(
            lambda: next(n for n in queue.nodes() if n.id == a_worker).state is NodeState.STOPPED,
            120,
            "b's events consumer to close node a's record",
        )
        procs["b"].send_signal(signal.SIGTERM)  # idle: b stops at once
        out_b, err_b = procs["b"].communicate(timeout=120)
        wait_for(lambda: not any(alive(pid) for pid in orphans), 30, "node a's ranks to exit after saving")
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.kill()
        for pid in orphans:
            if alive(pid):
                os.kill(pid, signal.SIGKILL)
        for emulator in emulators.values():
            emulator.__exit__(None, None, None)
    return DeadAgentRun(
        killed_at=killed_at,
        warned_at=warned_at,
        instances=instances,
        a_worker=a_worker,
        controls=controls,
        survivor=(procs["b"].returncode, out_b, err_b),
    )


def orphan_job(queue: SqliteQueue, durable: Path, job_id: str) -> Job:
    """The gang job of the scenario: 600 steps of 0.1 s, at most one attempt (a crash would fail it)."""
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc-per-node=1",
        str(EXAMPLE),
        "--steps",
        "600",
        "--seed",
        "5",
        "--step-seconds",
        "0.1",
    ]
    return queue.submit(JobSpec(command=command, checkpoint_uri=str(durable), nodes=2, max_attempts=1), job_id=job_id)


@pytest.mark.slow
def test_a_node_whose_agent_died_saves_with_its_gang_and_its_spot_warning_closes_its_record(
    tmp_path, gpucloud_home, fresh_aws_account
):
    env = dict(os.environ)  # the moto endpoint and fake credentials (fresh_aws_account), GPUCLOUD_HOME
    sqs = boto3.client("sqs")
    events_queue = sqs.create_queue(QueueName="gpucloud-events")["QueueUrl"]
    queue = SqliteQueue(gpucloud_home / "queue.db")
    durable = tmp_path / "durable"
    job = orphan_job(queue, durable, "orphans")
    run = run_dead_agent_gang(queue, job.id, env, tmp_path, sqs, events_queue)
    a_worker, controls = run.a_worker, run.controls
    code_b, out_b, err_b = run.survivor
    assert code_b == EXIT_STOPPED, err_b[-3000:]  # the test's SIGTERM, once the warning was handled

    # Requeued once as REQUEUED: the lost member cost no attempt (max_attempts=1 would have FAILED it).
    after = queue.get(job.id)
    assert (after.state, after.attempt, after.crashes) == (JobState.QUEUED, 2, 0), after
    first = queue.attempts(job.id)[0]
    assert first.state is AttemptState.REQUEUED and first.committed_step is not None, first
    events = queue.events(job.id)
    kinds = [e.kind for e in events]
    # The warning came after the requeue: nothing was left to stop through the table.
    assert kinds.count("requeue") == 1 and kinds.count("stop-request") == 0 and "crash" not in kinds

    # Every rank on both nodes saved the same step: a's, flagged by its guard, and b's, through the collective.
    assert control.read(controls["a"], control.PREEMPT)["kind"] == "supervisor-lost"
    step = first.committed_step
    assert control.read(controls["a"], control.ACK)["step"] == control.read(controls["b"], control.ACK)["step"] == step
    assert control.read(controls["a"], control.COMMITTED)["step"] == step
    assert latest_committed(str(durable), job.id) == step

    # The dead agent's record is closed with the reason; the message is gone from the queue.
    lost = {n.id: n for n in queue.nodes()}[a_worker]
    assert lost.state is NodeState.STOPPED and "agent found dead at a spot-interruption notice" in lost.reason
    depth = sqs.get_queue_attributes(QueueUrl=events_queue, AttributeNames=["All"])["Attributes"]
    assert (depth["ApproximateNumberOfMessages"], depth["ApproximateNumberOfMessagesNotVisible"]) == ("0", "0")
    summary = json.loads(out_b.splitlines()[-1])
    assert [(r["attempt"], r["state"]) for r in summary["ran"]] == [(1, "requeued")]
    commit = next(e for e in events if e.kind == "commit")
    print(f"\na's agent killed -> the gang's commit {commit.at - run.killed_at:.2f}s")
