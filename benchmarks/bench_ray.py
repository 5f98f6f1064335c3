"""Ray Train on spot: a notice on one node, with gpucloud's Ray integration and with plain Ray.

    PYTHONPATH=src .venv/bin/python benchmarks/bench_ray.py [--lead-seconds 10] [--steps 300] [--every 20]

One multi-raylet cluster on this machine (tests/integrations/ray_cluster.py, the Ray tests' own
harness): a head with no CPUs and three 1-CPU nodes, each with its own IMDS emulator; a
TorchTrainer with 2 gloo workers trains ``tests/integrations/ray_train_fn.py`` (periodic
checkpoints every ``--every`` steps in both runs). At step 10 the emulator of rank 1's node
announces a spot interruption ``--lead-seconds`` ahead; the node is reclaimed at that deadline.

* **gpucloud**: the node's NoticeDrainer drains it (reason PREEMPTION, the notice's deadline);
  Ray's watcher reports it; every worker saves the agreed step through TrainingSession, reports it,
  and waits; at the deadline Ray restarts the group on the spare node, which resumes from it.
* **plain Ray** (Ray Train as its docs show it, no gpucloud): nobody drains the node, the workers
  train on until it dies, and Ray restarts the group from the last periodic checkpoint reported.

Per run, seconds from the announcement: drain accepted, all workers agreed (the later of the two
ranks passing Ray's barrier with the preemption), committed (durable), node reclaimed, restarted
(the first worker of the new group resumed); and steps lost = steps trained before the restart −
the step resumed from. Writes benchmarks/results/ray.json; exit 1 when a goal is missed.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import ray

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "src")]

from tests.integrations import ray_cluster as rc  # noqa: E402

from report import config_of, finish  # noqa: E402  (benchmarks/report.py)

RESULTS = Path(__file__).resolve().parent / "results" / "ray.json"


def _phases(run: rc.Interrupted) -> dict:
    def since(t: float | None) -> float | None:
        return None if t is None else round(t - run.notice_at, 3)

    preempted = run.of("preempted")
    agreed = max((e["seen_at"] for e in preempted), default=None)
    committed = max((e["committed_at"] or 0 for e in preempted), default=0) or None
    restarted = min((e["t"] for e in run.restarts), default=None)
    resumed = min((e["step"] for e in run.restarts), default=None)
    return {
        "notice_to_drain_s": since(run.drained_at),
        "notice_to_all_workers_agreed_s": since(agreed),
        "notice_to_committed_s": since(committed),
        "notice_to_node_reclaimed_s": since(run.reclaimed_at),
        "notice_to_restarted_s": since(restarted),
        "agreed_step": preempted[0]["step"] if preempted else None,
        "trained_before_restart": run.trained_before_restart,
        "resumed_step": resumed,
        # None: the run finished before the node went (raise --steps so it is still training then)
        "steps_lost": None if resumed is None else run.trained_before_restart - resumed,
        "every_rank_agreed": sorted(e["rank"] for e in preempted) == [0, 1]
        and len({e["step"] for e in preempted}) == 1,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lead-seconds", type=float, default=10.0, help="the notice's lead (EC2: 120)")
    parser.add_argument("--steps", type=int, default=300, help="total training steps (still training at the deadline)")
    parser.add_argument("--every", type=int, default=20, help="periodic checkpoint interval (steps), both runs")
    parser.add_argument("--step-seconds", type=float, default=0.1, help="extra time per step (a bigger model)")
    args = parser.parse_args()
    nodes = rc.RayNodes()
    results: dict[str, dict] = {}
    try:
        ray.init(address=nodes.cluster.address, logging_level="WARNING", log_to_driver=False)
        with tempfile.TemporaryDirectory(prefix="bench-ray-") as tmp:
            for name, integration in (("gpucloud", True), ("plain_ray", False)):
                for node in list(nodes.nodes):
                    nodes.reclaim(node)  # each run's nodes have its own kind of watch (or none)
                started = time.monotonic()
                run = rc.interrupted_run(
                    nodes,
                    Path(tmp) / name,
                    lead_seconds=args.lead_seconds,
                    integration=integration,
                    steps=args.steps,
                    every=args.every,
                    step_seconds=args.step_seconds,
                )
                results[name] = _phases(run) | {"run_wall_s": round(time.monotonic() - started, 1)}
                print(name, results[name], file=sys.stderr)
    finally:
        ray.shutdown()
        nodes.shutdown()
    ours, plain = results["gpucloud"], results["plain_ray"]
    summary = {
        "steps_lost": {"gpucloud": ours["steps_lost"], "plain_ray": plain["steps_lost"]},
        "notice_to_restarted_s": {
            "gpucloud": ours["notice_to_restarted_s"],
            "plain_ray": plain["notice_to_restarted_s"],
        },
        "gpucloud_phases_s": {
            k: ours[k]
            for k in (
                "notice_to_drain_s",
                "notice_to_all_workers_agreed_s",
                "notice_to_committed_s",
                "notice_to_restarted_s",
            )
        },
    }
    goals = {
        "gpucloud: every rank saved the same step": ours["every_rank_agreed"],
        "gpucloud: at most 1 step lost": ours["steps_lost"] is not None and ours["steps_lost"] <= 1,
        "plain Ray: still training when the node went": plain["steps_lost"] is not None,
        "gpucloud: committed before the deadline": (ours["notice_to_committed_s"] or 1e9) < args.lead_seconds,
        "gpucloud: resumed at the agreed step": ours["resumed_step"] == ours["agreed_step"],
    }
    report = {"config": config_of(args, ray=ray.__version__), "runs": results, "summary": summary, "goals_met": goals}
    return finish(RESULTS, report)


if __name__ == "__main__":
    raise SystemExit(main())
