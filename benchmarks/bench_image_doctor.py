"""Benchmark `gpucloud image check` and `gpucloud doctor` with recorded outputs.

    .venv/bin/python benchmarks/bench_image_doctor.py [--repeat 5]

Measures, each as the median of --repeat runs in fresh processes (what a user waits for):
- `python -c pass` (the baseline every ratio is against: interpreter start-up on this machine);
- `gpucloud image check images/versions.yaml --output json` (goal: under 1 s);
- `gpucloud doctor --recorded tests/doctor/fixtures/<node> --output json` for the recorded P4d and P5
  nodes (goal: under 1 s each);
and, in-process, the time of the rules and checks alone (best of 200 runs) and how many there are.
Writes benchmarks/results/image_doctor.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results" / "image_doctor.json"
MATRIX = REPO / "images" / "versions.yaml"
NODES = {"p4d": REPO / "tests/doctor/fixtures/p4d-healthy", "p5": REPO / "tests/doctor/fixtures/p5-healthy"}
GOAL_S = 1.0


def wall(argv: list[str], repeat: int) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")} | {"AWS_EC2_METADATA_DISABLED": "true"}
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        proc = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True)
        times.append(time.perf_counter() - start)
        if proc.returncode != 0:
            raise SystemExit(f"{' '.join(argv)} failed ({proc.returncode}): {proc.stderr.strip()}")
    return {"median_s": round(statistics.median(times), 3), "runs_s": [round(t, 3) for t in times]}


def best_of(fn, runs: int = 200) -> float:
    best = float("inf")
    for _ in range(runs):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def in_process() -> dict:
    from gpucloud.catalog import get_instance_type
    from gpucloud.doctor.checks import CHECKS, Expectations, run_checks
    from gpucloud.doctor.collect import load_recorded
    from gpucloud.image.matrix import load_matrix
    from gpucloud.image.render import render_components
    from gpucloud.image.rules import RULES, check_matrix

    matrix = load_matrix(MATRIX)
    node = load_recorded(NODES["p5"])
    want = Expectations(get_instance_type("p5.48xlarge"), matrix)
    return {
        "rules": len(RULES),
        "checks": len(CHECKS),
        "image_rules_s": round(best_of(lambda: check_matrix(matrix)), 6),
        "matrix_load_and_rules_s": round(best_of(lambda: check_matrix(load_matrix(MATRIX)), 50), 6),
        "render_components_s": round(best_of(lambda: render_components(matrix), 20), 6),
        "doctor_checks_s": round(best_of(lambda: run_checks(node, want)), 6),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    gpucloud = [sys.executable, "-m", "gpucloud"]

    baseline = wall([sys.executable, "-c", "pass"], args.repeat)
    commands = {"image check": wall([*gpucloud, "image", "check", str(MATRIX), "-o", "json"], args.repeat)}
    for name, node in NODES.items():
        commands[f"doctor {name} (recorded)"] = wall(
            [*gpucloud, "doctor", "--recorded", str(node), "--matrix", str(MATRIX), "-o", "json"], args.repeat
        )
    for result in commands.values():
        result["ratio_to_baseline"] = round(result["median_s"] / baseline["median_s"], 1)
        result["meets_goal"] = result["median_s"] < GOAL_S

    report = {
        "machine": {"python": platform.python_version(), "cpus": os.cpu_count(), "platform": platform.platform()},
        "goal_s": GOAL_S,
        "baseline_python_startup": baseline,
        "commands": commands,
        "in_process": in_process(),
    }
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(report, indent=2) + "\n")
    for name, result in commands.items():
        print(
            f"{name:<24} {result['median_s']:.3f} s  ({result['ratio_to_baseline']}x python start-up, "
            f"goal < {GOAL_S} s: {'met' if result['meets_goal'] else 'MISSED'})"
        )
    ip = report["in_process"]
    print(
        f"rules: {ip['rules']} in {ip['image_rules_s'] * 1e6:.0f} us; checks: {ip['checks']} in "
        f"{ip['doctor_checks_s'] * 1e6:.0f} us; render 7 components: {ip['render_components_s'] * 1e3:.1f} ms"
    )
    print(f"report: {RESULTS.relative_to(REPO)}")


if __name__ == "__main__":
    main()
