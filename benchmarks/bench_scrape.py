"""Scrape benchmark: the time a node's scrape takes and the series it adds, at p5 size (8 GPUs, 32 EFA devices).

    .venv/bin/python benchmarks/bench_scrape.py [--scrapes 30] [--instance-type p5.48xlarge]

The node is the end-to-end test's (``tests/monitoring_e2e/scenario.py``, not a copy): the fixture
dcgm-exporter serving a recorded p5.48xlarge scrape with the counters file the image ships, the real
node_exporter (Debian's) over a sysfs of 32 EFA devices, and the real ``gpucloud agent`` (whose /metrics
reads the same sysfs's EFA counters: 22 per device) on its IMDS
emulator with a ``spot-train`` attempt running (held at a step boundary while it is measured). A real
Prometheus scrapes the three every second through the rendered offline configuration and rules.

Measured, per target:

* by Prometheus, over ``--scrapes`` scrapes: ``scrape_duration_seconds`` (median, max) and
  ``scrape_samples_scraped`` (the series one scrape brings);
* by ``--scrapes`` timed GETs of its /metrics from here: wall time (median, p95) and the series parsed.

node_exporter runs on a node with its default collectors too: a second one (defaults plus infiniband,
this host's /proc, the EFA sysfs) is scraped by timed GETs, and its series labelled ``cpu`` are scaled
from this host's vCPUs to the instance type's (p5.48xlarge: 192) for the per-node total. A lower bound:
the collectors that read sysfs (cpufreq, hwmon, thermal) see only the EFA tree here, and a p5 has more
network interfaces, disks and file systems than this host.

Per node: series = dcgm-exporter's + node_exporter's (defaults, scaled) + the agent's; scrape time = their sum (one after another) and their max
(Prometheus scrapes targets concurrently). Goals: the node's series, and each source's, within the
monitoring plan's estimate (``cluster/monitoring_plan.py``, which sizes the monitor's TSDB disk and prices AMP ingestion:
an estimate below the truth under-sizes both), and every target's median scrape under 1 s.

Writes benchmarks/results/scrape.json; exit 1 when a goal is missed. Needs Debian's prometheus and
prometheus-node-exporter (``scripts/setup.sh --test``).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))  # the scenario lives in the test package (imported as pytest does)

from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

from gpucloud.catalog import load_catalog  # noqa: E402
from gpucloud.cluster import monitoring_plan as plan  # noqa: E402
from gpucloud.monitoring.names import AGENT_JOB, DCGM_JOB, NODE_JOB  # noqa: E402
from helpers.waiting import wait_for  # noqa: E402
from monitoring_e2e.efa_sysfs import EFA_DEVICES, write_efa_sysfs  # noqa: E402
from monitoring_e2e.scenario import JOB_ID, SCRAPE_INTERVAL, monitored_node  # noqa: E402
from monitoring_e2e.tools import (  # noqa: E402
    NODE_EXPORTER,
    PROMETHEUS,
    NodeExporter,
    http_get,
    missing_tools_reason,
    timed_scrape,
    tool,
)
from node_env import NODE_ENV  # noqa: E402  (tests/node_env.py)
from report import config_of, finish  # noqa: E402  (benchmarks/report.py)

RESULTS = ROOT / "benchmarks" / "results" / "scrape.json"
SCRAPE_GOAL_S = 1.0


def version(binary: str) -> str:
    out = subprocess.run([binary, "--version"], capture_output=True, text=True, check=False)
    match = re.search(r"version (\S+)", out.stdout + out.stderr)
    return match.group(1) if match else "?"


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def timed_gets(url: str, count: int) -> dict[str, float | int]:
    rows = [timed_scrape(url) for _ in range(count)]
    seconds = [s for s, _ in rows]
    return {
        "http_seconds_median": round(statistics.median(seconds), 5),
        "http_seconds_p95": round(percentile(seconds, 0.95), 5),
        "http_series": rows[-1][1],
    }


def prometheus_view(prom, job: str, window_s: int) -> dict[str, float | int]:
    def one(expr: str) -> float:
        (sample,) = prom.query(expr)
        return float(sample["value"][1])

    selector = f'{{job="{job}"}}'
    return {
        "prometheus_scrapes": int(one(f"count_over_time(scrape_duration_seconds{selector}[{window_s}s])")),
        "prometheus_scrape_seconds_median": round(
            one(f"quantile_over_time(0.5, scrape_duration_seconds{selector}[{window_s}s])"), 5
        ),
        "prometheus_scrape_seconds_max": round(
            one(f"max_over_time(scrape_duration_seconds{selector}[{window_s}s])"), 5
        ),
        "series": int(one(f"max_over_time(scrape_samples_scraped{selector}[{window_s}s])")),
    }


def node_exporter_defaults(work: Path, efa: int, vcpus_there: int, scrapes: int) -> dict[str, float | int]:
    """node_exporter with its default collectors (infiniband among them) on this host's /proc and the
    EFA sysfs: its series, and those labelled per CPU scaled to the instance type's vCPUs."""
    sysfs = work / "sys-defaults"
    write_efa_sysfs(sysfs, efa)
    with NodeExporter(sysfs, work / "node_exporter_defaults.log", flags=()) as exporter:
        url = f"http://{exporter.address}/metrics"
        measured = timed_gets(url, scrapes)
        body = http_get(url)
    assert body is not None
    samples = [s for family in text_string_to_metric_families(body.decode()) for s in family.samples]
    per_cpu = [s for s in samples if "cpu" in s.labels]
    vcpus_here = len({s.labels["cpu"] for s in per_cpu}) or 1
    at_instance = len(samples) - len(per_cpu) + round(len(per_cpu) / vcpus_here * vcpus_there)
    infiniband = sum(1 for s in samples if s.name.startswith("node_infiniband_"))
    return measured | {
        "series_here": len(samples),
        "vcpus_here": vcpus_here,
        "per_cpu_series_here": len(per_cpu),
        "infiniband_series": infiniband,
        "series_at_instance_vcpus": at_instance,
        "series_at_instance_vcpus_without_infiniband": at_instance - infiniband,
    }


def measure(args: argparse.Namespace, work: Path) -> dict:
    itype = load_catalog().instance_types[args.instance_type]
    env = {k: v for k, v in os.environ.items() if k not in NODE_ENV} | {"GPUCLOUD_HOME": str(work / "home")}
    targets: dict[str, dict] = {}
    with monitored_node(work, env, instance_type=args.instance_type, linger=0) as node:
        prom = node.prometheus
        wait_for(
            lambda: prom.query(f'gpucloud_attempt_running{{job_id="{JOB_ID}"}} == 1'),
            180,
            f"Prometheus to scrape the agent running the attempt\n{node.agent.output()}",
            every=0.1,  # polling an HTTP server
        )
        # While Prometheus scrapes every second, time GETs of each endpoint from here.
        urls = {
            DCGM_JOB: f"http://{node.dcgm.address}/metrics",
            NODE_JOB: f"http://{node.node_exporter.address}/metrics",
            AGENT_JOB: f"http://{node.agent_address()}/metrics",
        }
        for job, url in urls.items():
            targets[job] = timed_gets(url, args.scrapes)
        window = args.scrapes + 5
        wait_for(
            lambda: all(
                prom.query(f'count_over_time(scrape_duration_seconds{{job="{job}"}}[{window}s]) >= {args.scrapes}')
                for job in urls
            ),
            args.scrapes * 4 + 60,
            f"{args.scrapes} scrapes of every target",
            every=0.1,  # polling an HTTP server
        )
        for job in urls:
            targets[job] |= prometheus_view(prom, job, window)
        # The attempt ends as on a noticed node: the rank saves, the job is requeued, the agent exits.
        node.emulator.spot_interruption("terminate", lead_seconds=120)
        node.open_gate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            node.agent.proc.wait(timeout=120)
    defaults = node_exporter_defaults(work, EFA_DEVICES[args.instance_type], itype.vcpus, args.scrapes)
    infiniband = defaults["infiniband_series"]

    estimate = {
        DCGM_JOB: plan.DCGM_SERIES_PER_GPU * itype.gpus,
        "infiniband": plan.INFINIBAND_SERIES_PER_EFA * itype.max_efa_interfaces,
        AGENT_JOB: plan.AGENT_SERIES + plan.AGENT_SERIES_PER_EFA * itype.max_efa_interfaces,
        "node_exporter_defaults": plan.NODE_BASE_SERIES + plan.NODE_SERIES_PER_VCPU * itype.vcpus,
    }
    series_per_node = targets[DCGM_JOB]["series"] + defaults["series_at_instance_vcpus"] + targets[AGENT_JOB]["series"]
    medians = [t["prometheus_scrape_seconds_median"] for t in targets.values()]
    summary = {
        "series": {job: t["series"] for job, t in targets.items()},
        "series_per_gpu_dcgm": round(targets[DCGM_JOB]["series"] / itype.gpus, 1),
        "series_per_efa_device": round(infiniband / itype.max_efa_interfaces, 2),
        "series_node_exporter_defaults_at_instance_vcpus": defaults["series_at_instance_vcpus"],
        "series_per_node": series_per_node,
        "plan_series_per_node": plan.series_per_node(itype),
        "plan_over_measured": round(plan.series_per_node(itype) / series_per_node, 2),
        "scrape_seconds_per_node_sum_of_medians": round(sum(medians), 5),
        "scrape_seconds_per_node_max_of_medians": round(max(medians), 5),
        "samples_per_second_per_node_at_15s": round(series_per_node / plan.SCRAPE_INTERVAL_SECONDS, 1),
    }
    goals = {
        "plan_covers_the_series_per_node": plan.series_per_node(itype) >= series_per_node,
        "dcgm_series_within_plan": targets[DCGM_JOB]["series"] <= estimate[DCGM_JOB],
        "infiniband_series_within_plan": infiniband <= estimate["infiniband"],
        "agent_series_within_plan": targets[AGENT_JOB]["series"] <= estimate[AGENT_JOB],
        "node_exporter_defaults_within_plan": (
            defaults["series_at_instance_vcpus_without_infiniband"] <= estimate["node_exporter_defaults"]
        ),
        "every_target_scraped_under_1s": all(m < SCRAPE_GOAL_S for m in medians),
    }
    return {
        "benchmark": "scrape",
        "config": config_of(
            args,
            instance_type=args.instance_type,
            gpus=itype.gpus,
            efa_devices=itype.max_efa_interfaces,
            vcpus=itype.vcpus,
            scrape_interval=SCRAPE_INTERVAL,
            prometheus=version(tool(PROMETHEUS) or PROMETHEUS),
            node_exporter=version(tool(NODE_EXPORTER) or NODE_EXPORTER),
            node_exporter_flags_measured="--collector.disable-defaults --collector.infiniband (in Prometheus); defaults",
            dcgm_exporter="fixture: recorded scrape filtered by the shipped counters file",
            host_cpus=os.cpu_count(),
        ),
        "targets": targets,
        "node_exporter_defaults": defaults,
        "plan_estimate": estimate,
        "summary": summary,
        "goals_met": goals,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--scrapes", type=int, default=30, help="scrapes per target, by Prometheus and by GETs")
    parser.add_argument("--instance-type", choices=sorted(EFA_DEVICES), default="p5.48xlarge")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    if args.scrapes < 3:
        parser.error("--scrapes must be at least 3")
    if reason := missing_tools_reason(PROMETHEUS, NODE_EXPORTER):
        parser.error(reason)
    with tempfile.TemporaryDirectory(prefix="bench-scrape-") as tmp:
        report = measure(args, Path(tmp))
    return finish(args.out, report)


if __name__ == "__main__":
    sys.exit(main())
