"""Benchmark `gpucloud plan`: CLI start-up, plan wall time per stack, resources per second.

    .venv/bin/python benchmarks/bench_plan.py [--repeat 3]

Measures, each as the median of --repeat runs in fresh processes:
- `python -c pass` (the baseline every ratio is against: interpreter start-up on this machine);
- `gpucloud --help` (lazy imports: must not import pulumi or boto3);
- `gpucloud plan --stack NAME --output json` for every shipped stack;
- the same for a generated stack of 16 node groups (goal: under 3 s on a 2-core machine);
and, in-process, resources registered per second under the mocks for each stack.
Writes benchmarks/results/plan.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results" / "plan.json"
GOAL_16_GROUPS_S = 3.0


def sixteen_group_stack() -> dict:
    types = ["g6.xlarge", "g5.xlarge", "p4d.24xlarge", "p5.48xlarge"]
    groups = [
        {
            "name": f"g{i:02d}",
            "instanceType": types[i % 4],
            "maxNodes": 2,
            "capacity": {"type": "spot"} if i % 2 else {"type": "on-demand"},
        }
        for i in range(16)
    ]
    return {
        "config": {
            "aws:region": "us-east-1",
            "gpucloud:availabilityZone": "us-east-1b",
            "gpucloud:nodeGroups": groups,
            "gpucloud:storage": {"fsx": {"sizeGiB": 1200}},
            "gpucloud:agent": {"package": "s3://wheels-bucket/gpucloud-0.1.0-py3-none-any.whl"},
        }
    }


def wall(argv: list[str], repeat: int) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")} | {"AWS_EC2_METADATA_DISABLED": "true"}
    times, cpu = [], []
    for _ in range(repeat):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        start = time.perf_counter()
        proc = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True)
        times.append(time.perf_counter() - start)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu.append(after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime)
        if proc.returncode != 0:
            raise SystemExit(f"{' '.join(argv)} failed ({proc.returncode}): {proc.stderr.strip()}")
    # CPU seconds are reported beside wall time: they stay comparable when other work shares the cores
    return {
        "median_s": round(statistics.median(times), 3),
        "runs_s": [round(t, 3) for t in times],
        "median_cpu_s": round(statistics.median(cpu), 3),
    }


def resources_per_second(stack_file: Path, name: str) -> dict:
    from gpucloud.infra.preview import preview_stack
    from gpucloud.spec import load_stack_file

    spec = load_stack_file(stack_file)
    preview_stack(spec, name)  # warm: the first run pays for pulumi_aws submodule imports
    start = time.perf_counter()
    preview = preview_stack(spec, name)
    elapsed = time.perf_counter() - start
    return {
        "resources": len(preview.resources),
        "in_process_s": round(elapsed, 3),
        "resources_per_s": round(len(preview.resources) / elapsed, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    gpucloud = [sys.executable, "-m", "gpucloud"]
    sys.path.insert(0, str(REPO / "src"))
    from gpucloud.spec import available_stacks, stack_file_for

    baseline = wall([sys.executable, "-c", "pass"], args.repeat)
    report: dict = {
        "machine": {
            "python": platform.python_version(),
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
            "load_average_at_start": [round(x, 2) for x in os.getloadavg()],
        },
        "baseline_python_start": baseline,
        "help": wall(gpucloud + ["--help"], args.repeat),
        "plans": {},
    }
    report["help"]["ratio_to_baseline"] = round(report["help"]["median_s"] / baseline["median_s"], 2)
    with tempfile.TemporaryDirectory() as tmp:
        generated = Path(tmp) / "Pulumi.sixteen-groups.yaml"
        generated.write_text(yaml.safe_dump(sixteen_group_stack()))
        stacks = {name: stack_file_for(name) for name in available_stacks()} | {"sixteen-groups": generated}
        for name, path in stacks.items():
            row = wall(gpucloud + ["plan", "--stack-file", str(path), "--output", "json"], args.repeat)
            row["ratio_to_baseline"] = round(row["median_s"] / baseline["median_s"], 2)
            row.update(resources_per_second(path, name))
            report["plans"][name] = row
            print(
                f"plan {name:18s} {row['median_s']:6.2f} s wall {row['median_cpu_s']:6.2f} s cpu  "
                f"{row['resources']:4d} resources  "
                f"{row['resources_per_s']:7.1f} resources/s (in-process)"
            )
    sixteen = report["plans"]["sixteen-groups"]["median_s"]
    report["goal"] = {
        "sixteen_groups_under_s": GOAL_16_GROUPS_S,
        "measured_s": sixteen,
        "measured_cpu_s": report["plans"]["sixteen-groups"]["median_cpu_s"],
        "met": sixteen < GOAL_16_GROUPS_S,
    }
    report["machine"]["load_average_at_end"] = [round(x, 2) for x in os.getloadavg()]
    print(f"python start      {baseline['median_s']:6.3f} s")
    print(
        f"gpucloud --help   {report['help']['median_s']:6.3f} s  ({report['help']['ratio_to_baseline']}x python start)"
    )
    print(
        f"16-group plan goal < {GOAL_16_GROUPS_S} s: {'met' if report['goal']['met'] else 'NOT met'} "
        f"({sixteen} s wall, {report['goal']['measured_cpu_s']} s cpu; load average "
        f"{report['machine']['load_average_at_start'][0]} at start)"
    )
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(report, indent=2) + "\n")
    print(f"report: {RESULTS.relative_to(REPO)}")


if __name__ == "__main__":
    main()
