"""Benchmark `gpucloud job show`'s dollars for a job of 100 attempts.

    .venv/bin/python benchmarks/bench_job_cost.py [--attempts 100] [--nodes 4] [--repeat 5]

The job is recorded in an embedded (SQLite) queue through the queue's own API, as a gang of
--nodes spot nodes whose every attempt but the last is stopped by a spot notice and requeued:
per attempt, each member's started/resume/exit events with its node (type, AZ, life cycle), the
notice, flag, ack, commit and requeue — the timeline a real run leaves. Measured:

* in-process, median of --repeat: ``cost.job_cost.job_cost`` over the records with the catalog's
  prices (the pure cost function), and ``cost.timeline.build_timeline`` with and without prices (what
  the cost adds to the report `job show` builds);
* in-process, median of --repeat: rendering the cost section of the table (``render_cost``) and
  the whole report's tables (``render_timeline``) at 80 columns: what the dollars add to the table;
* end to end, median of --repeat fresh processes: ``gpucloud job show JOB --output json`` and the
  table at 80 columns (interpreter start-up, imports, the queue reads, the catalog, rendering).

Goals, on a loaded 2-core machine: the cost function under 100 ms, its table section under 1 s, and
`job show --output json` under 3 s. The table's wall time is reported without a goal: its
timeline (every event of every attempt) was there before the dollars and takes most of it.
Writes benchmarks/results/job-cost.json; exit 1 when a goal is missed.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from gpucloud.commands.job_show import render_cost, render_timeline
from gpucloud.cost.job_cost import catalog_prices, job_cost
from gpucloud.cost.timeline import build_timeline
from gpucloud.lifecycle.model import AttemptEnd, AttemptState, JobSpec
from gpucloud.queue.sqlite import SqliteQueue
from report import config_of, finish

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results" / "job-cost.json"
GOAL_COST_FUNCTION_S = 0.1
GOAL_JOB_SHOW_S = 3.0
GOAL_COST_TABLE_S = 1.0
AZS = ("us-east-1a", "us-east-1b", "us-east-1c")


def record_job(queue: SqliteQueue, attempts: int, nodes: int) -> str:
    """A gang job of ``attempts`` attempts, each but the last interrupted an hour in."""
    job = queue.submit(JobSpec(command=["python", "train.py"], nodes=nodes, gpus_per_node=8))
    t, step = 1_790_000_000.0, 0
    for number in range(1, attempts + 1):
        queue.claim("w", lease_seconds=3600, job_id=job.id)
        queue.update_attempt(job.id, number, started_at=t, resumed_step=step or None)
        members = [
            {
                "worker": f"i-{number:04d}{m:02d}:1",
                "instance_id": f"i-{number:04d}{m:02d}",
                "instance_type": "p4d.24xlarge",
                "lifecycle": "spot",
                "availability_zone": AZS[(number + m) % len(AZS)],
                "region": "us-east-1",
            }
            for m in range(nodes)
        ]
        for member in members:
            queue.record(job.id, number, "started", at=t, data={"node": member, "pid": 1234})
            queue.record(job.id, number, "resume", at=t + 90, data={"step": step})
        last = number == attempts
        end = t + 3600
        if not last:
            queue.record(job.id, number, "notice", at=end - 120, data={"kind": "spot-interruption", "deadline": end})
            queue.record(job.id, number, "flag", at=end - 119.9)
            queue.record(job.id, number, "ack", at=end - 119, data={"step": step + 1000})
            queue.record(job.id, number, "commit", at=end - 100, data={"step": step + 1000})
        for member in members:
            queue.record(job.id, number, "exit", at=end, data={"exit_code": 0 if last else 75, "node": member})
        state = AttemptState.FINISHED if last else AttemptState.REQUEUED
        queue.end_attempt(job.id, number, AttemptEnd(state=state, last_step=step + 1000, committed_step=step + 1000))
        t, step = end + 300, step + 1000  # five minutes until the next gang forms
    return job.id


def _console():
    from rich.console import Console

    return Console(file=io.StringIO(), width=80)


def median_in_process(fn, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def median_cli(argv: list[str], repeat: int, env: dict[str, str]) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        subprocess.run(argv, check=True, stdout=subprocess.DEVNULL, env=env)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def measure(args: argparse.Namespace, tmp: Path) -> dict:
    db = tmp / "queue.db"
    queue = SqliteQueue(db)
    job_id = record_job(queue, args.attempts, args.nodes)
    job, attempts, events = queue.get(job_id), queue.attempts(job_id), queue.events(job_id)
    prices = catalog_prices()
    cost = job_cost(job, attempts, events, prices, now=time.time())
    assert cost.cost_usd is not None and len(cost.attempts) == args.attempts
    cost_s = median_in_process(lambda: job_cost(job, attempts, events, prices, now=time.time()), args.repeat)
    report_s = median_in_process(lambda: build_timeline(job, attempts, events), args.repeat)
    report_cost_s = median_in_process(lambda: build_timeline(job, attempts, events, prices=prices), args.repeat)
    with_cost = build_timeline(job, attempts, events, prices=prices)
    render_cost_s = median_in_process(lambda: render_cost(cost, _console()), args.repeat)
    with open(os.devnull, "w") as devnull, contextlib.redirect_stdout(devnull):
        render_all_s = median_in_process(lambda: render_timeline(with_cost), max(1, args.repeat // 2))
    queue.close()
    env = dict(os.environ) | {"COLUMNS": "80", "GPUCLOUD_HOME": str(tmp / "home"), "AWS_EC2_METADATA_DISABLED": "true"}
    gpucloud = [sys.executable, "-m", "gpucloud", "job", "show", job_id, "--queue", f"sqlite:///{db}"]
    json_s = median_cli([*gpucloud, "--output", "json"], args.repeat, env)
    table_s = median_cli(gpucloud, args.repeat, env)
    return {
        "benchmark": "job-cost",
        "config": config_of(args, python=platform.python_version(), cpus=os.cpu_count()),
        "job": {
            "attempts": args.attempts,
            "nodes_per_attempt": args.nodes,
            "events": len(events),
            "cost_usd": round(cost.cost_usd, 2),
            "cost_lost_usd": round(cost.cost_lost_usd or 0.0, 2),
            "price_sources": cost.price_sources,
        },
        "results": {
            "job_cost_s": round(cost_s, 5),
            "build_report_s": round(report_s, 5),
            "build_report_with_cost_s": round(report_cost_s, 5),
            "render_cost_s": round(render_cost_s, 4),
            "render_report_s": round(render_all_s, 3),
            "job_show_json_s": round(json_s, 3),
            "job_show_table_s": round(table_s, 3),
        },
        "summary": (
            f"{args.attempts} attempts x {args.nodes} nodes ({len(events)} events): job_cost {cost_s * 1000:.1f} ms, "
            f"report {report_s * 1000:.1f} ms -> {report_cost_s * 1000:.1f} ms with cost; "
            f"cost table {render_cost_s:.2f} s of the report's {render_all_s:.2f} s; "
            f"`job show -o json` {json_s:.2f} s, table {table_s:.2f} s (medians of {args.repeat})"
        ),
        "goals_met": {
            f"job_cost under {GOAL_COST_FUNCTION_S * 1000:.0f} ms": cost_s < GOAL_COST_FUNCTION_S,
            f"cost table under {GOAL_COST_TABLE_S:.0f} s": render_cost_s < GOAL_COST_TABLE_S,
            f"job show -o json under {GOAL_JOB_SHOW_S:.0f} s": json_s < GOAL_JOB_SHOW_S,
        },
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--attempts", type=int, default=100, help="attempts of the job")
    parser.add_argument("--nodes", type=int, default=4, help="gang members per attempt")
    parser.add_argument("--repeat", type=int, default=5, help="runs per measurement (the median is reported)")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    if args.attempts < 1 or args.nodes < 1 or args.repeat < 1:
        parser.error("--attempts, --nodes and --repeat must be at least 1")
    with tempfile.TemporaryDirectory(prefix="bench-job-cost-") as tmp:
        report = measure(args, Path(tmp))
    return finish(args.out, report)


if __name__ == "__main__":
    sys.exit(main())
