"""The local fleet simulation: three agents as separate processes on this machine, each with its
own IMDS emulator as its "node" and its own control directories, run a 2-node gang job with real
torchrun (gloo). One node is noticed: every rank on both nodes saves the same step, the job is
requeued once, the survivor and the standby run attempt 2, and the final weights are bitwise
identical to an uninterrupted run."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gpucloud.lifecycle.model import JobState, NodeState
from gpucloud.offline import local_fleet as local
from gpucloud.offline.demo import weights_identical
from gpucloud.offline.local_fleet import NoticedGang
from gpucloud.queue.sqlite import SqliteQueue
from jobqueue.aws_fixtures import aws_job_plane  # noqa: F401  (fixture: the job plane on the session moto server)

from .conftest import CLI
from .gated_train import GATED_EXAMPLE, held_marker

STEPS = 30


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


def run_noticed_gang(
    queue: SqliteQueue,
    job_id: str,
    env: dict[str, str],
    work: Path,
    *,
    notice_after_step: int,
    notice_lead: float = 120.0,
    exit_timeout: float = 300.0,
) -> NoticedGang:
    """The simulation (this test and ``benchmarks/bench_fleet.py``): ``gpucloud drill --local``'s
    fleet run (``offline/local_fleet.py``) with attempt 1 held past ``notice_after_step`` until the notice is
    out (``gated_train.py``; ``train()`` runs it): on a loaded machine the ranks could otherwise
    finish before the notice comes. The notice goes out once a rank waits at the gate, instead of
    once the queue shows the step."""
    gate = work / "notice-sent"
    env = {**env, "GPUCLOUD_TEST_GATE": str(gate), "GPUCLOUD_TEST_GATE_AFTER": str(notice_after_step)}
    return local.run_noticed_gang(
        queue,
        job_id,
        env,
        work,
        notice_after_step=notice_after_step,
        notice_lead=notice_lead,
        exit_timeout=exit_timeout,
        reached=held_marker(gate).exists,
        after_notice=gate.touch,
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
        from gpucloud.queue.connect import open_queue

        plane = request.getfixturevalue("aws_job_plane")
        queue = open_queue(plane["uri"])
        # os.environ now has the moto server's endpoint and fake credentials (set by the fixture).
        # tmp_path stands in for the cluster's shared file system: the queue is AWS, so a local
        # checkpoint path must be declared shared for the next attempt's nodes to be allowed it.
        env = {**env, **os.environ, "GPUCLOUD_QUEUE": plane["uri"], "GPUCLOUD_SHARED_PATHS": str(tmp_path)}
    request.addfinalizer(queue.close)
    from gpucloud.lifecycle.model import JobSpec

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
