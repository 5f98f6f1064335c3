"""Benchmark `gpucloud report` over 10,000 jobs and 30 days of attempts: wall time and peak memory.

    .venv/bin/python benchmarks/bench_report.py [--jobs 10000] [--days 30] [--repeat 3]

Builds an embedded (SQLite) queue of --jobs jobs spread over --days days, each with 1 to 4
attempts of 1 to 3 hours on 8-GPU nodes (an interrupted attempt has a spot notice, its requeue,
a save, and the next attempt's resume), every attempt's ``started`` event naming its node (so the
report prices it), and 64 node records. The queue is written in one transaction
(tests/cost/report_seed.write_sqlite): 10,000 jobs driven through submit/claim/end_attempt would
time the queue's writes, not the report.

Then, each in a fresh process (--repeat times, the median reported): `gpucloud report --since
{days}d` as --output json and --output html, timing the whole command (interpreter start-up
included) in wall and CPU time, with the process's peak resident memory (getrusage's ru_maxrss
of the child).
Writes benchmarks/results/report.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(1, str(REPO / "tests"))  # ... whose helpers import their neighbours as pytest does (`helpers`)

from tests.cost.report_seed import write_sqlite  # noqa: E402

from gpucloud.cost.report import JobHistory  # noqa: E402
from gpucloud.lifecycle.model import Attempt, AttemptState, Event, Job, JobSpec, JobState, NodeRecord, NodeState  # noqa: E402

RESULTS = REPO / "benchmarks" / "results" / "report.json"
GROUPS = ("p5-spot", "p5-od")


def history(i: int, *, now: float, days: int, rng: random.Random) -> JobHistory:
    job_id = f"bench-{i:05d}"
    start = now - rng.uniform(0.5, days) * 86400
    group = GROUPS[i % 2]
    lifecycle = "spot" if group == "p5-spot" else "on-demand"
    spec = JobSpec(command=["python", "train.py"], gpus_per_node=8, nodes=1 + (i % 3 == 0), group=group)
    attempts, events = [], []
    at, step = start, 0
    count = rng.randint(1, 4)
    for number in range(1, count + 1):
        last = number == count
        wall = rng.uniform(3600, 3 * 3600)
        done = step + int(wall / 10)
        worker = f"agent-{rng.randrange(64):02d}"
        node = {
            "worker": worker,
            "instance_type": "p5.48xlarge",
            "region": "us-east-1",
            "availability_zone": "us-east-1a",
            "lifecycle": lifecycle,
        }
        attempts.append(
            Attempt(
                job_id=job_id,
                number=number,
                state=AttemptState.FINISHED if last else AttemptState.REQUEUED,
                worker=worker,
                created_at=at - 30,
                started_at=at,
                ended_at=at + wall,
                resumed_step=step if number > 1 else None,
                last_step=done,
                committed_step=None if last else done - 5,
            )
        )

        def ev(what: str, when: float, _attempt: int = number, **data: object) -> Event:
            return Event(job_id=job_id, attempt=_attempt, kind=what, at=when, data=data)

        events += [
            ev("claimed", at - 5),
            ev("started", at, node=node),
            ev("resume", at + 60, step=step),
            ev("saved", at + wall / 2, step=(step + done) // 2, bytes=10**10, seconds=30.0),
        ]
        if last:
            events += [ev("finish", at + wall, step=done), ev("exit", at + wall, exit_code=0, node=node)]
        else:
            events += [
                ev("notice", at + wall - 100, kind="spot-interruption", deadline=at + wall + 20),
                ev("commit", at + wall - 60, step=done - 5),
                ev("exit", at + wall - 10, exit_code=0, node=node),
                ev("requeue", at + wall, reason="checkpointed on notice"),
            ]
        at += wall + rng.uniform(60, 600)
        step = done - 5
    job = Job(
        id=job_id,
        spec=spec,
        state=JobState.FINISHED,
        attempt=count,
        created_at=start - 60,
        updated_at=min(at, now),
    )
    return JobHistory(job, attempts, events)


def measure(argv: list[str], env: dict[str, str]) -> tuple[float, float, int, float]:
    """(wall seconds, peak RSS MiB, output bytes, CPU seconds) of one run in a fresh process. CPU
    time (user + system) is what the report costs; wall time also counts the machine's other load."""
    code = (
        "import resource, subprocess, sys, time, json\n"
        "t = time.perf_counter()\n"
        "p = subprocess.run(sys.argv[1:], capture_output=True)\n"
        "wall = time.perf_counter() - t\n"
        "assert p.returncode == 0, p.stderr.decode()[-2000:]\n"
        "u = resource.getrusage(resource.RUSAGE_CHILDREN)\n"
        "print(json.dumps([wall, u.ru_maxrss / 1024, len(p.stdout), u.ru_utime + u.ru_stime]))\n"
    )
    out = subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True, env=env, check=True)
    wall, rss, size, cpu = json.loads(out.stdout)
    return wall, rss, size, cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=10_000)
    parser.add_argument("--days", type=int, default=30)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    rng = random.Random(14)
    now = time.time()
    with tempfile.TemporaryDirectory() as tmp:
        t = time.perf_counter()
        histories = [history(i, now=now, days=args.days, rng=rng) for i in range(args.jobs)]
        nodes = [
            NodeRecord(
                id=f"agent-{n:02d}",
                address=f"10.0.0.{n}",
                state=NodeState.IDLE if n % 4 == 0 else NodeState.RUNNING,
                instance_type="p5.48xlarge",
                lifecycle="spot" if n % 2 == 0 else "on-demand",
                instance_id=f"i-{n:017x}",
                group=GROUPS[n % 2],
                updated_at=now,
            )
            for n in range(64)
        ]
        uri = write_sqlite(Path(tmp) / "queue.db", histories, nodes)
        build_s = time.perf_counter() - t
        attempts = sum(len(h.attempts) for h in histories)
        events = sum(len(h.events) for h in histories)
        size_mib = (Path(tmp) / "queue.db").stat().st_size / 2**20
        print(f"queue: {args.jobs} jobs, {attempts} attempts, {events} events, {size_mib:.1f} MiB in {build_s:.1f} s")
        env = {**os.environ, "GPUCLOUD_HOME": tmp}
        env.pop("GPUCLOUD_PROMETHEUS_URL", None)
        gpucloud = str(Path(sys.executable).with_name("gpucloud"))
        runs: dict[str, dict[str, float]] = {}
        for output in ("json", "html"):
            argv = [gpucloud, "report", "--queue", uri, "--since", f"{args.days}d", "--output", output]
            samples = [measure(argv, env) for _ in range(args.repeat)]
            runs[output] = {
                "wall_s_median": round(statistics.median(s[0] for s in samples), 2),
                "wall_s_all": [round(s[0], 2) for s in samples],  # type: ignore[dict-item]
                "cpu_s_median": round(statistics.median(s[3] for s in samples), 2),
                "peak_rss_mib_max": round(max(s[1] for s in samples), 1),
                "output_bytes": samples[0][2],
            }
            print(f"report --output {output}: {runs[output]}")
        baseline = [measure([sys.executable, "-c", "pass"], env)[0] for _ in range(args.repeat)]
    result = {
        "what": f"gpucloud report --since {args.days}d over an embedded queue",
        "jobs": args.jobs,
        "attempts": attempts,
        "events": events,
        "queue_mib": round(size_mib, 1),
        "runs": runs,
        "python_startup_s_median": round(statistics.median(baseline), 3),
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "platform": platform.platform()},
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {RESULTS.relative_to(REPO)}")


if __name__ == "__main__":
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    main()
