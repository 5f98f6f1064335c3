"""Dead-agent benchmark: a gang member's agent dies; its ranks save with the gang before they go.

    .venv/bin/python benchmarks/bench_dead_agent.py [--trials 3]

Each trial runs the scenario of ``tests/agent/test_dead_agent_queue_mode.py`` (its
``run_dead_agent_gang``, not a copy): agents a and b, each with its own IMDS emulator, run a 2-node
gang with real torchrun (gloo) and consume an events queue (SQS on a local moto server). Node a's
agent is killed -9: its guard flags a's ranks (as a notice would), the ranks' collective makes b's
ranks save the same step, and a's ranks go once it is committed; later the reference EventBridge
spot warning for a's instance closes a's record. Measured from the kill:

* kill → commit (every rank on both nodes saved the same step);
* kill → requeue (attempt 2 is queued).

Goals, checked in every trial: both nodes acked the same committed step, the attempt was requeued
exactly once as REQUEUED (max_attempts=1: a crash would have failed the job), and the commit
landed within the guard's save grace (half the job lease), before any other worker could take the job.

Writes benchmarks/results/dead-agent.json; exit 1 when a goal is missed. Needs the test extra (moto).
"""

from __future__ import annotations

import argparse
import logging
import os
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # the scenario lives in the test package
sys.path.insert(1, str(ROOT / "tests"))  # ... and imports its neighbours as pytest does (`fleet.samples`)

from tests.agent.test_dead_agent_queue_mode import orphan_job, run_dead_agent_gang  # noqa: E402
from tests.conftest import FAKE_AWS, moto_endpoint, reset_account  # noqa: E402

from gpucloud import control  # noqa: E402
from gpucloud.agent.loop import EXIT_STOPPED  # noqa: E402
from gpucloud.jobs.supervisor import SupervisorConfig  # noqa: E402
from gpucloud.lifecycle.model import AttemptState  # noqa: E402
from gpucloud.queue.sqlite import SqliteQueue  # noqa: E402
from node_env import NODE_ENV  # noqa: E402
from report import config_of, finish  # noqa: E402  (benchmarks/report.py)

RESULTS = ROOT / "benchmarks" / "results" / "dead-agent.json"
SAVE_GRACE_S = SupervisorConfig().lease_seconds / 2  # what the runner gives a dead supervisor's ranks


def one_trial(work: Path, endpoint: str) -> dict:
    import boto3

    reset_account(endpoint)
    os.environ.update({**FAKE_AWS, "AWS_ENDPOINT_URL": endpoint})
    env = {k: v for k, v in os.environ.items() if k not in NODE_ENV} | {"GPUCLOUD_HOME": str(work / "home")}
    sqs = boto3.client("sqs")
    events_queue = sqs.create_queue(QueueName="gpucloud-events")["QueueUrl"]
    queue = SqliteQueue(work / "home" / "queue.db")
    try:
        job = orphan_job(queue, work / "durable", "bench")
        run = run_dead_agent_gang(queue, job.id, env, work, sqs, events_queue)
        if run.survivor[0] != EXIT_STOPPED:  # stopped by the scenario once the warning was handled
            raise RuntimeError(f"node b's agent exited {run.survivor[0]}: {run.survivor[2][-1500:]}")
        events = queue.events(job.id)
        first = queue.attempts(job.id)[0]
    finally:
        queue.close()
    acks = {name: control.read(path, control.ACK) for name, path in run.controls.items()}
    committed = min(e.at for e in events if e.kind == "commit" and e.attempt == 1)
    requeued = min(e.at for e in events if e.kind == "requeue")
    return {
        "kill_to_commit_s": round(committed - run.killed_at, 4),
        "kill_to_requeue_s": round(requeued - run.killed_at, 4),
        "ack_steps": {name: (a or {}).get("step") for name, a in acks.items()},
        "committed_step": first.committed_step,
        "attempt_1": first.state.value,
        "requeues": sum(1 for e in events if e.kind == "requeue"),
        "crashes": sum(1 for e in events if e.kind == "crash"),
    }


def trial_goals(row: dict) -> dict[str, bool]:
    return {
        "both_nodes_saved_the_committed_step": set(row["ack_steps"].values()) == {row["committed_step"]},
        "requeued_once_without_a_crash": row["requeues"] == 1
        and row["crashes"] == 0
        and row["attempt_1"] == AttemptState.REQUEUED.value,
        "committed_within_the_save_grace": row["kill_to_commit_s"] < SAVE_GRACE_S,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trials", type=int, default=3, help="scenarios to run (each ~30 s here)")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    if args.trials < 1:
        parser.error("--trials must be at least 1")
    logging.basicConfig(level=logging.ERROR)
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-dead-agent-") as tmp, moto_endpoint() as endpoint:
        for trial in range(args.trials):
            print(
                f"trial {trial + 1}/{args.trials}: a 2-node gang, node a's agent killed, its ranks saved by its guard, "
                "a spot warning on the events queue ...",
                file=sys.stderr,
                flush=True,
            )
            work = Path(tmp) / f"trial-{trial}"
            work.mkdir()
            rows.append(one_trial(work, endpoint))
    goals_per_trial = [trial_goals(r) for r in rows]
    summary = {"trials": len(rows)}
    for key in ("kill_to_commit_s", "kill_to_requeue_s"):
        values = [r[key] for r in rows]
        summary |= {f"{key}_median": round(statistics.median(values), 4), f"{key}_max": round(max(values), 4)}
    report = {
        "benchmark": "dead-agent",
        "config": config_of(
            args,
            gang_nodes=2,
            ranks_per_node=1,
            backend="gloo",
            queue="sqlite",
            events_queue="sqs (moto)",
            save_grace_s=SAVE_GRACE_S,
        ),
        "trials": rows,
        "summary": summary,
        "goals_met": {name: all(g[name] for g in goals_per_trial) for name in goals_per_trial[0]},
    }
    return finish(args.out, report)


if __name__ == "__main__":
    sys.exit(main())
