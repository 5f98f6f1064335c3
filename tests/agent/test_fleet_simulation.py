"""The local fleet simulation: three agents as separate processes on this machine, each with its
own IMDS emulator as its "node" and its own control directories, run a 2-node gang job with real
torchrun (gloo). One node is noticed: every rank on both nodes saves the same step, the job is
requeued once, the survivor and the standby run attempt 2, and the final weights are bitwise
identical to an uninterrupted run."""

from __future__ import annotations

import dataclasses
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gpucloud.jobs.demo import weights_identical
from gpucloud.jobs.model import JobState, NodeState
from gpucloud.queue.sqlite import SqliteQueue
from gpucloud.signals.imds_emulator import ImdsEmulator
from jobqueue.aws_fixtures import aws_job_plane  # noqa: F401  (fixture: the job plane on the session moto server)

from .conftest import CLI, wait_for
from .gated_train import held_marker

STEPS = 30
# The example, held at a step boundary until the notice is out (run_noticed_gang opens the gate).
GATED_EXAMPLE = Path(__file__).with_name("gated_train.py")
NODES = ("a", "b", "standby")  # a and b form the gang; a is noticed; the standby joins attempt 2


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def train(*, out: Path, nproc: int, standalone: bool, step_seconds: float) -> list[str]:
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        *(["--standalone"] if standalone else []),
        f"--nproc-per-node={nproc}",
        str(GATED_EXAMPLE),
        "--steps",
        str(STEPS),
        "--seed",
        "7",
        "--step-seconds",
        str(step_seconds),
        "--out",
        str(out),
    ]


def start_agent(
    env,
    tmp_path: Path,
    name: str,
    emulator: ImdsEmulator,
    port: int,
    *,
    slot_lease: float = 6,
    idle_exit: float = 8,
    extra: tuple[str, ...] = (),
) -> subprocess.Popen:
    """One node's agent as a process, on its own IMDS emulator; ``extra``: more agent flags."""
    argv = [
        *CLI,
        "agent",
        "--imds-endpoint",
        emulator.endpoint,
        "--poll-interval",
        "0.2",
        "--address",
        "127.0.0.1",
        "--rendezvous-port",
        str(port),
        "--run-dir",
        str(tmp_path / name / "run"),
        "--slot-lease",
        f"{slot_lease:g}",
        "--idle-exit",
        f"{idle_exit:g}",
        *extra,
        "--output",
        "json",
    ]
    return subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


@dataclasses.dataclass(frozen=True)
class NoticedGang:
    """What one run of the simulation left behind (the agents have all exited)."""

    noticed_at: float  # time.time() when node a's emulator announced the interruption
    gang: dict[int, str]  # attempt 1: slot -> worker id
    outputs: dict[str, tuple[str, str]]  # agent name -> (stdout, stderr)
    codes: dict[str, int]  # agent name -> exit code


def run_noticed_gang(
    queue: SqliteQueue,
    job_id: str,
    env: dict[str, str],
    work: Path,
    *,
    notice_after_step: int,
    notice_lead: float = 120.0,
    exit_timeout: float = 180.0,
) -> NoticedGang:
    """The simulation (this test and ``benchmarks/bench_fleet.py``): agents a and b, each with its own
    IMDS emulator as its node, take the 2-node gang ``job_id``; once node a's rank passed
    ``notice_after_step`` the standby agent joins, a's emulator announces a spot interruption, and
    all three agents run until they exit. Agents still running after ``exit_timeout`` are killed.

    Attempt 1 is held past ``notice_after_step`` until the notice is out (``gated_train.py``): on a
    loaded machine the standby agent can take longer to start than the rest of the training."""
    port = free_port()
    gate = work / "notice-sent"
    env = {**env, "GPUCLOUD_TEST_GATE": str(gate), "GPUCLOUD_TEST_GATE_AFTER": str(notice_after_step)}
    env["GPUCLOUD_METRICS_LINGER"] = "0"  # the noticed agent exits at once (it may hold /metrics' port)
    emulators = {
        name: ImdsEmulator(
            instance_id=f"i-00000000000000{n:03d}", instance_type="g5.xlarge", instance_life_cycle="spot"
        ).__enter__()
        for n, name in enumerate(NODES)
    }
    procs: dict[str, subprocess.Popen] = {}
    try:
        for name in ("a", "b"):
            procs[name] = start_agent(env, work, name, emulators[name], port)
        wait_for(lambda: queue.get(job_id).state is JobState.RUNNING, 60, "the gang of a and b to start")
        gang = {c.slot: c.worker for c in queue.slot_claims(job_id, 1)}
        wait_for(held_marker(gate).exists, 90, f"attempt 1 to finish step {notice_after_step} and wait at the gate")
        # The standby node joins the fleet while the gang trains: idle, nothing to claim.
        procs["standby"] = start_agent(env, work, "standby", emulators["standby"], port)
        wait_for(lambda: len(queue.nodes()) == len(NODES), 60, "the standby agent to report itself")
        noticed_at = time.time()
        emulators["a"].spot_interruption("terminate", lead_seconds=notice_lead)
        gate.touch()
        outputs = {name: proc.communicate(timeout=exit_timeout) for name, proc in procs.items()}
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.kill()
        for emulator in emulators.values():
            emulator.__exit__(None, None, None)
    return NoticedGang(
        noticed_at=noticed_at, gang=gang, outputs=outputs, codes={name: proc.returncode for name, proc in procs.items()}
    )


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["sqlite", "aws"])
def test_a_noticed_gang_member_is_replaced_by_the_standby_and_the_job_ends_bitwise_identical(
    tmp_path,
    env,
    gpucloud_home,
    backend,
    request,
):
    """On the embedded queue, and on SQS + DynamoDB (moto server): there the agents find their
    slots through the slot messages, keep them hidden while they work, and the requeue's messages
    bring the survivor and the standby to attempt 2."""
    durable = tmp_path / "durable"
    if backend == "sqlite":
        queue = SqliteQueue(gpucloud_home / "queue.db")
    else:
        from gpucloud.queue.locations import open_queue

        plane = request.getfixturevalue("aws_job_plane")
        queue = open_queue(plane["uri"])
        # os.environ now has the moto server's endpoint and fake credentials (set by the fixture).
        # tmp_path stands in for the cluster's shared file system: the queue is AWS, so a local
        # checkpoint path must be declared shared for the next attempt's nodes to be allowed it.
        env = {**env, **os.environ, "GPUCLOUD_QUEUE": plane["uri"], "GPUCLOUD_SHARED_PATHS": str(tmp_path)}
    request.addfinalizer(queue.close)
    from gpucloud.jobs.model import JobSpec

    job = queue.submit(
        JobSpec(
            command=train(out=tmp_path / "gang.pt", nproc=1, standalone=True, step_seconds=0.15),
            checkpoint_uri=str(durable),
            nodes=2,
        ),
        job_id="sim",
    )
    # The uninterrupted reference: the same 2 ranks on one node, no notice.
    reference = subprocess.Popen(
        [
            *CLI,
            "spot-train",
            "--no-imds",
            "--checkpoint-uri",
            str(durable),
            "--output",
            "json",
            "--",
            *train(out=tmp_path / "reference.pt", nproc=2, standalone=True, step_seconds=0.0),
        ],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    notice_after_step = 3
    run = run_noticed_gang(queue, job.id, env, tmp_path, notice_after_step=notice_after_step)
    noticed_at, members, outputs = run.noticed_at, run.gang, run.outputs
    assert run.codes == {"a": 75, "b": 0, "standby": 0}, {n: o[1][-2000:] for n, o in outputs.items()}

    # Exactly one requeue; attempt 2 ran on the survivor plus the standby.
    after = queue.get(job.id)
    assert (after.state, after.attempt) == (JobState.FINISHED, 2)
    events = queue.events(job.id)
    assert [e.kind for e in events].count("requeue") == 1
    summaries = {name: json.loads(out.splitlines()[-1]) for name, (out, _) in outputs.items()}
    ran_2 = {name for name, s in summaries.items() for r in s["ran"] if r["attempt"] == 2}
    assert ran_2 == {"b", "standby"}
    assert {c.worker for c in queue.slot_claims(job.id, 2)} == {
        summaries["b"]["worker"],
        summaries["standby"]["worker"],
    }
    assert summaries["a"]["stopped_by"] == "spot-interruption"
    assert set(members.values()) == {summaries["a"]["worker"], summaries["b"]["worker"]}

    # Every rank on both nodes stopped at the same step, and attempt 2 resumed from it.
    acks = [e for e in events if e.kind == "ack" and e.attempt == 1]
    commits = [e for e in events if e.kind == "commit" and e.attempt == 1]
    assert len(acks) == 2 and len({e.data["step"] for e in acks}) == 1  # one ack per node, one step
    (stop_step,) = {e.data["step"] for e in commits}
    # The ranks were held at the end of step notice_after_step + 1 when the notice went out: whether
    # they stop at that step or the next depends on when the flag reaches them, never earlier.
    assert stop_step == acks[0].data["step"] > notice_after_step
    resumed = {e.data.get("step") for e in events if e.kind == "resume" and e.attempt == 2}
    assert resumed == {stop_step}

    _, ref_err = reference.communicate(timeout=180)
    assert reference.returncode == 0, ref_err[-2000:]
    assert weights_identical(tmp_path / "gang.pt", tmp_path / "reference.pt")

    # The fleet's view: three agents, all stopped now, the noticed one was a spot node.
    nodes = {n.id: n for n in queue.nodes()}
    assert {n.state for n in nodes.values()} == {NodeState.STOPPED}
    assert nodes[summaries["a"]["worker"]].lifecycle == "spot"

    # What the simulation measures (printed for the report; benchmarks/ keeps the numbers).
    first = {
        kind: min(e.at for e in events if e.kind == kind and e.attempt == n)
        for kind, n in (("ack", 1), ("commit", 1), ("started", 2))
    }
    last_ack = max(e.at for e in acks)
    started_2 = [e.at for e in events if e.kind == "started" and e.attempt == 2]
    print(
        f"\nnotice->every node acked {last_ack - noticed_at:.2f}s, notice->commit {first['commit'] - noticed_at:.2f}s, "
        f"commit->attempt 2 running on both {max(started_2) - first['commit']:.2f}s"
    )
