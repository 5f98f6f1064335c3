"""Benchmark `gpucloud sweep` on a leaked p4d-spot stack: what the leak costs an hour, and how long sweep
takes to list it and to delete it on a local moto server.

    .venv/bin/python benchmarks/bench_sweep.py [--repeat 3]

Cost by resource: `gpucloud plan --stack p4d-spot -o json` (the catalog's instance prices and service
prices, the very cost model plan prints) at the stack's desired size: what keeps billing when a CI job
dies after `pulumi up`. Sweep's own `usd_per_hour` column (the catalog price of each instance it found)
is reported beside it.

Time: the p4d-spot stack's real resources (4 x p4d.24xlarge, its onDemandBase of 1 on-demand and 3 spot, the node group's launch
template and ASG, FSx for Lustre 2400 GiB, VPC, subnet, security group, IGW, NAT + EIP, S3 endpoint,
route table, EFA-style ENI, SQS, DynamoDB, EventBridge rule + target, IAM role + profile, a versioned
bucket with versions, a delete marker and an unfinished upload) plus an untagged twin and a kept bucket,
made with boto3 on a fresh moto server; then the sweep's dry run (list) and `--delete`, in-process,
each the median of --repeat fresh accounts. moto answers in microseconds where AWS takes minutes
(instances terminate, NAT gateways delete asynchronously): the figure is sweep's own overhead and call
count, not AWS's deletion time. Writes benchmarks/results/sweep.json.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(1, str(ROOT / "benchmarks"))

from report import config_of, finish  # noqa: E402  (benchmarks/report.py)

RESULTS = ROOT / "benchmarks" / "results" / "sweep.json"
REGION = "us-east-1"
STACK = "p4d-spot"


def leak_cost() -> dict[str, Any]:
    """The p4d-spot stack's hourly cost by resource at its desired size, from `gpucloud plan`."""
    done = subprocess.run(
        [sys.executable, "-m", "gpucloud", "plan", "--stack", STACK, "-o", "json"],
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    plan = json.loads(done.stdout)
    cost = plan["cost"]
    rows = []
    for g in cost["groups"]:
        nodes = next(x for x in plan_groups(plan) if x["name"] == g["name"])["desired"]
        rows.append(
            {
                "resource": f"node group {g['name']}: {nodes} x {g['instance_type']} {g['capacity']}",
                "usd_per_hour": g["as_configured"]["desired"],
            }
        )
    for item in cost.get("infrastructure", []):
        rows.append({"resource": f"{item['item']} ({item['detail']})", "usd_per_hour": item["usd_per_hour"]["desired"]})
    if plan.get("monitoring"):
        rows.append(
            {
                "resource": f"monitor {plan['monitoring']['instance_type']} + its volume",
                "usd_per_hour": plan["monitoring"]["total"],
            }
        )
    known = [r["usd_per_hour"] for r in rows if r["usd_per_hour"] is not None]
    return {
        "prices_as_of": cost.get("prices_as_of"),
        "by_resource": rows,
        "total_usd_per_hour": round(sum(known), 4),
        "plan_total_desired": (cost.get("total") or cost["as_configured"])["desired"],
        "not_priced": "S3 storage (by size), SQS/DynamoDB/EventBridge requests, KMS key (1 USD/month), data transfer",
    }


def plan_groups(plan: dict) -> list[dict]:
    from gpucloud.spec import load_stack_file, stack_file_for

    spec = load_stack_file(stack_file_for(STACK))
    return [{"name": g.name, "desired": g.desired} for g in spec.node_groups]


def leaked_nodes() -> dict[str, Any]:
    """The stack's one node group at its desired size: its onDemandBase on-demand, the rest spot,
    so that sweep's price of what it finds is comparable with plan's."""
    from gpucloud.spec import load_stack_file, stack_file_for

    [group] = load_stack_file(stack_file_for(STACK)).node_groups
    base = min(group.capacity.on_demand_base, group.desired)
    return {"instance_type": group.instance_type, "instances": group.desired, "on_demand": base}


def one_trial(endpoint: str) -> dict[str, Any]:
    import boto3
    from tests.conftest import reset_account
    from tests.teardown.leaked_stack import leave_stack_behind

    from gpucloud.teardown.plan import Selection
    from gpucloud.teardown.sweep import sweep

    reset_account(endpoint)
    clients: dict[str, Any] = {}

    def client(service: str) -> Any:
        if service not in clients:
            clients[service] = boto3.client(service, region_name=REGION, endpoint_url=endpoint)
        return clients[service]

    leaked = leave_stack_behind(client, STACK, **leaked_nodes(), fsx_gib=2400)
    now = dt.datetime.now(dt.timezone.utc)
    started = time.perf_counter()
    listed = sweep(client, REGION, Selection(stack=STACK), delete=False, now=now)
    list_s = time.perf_counter() - started
    started = time.perf_counter()
    deleted = sweep(client, REGION, Selection(stack=STACK), delete=True, now=now)
    delete_s = time.perf_counter() - started
    again = sweep(client, REGION, Selection(stack=STACK), delete=False, now=now)
    return {
        "list_s": list_s,
        "delete_s": delete_s,
        "found": len([o for o in listed if o.action == "would delete"]),
        "expected": len(leaked.ids),
        "results": sorted({o.result for o in deleted if o.action == "delete"}),
        "left_after": len([o for o in again if o.action != "skip"]),
        "sweep_usd_per_hour": round(sum(o.usd_per_hour or 0.0 for o in listed if o.action == "would delete"), 4),
        "by_type": sorted({o.decision.found.kind for o in listed}),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()

    from tests.conftest import FAKE_AWS, moto_endpoint

    cost = leak_cost()
    with moto_endpoint() as endpoint:
        os.environ.update({**FAKE_AWS, "AWS_ENDPOINT_URL": endpoint})
        trials = [one_trial(endpoint) for _ in range(args.repeat)]
    last = trials[-1]
    summary = {
        "leak_usd_per_hour": cost["total_usd_per_hour"],
        "leak_usd_per_day": round(cost["total_usd_per_hour"] * 24, 2),
        "sweep_list_s_median": round(statistics.median(t["list_s"] for t in trials), 3),
        "sweep_delete_s_median": round(statistics.median(t["delete_s"] for t in trials), 3),
        "resources_found": last["found"],
        "sweep_usd_per_hour_of_instances_found": last["sweep_usd_per_hour"],
    }
    report = {
        "benchmark": "sweep",
        "config": config_of(args, region=REGION, stack=STACK, cpus=os.cpu_count()),
        "summary": summary,
        "leak_cost": cost,
        "trials": trials,
        "goals_met": {
            "found_exactly_the_stack": all(t["found"] == t["expected"] for t in trials),
            "deleted_all": all(set(t["results"]) <= {"deleted", "already gone"} for t in trials),
            "second_sweep_finds_nothing": all(t["left_after"] == 0 for t in trials),
        },
    }
    return finish(args.out, report)


if __name__ == "__main__":
    sys.exit(main())
