"""Fleet benchmark: a gang interrupted across nodes, and the scaling decision at queue depth.

    .venv/bin/python benchmarks/bench_fleet.py [--trials 3] [--depths 1 10 100 1000] [--max-nodes 64]
                                               [--backend sqlite|aws]

**Interruption across nodes**, ``--trials`` times: the fleet simulation of
``tests/agent/test_fleet_simulation.py`` (its ``run_noticed_gang``: ``gpucloud drill --local``'s fleet run,
``src/gpucloud/offline/local_fleet.py``, with the test's gate, not a copy): three ``gpucloud agent``
processes, each with its own IMDS emulator as its "node", run a 2-node gang job with real
torchrun (gloo). While attempt 1 trains, the standby agent joins; then node a's emulator announces
a spot interruption. Measured from that announcement:

* notice → every rank flagged across nodes: the later of the two nodes' ``ack`` control files
  (each node's supervisor acks once all of its ranks have stopped at the agreed step);
* notice → commit: the first ``committed`` control file of attempt 1;
* commit → attempt 2 running on the survivor plus the standby: the later ``started`` of attempt 2.

Goals (behaviour, checked in every trial): both nodes ack the same step, the job is
requeued exactly once, attempt 2 runs on the survivor and the standby (never on the noticed node),
it resumes at the committed step, and the commit lands before the notice's deadline.

**Queue depth → scale decision**: D queued 2-node gangs (every other one with a slot claimed) and
a few agent records in a real SQLite queue; one decision = read the fleet from the queue
(``agent.fleet_view.fleet_state``) + ``fleet.scaling.desired_capacity``. Reported per decision,
with the pure decision alone as the baseline of the same run (listing / pure ratio).

With ``--backend aws`` the trials run on SQS + DynamoDB served by a local moto server: the agents
find their slots through the slot messages and attempt 2's messages bring them back after the
requeue (the scale decisions still read a SQLite queue: they measure the decision, not moto).

Writes benchmarks/results/fleet.json (fleet-aws.json); exit 1 when a goal is missed.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # the simulation's helpers live in the test package
sys.path.insert(1, str(ROOT / "tests"))  # ... and import their fixtures as pytest does (`jobqueue.aws_fixtures`)

from tests.agent.test_fleet_simulation import run_noticed_gang, train  # noqa: E402

from gpucloud import control  # noqa: E402
from gpucloud.agent.fleet_view import fleet_state  # noqa: E402
from gpucloud.agent.scaling import GroupBounds, desired_capacity  # noqa: E402
from gpucloud.lifecycle.model import JobSpec, NodeRecord, NodeState  # noqa: E402
from gpucloud.offline.local_fleet import AGENT_POLL_S, NODE_ENV, NODES  # noqa: E402
from gpucloud.queue import gang  # noqa: E402
from gpucloud.queue.connect import open_queue  # noqa: E402
from gpucloud.queue.protocol import JobQueue  # noqa: E402
from gpucloud.queue.sqlite import SqliteQueue  # noqa: E402
from report import config_of, finish  # noqa: E402  (benchmarks/report.py)

RESULTS = ROOT / "benchmarks" / "results" / "fleet.json"
NOTICE_LEAD_S = 120.0  # a spot interruption's two minutes
NODE_LEASE_S = 3600.0  # the depth runs' agent records stay live for the whole measurement


def open_trial_queue(backend: str, home: Path, endpoint: str | None) -> tuple[JobQueue, dict[str, str]]:
    """A fresh queue for one trial and the environment the agents reach it with."""
    env = {k: v for k, v in os.environ.items() if k not in NODE_ENV} | {"GPUCLOUD_HOME": str(home)}
    if backend == "sqlite":
        return SqliteQueue(home / "queue.db"), env
    from tests.conftest import FAKE_AWS, reset_account
    from tests.jobqueue.aws_fixtures import REGION, create_job_plane

    assert endpoint is not None
    reset_account(endpoint)
    os.environ.update({**FAKE_AWS, "AWS_ENDPOINT_URL": endpoint})  # this process's own queue client
    plane = create_job_plane(endpoint)
    uri = f"aws://{REGION}?table={plane['table']}&queue={plane['queue_url']}"
    return open_queue(uri), env | FAKE_AWS | {"AWS_ENDPOINT_URL": endpoint, "GPUCLOUD_QUEUE": uri}


def one_trial(work: Path, step_seconds: float, notice_after_step: int, backend: str, endpoint: str | None) -> dict:
    queue, env = open_trial_queue(backend, work / "home", endpoint)
    job = queue.submit(
        JobSpec(
            command=train(out=work / "gang.pt", nproc=1, standalone=True, step_seconds=step_seconds),
            checkpoint_uri=str(work / "durable"),
            nodes=2,
        ),
        job_id="bench",
    )
    run = run_noticed_gang(queue, job.id, env, work, notice_after_step=notice_after_step, notice_lead=NOTICE_LEAD_S)
    noticed_at, outputs = run.noticed_at, run.outputs
    if run.codes != {"a": 75, "b": 0, "standby": 0}:
        tails = {name: err[-1500:] for name, (_, err) in outputs.items()}
        raise RuntimeError(f"agent exit codes {run.codes}, expected a=75 b=0 standby=0; stderr tails: {tails}")
    summaries = {name: json.loads(out.splitlines()[-1]) for name, (out, _) in outputs.items()}
    events = queue.events(job.id)
    final = queue.get(job.id)
    queue.close()

    # Each node's own control directory of attempt 1: its ack (all local ranks stopped) and commit.
    acks = {
        name: control.read(work / name / "run" / job.id / "attempt-1" / "control", control.ACK) for name in ("a", "b")
    }
    if any(a is None for a in acks.values()):
        raise RuntimeError(f"a node wrote no ack for attempt 1: {acks}")
    commit_at = min(e.at for e in events if e.kind == "commit" and e.attempt == 1)
    (commit_step,) = {e.data["step"] for e in events if e.kind == "commit" and e.attempt == 1}
    started_2 = [e.at for e in events if e.kind == "started" and e.attempt == 2]
    resumed_2 = {e.data.get("step") for e in events if e.kind == "resume" and e.attempt == 2}
    ran_2 = sorted(name for name, s in summaries.items() for r in s["ran"] if r["attempt"] == 2)
    return {
        "notice_to_notice_seen_s": round(
            min(e.at for e in events if e.kind == "notice" and e.attempt == 1) - noticed_at, 4
        ),
        "notice_to_every_rank_flagged_s": round(max(a["written_at"] for a in acks.values()) - noticed_at, 4),
        "ack_spread_between_nodes_s": round(abs(acks["a"]["written_at"] - acks["b"]["written_at"]), 4),
        "notice_to_commit_s": round(commit_at - noticed_at, 4),
        "commit_to_attempt_2_running_s": round(max(started_2) - commit_at, 4) if len(started_2) == 2 else None,
        "ack_steps": {name: a["step"] for name, a in acks.items()},
        "commit_step": commit_step,
        "resumed_steps": sorted(s for s in resumed_2 if s is not None),
        "requeues": sum(1 for e in events if e.kind == "requeue"),
        "attempt_2_ran_on": ran_2,
        "final": {"state": final.state.value, "attempt": final.attempt},
    }


def trial_goals(row: dict) -> dict[str, bool]:
    return {
        "every_node_acked_the_same_step": len(set(row["ack_steps"].values())) == 1
        and row["commit_step"] in row["ack_steps"].values(),
        "exactly_one_requeue": row["requeues"] == 1,
        "attempt_2_on_survivor_plus_standby": row["attempt_2_ran_on"] == ["b", "standby"]
        and row["commit_to_attempt_2_running_s"] is not None,
        "resumed_at_the_committed_step": row["resumed_steps"] == [row["commit_step"]],
        "committed_before_the_notice_deadline": row["notice_to_commit_s"] < NOTICE_LEAD_S,
        "job_finished_in_attempt_2": row["final"] == {"state": "finished", "attempt": 2},
    }


def fill_queue(path: Path, depth: int) -> SqliteQueue:
    """``depth`` queued 2-node gangs, every other one with slot 0 claimed, and a small fleet of agents."""
    queue = SqliteQueue(path)
    now = time.time()
    for n in range(depth):
        job = queue.submit(JobSpec(command=["train"], nodes=2), job_id=f"gang-{n:04d}")
        if n % 2 == 0:
            gang.claim_slot(queue, f"agent-{n}", "10.0.0.1", lease_seconds=3600, job_id=job.id, now=now)
    for n, state in enumerate((NodeState.RUNNING, NodeState.RUNNING, NodeState.WAITING, NodeState.IDLE)):
        queue.register_node(NodeRecord(id=f"node-{n}", address=f"10.0.1.{n}", state=state, updated_at=now))
    return queue


def timed(fn, min_seconds: float, min_runs: int) -> tuple[list[float], object]:
    """Per-call wall times of ``fn`` over at least ``min_runs`` calls and ``min_seconds``."""
    times: list[float] = []
    result = None
    started = time.perf_counter()
    while len(times) < min_runs or time.perf_counter() - started < min_seconds:
        t0 = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - t0)
    return times, result


def scale_decision_at(work: Path, depth: int, bounds: GroupBounds) -> dict:
    queue = fill_queue(work / f"depth-{depth}.db", depth)
    try:

        def decide():
            return desired_capacity(fleet_state(queue, node_lease=NODE_LEASE_S), bounds)

        full, decision = timed(decide, min_seconds=1.0, min_runs=5)
        state = fleet_state(queue, node_lease=NODE_LEASE_S)
        pure, _ = timed(lambda: desired_capacity(state, bounds), min_seconds=0.2, min_runs=20)
    finally:
        queue.close()
    per_decision = statistics.median(full)
    pure_s = statistics.median(pure)
    return {
        "queued_gangs": depth,
        "unclaimed_slots": sum(g.unclaimed for g in state.waiting),
        "decision_runs": len(full),
        "per_decision_ms_median": round(per_decision * 1e3, 3),
        "per_decision_ms_max": round(max(full) * 1e3, 3),
        "per_queued_gang_us": round(per_decision / depth * 1e6, 2),
        "pure_decision_ms_median": round(pure_s * 1e3, 4),
        "queue_read_to_pure_ratio": round(per_decision / pure_s, 1) if pure_s else None,
        "desired": decision.desired,
        "reason": decision.reason,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trials", type=int, default=3, help="fleet simulations to run (each ~30 s here)")
    parser.add_argument("--step-seconds", type=float, default=0.15, help="extra time per training step")
    parser.add_argument("--notice-after-step", type=int, default=3, help="announce the interruption after this step")
    parser.add_argument("--depths", type=int, nargs="+", default=[1, 10, 100, 1000], help="queued gangs per decision")
    parser.add_argument("--max-nodes", type=int, default=64, help="the group's max size for the decision")
    parser.add_argument(
        "--backend",
        choices=("sqlite", "aws"),
        default="sqlite",
        help="the trials' job queue: the embedded file, or SQS + DynamoDB on a local moto server "
        "(slot messages; needs the test extra)",
    )
    parser.add_argument(
        "--out", type=Path, default=None, help=f"report path (default {RESULTS.parent}/fleet[-aws].json)"
    )
    args = parser.parse_args(argv)
    if args.out is None:
        args.out = RESULTS if args.backend == "sqlite" else RESULTS.with_name("fleet-aws.json")
    if args.trials < 0 or any(d < 1 for d in args.depths) or args.max_nodes < 1:
        parser.error("--trials must be >= 0, every --depths value >= 1 and --max-nodes >= 1")
    logging.basicConfig(level=logging.ERROR)

    rows, goals_per_trial, scaling = [], [], []
    with tempfile.TemporaryDirectory(prefix="bench-fleet-") as tmp, contextlib.ExitStack() as stack:
        endpoint = None
        if args.backend == "aws":
            from tests.conftest import moto_endpoint

            endpoint = stack.enter_context(moto_endpoint())
        for trial in range(args.trials):
            print(
                f"trial {trial + 1}/{args.trials} ({args.backend}): 3 agents, a 2-node gang, a notice on node a ...",
                file=sys.stderr,
                flush=True,
            )
            work = Path(tmp) / f"trial-{trial}"
            work.mkdir()
            rows.append(one_trial(work, args.step_seconds, args.notice_after_step, args.backend, endpoint))
            goals_per_trial.append(trial_goals(rows[-1]))
        bounds = GroupBounds(0, args.max_nodes)
        for depth in args.depths:
            print(f"scale decision at {depth} queued gangs ...", file=sys.stderr, flush=True)
            scaling.append(scale_decision_at(Path(tmp), depth, bounds))

    def stat(key: str, fn) -> float | None:
        values = [r[key] for r in rows if r[key] is not None]
        return round(fn(values), 4) if values else None

    summary = {
        "trials": len(rows),
        **{
            f"{key}_{name}": stat(key, fn)
            for key in ("notice_to_every_rank_flagged_s", "notice_to_commit_s", "commit_to_attempt_2_running_s")
            for name, fn in (("median", statistics.median), ("max", max))
        },
        "scale_decision_ms_by_depth": {r["queued_gangs"]: r["per_decision_ms_median"] for r in scaling},
    }
    goals = {name: all(g[name] for g in goals_per_trial) for name in (goals_per_trial[0] if goals_per_trial else {})}
    report = {
        "benchmark": "fleet",
        "config": config_of(
            args,
            agents=len(NODES),
            gang_nodes=2,
            ranks_per_node=1,
            backend="gloo",
            queue=args.backend,
            agent_poll_interval_s=AGENT_POLL_S,
            notice_lead_s=NOTICE_LEAD_S,
        ),
        "trials": rows,
        "scale_decision": scaling,
        "summary": summary,
        "goals_met": goals,
    }
    return finish(args.out, report)


if __name__ == "__main__":
    sys.exit(main())
