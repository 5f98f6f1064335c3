"""The exporter's cost: training step time with metrics on vs off, interleaved, in one run.

    .venv/bin/python benchmarks/bench_exporter.py [--pairs 20] [--block-steps 50] [--width 512]
        [--scrape-interval 1.0] [--every-steps 2*block-steps]

One training loop (an MLP under ``TrainingSession``, periodic asynchronous saves every
``--every-steps`` steps, the control directory of a real attempt), run in blocks of
``--block-steps`` steps that alternate (ABBA order, so a drift of the machine's load hits both;
one save as each pair starts, so the save's background writing slows both modes alike):

* **on**: the session's meter (``training_metrics.SessionMeter``: the step-time histogram at every
  step boundary, its JSON in each ``progress`` write) and the agent's exporter
  (``agent/metrics.py``) serving /metrics on 127.0.0.1, scraped over HTTP every
  ``--scrape-interval`` seconds, each scrape reading the attempt's progress file. The exporter runs
  in this very process, sharing its GIL with the loop: an upper bound of the cost (on a node the
  agent is another process), and it is scraped more often than the shipped 15 s.
* **off**: a meter that records nothing and no exporter (what the session did before /metrics).

Reported: the median step time of each, their ratio (the cost), the median of the per-pair ratios
(each on block against the off block beside it), p90s, the scrapes made and their median duration. Goal: the median step with metrics on is within 5% of off.
Writes benchmarks/results/exporter.json.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

import torch

from gpucloud.agent.identity import NodeLabels
from gpucloud.agent.metrics import MetricsServer, NodeMetrics
from gpucloud.checkpoint import TrainingSession
from gpucloud.training_metrics import SessionMeter
from report import config_of, finish  # benchmarks/report.py

RESULTS = Path(__file__).resolve().parent / "results" / "exporter.json"
GOAL_RATIO = 1.05


class NoMeter(SessionMeter):
    """Metrics off: the session's calls do nothing, and the progress file carries no histograms."""

    def start(self, now: float, step: int) -> None:
        pass

    def step(self, now: float, step: int) -> None:
        pass

    def saved(self, kind: str, *, seconds: float, stall: float, size: int) -> None:
        pass

    def failed(self, *, stall: float) -> None:
        pass

    def to_json(self) -> dict[str, Any]:
        return {}


class Scraper:
    """GETs /metrics every ``interval`` seconds while switched on; keeps each scrape's duration."""

    def __init__(self, url: str, interval: float) -> None:
        self.url, self.interval = url, interval
        self.on = threading.Event()
        self.stopped = threading.Event()
        self.durations: list[float] = []
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.stopped.is_set():
            if not self.on.wait(timeout=0.1):
                continue
            started = time.perf_counter()
            with urllib.request.urlopen(self.url, timeout=10) as response:
                response.read()
            self.durations.append(time.perf_counter() - started)
            self.stopped.wait(self.interval)

    def close(self) -> None:
        self.stopped.set()
        self.thread.join(timeout=10)


def build(width: int) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(64, width),
        torch.nn.Tanh(),
        torch.nn.Linear(width, width),
        torch.nn.Tanh(),
        torch.nn.Linear(width, 1),
    )
    return model, torch.optim.AdamW(model.parameters(), lr=1e-3)


def meter_step_seconds(n: int = 20000) -> float:
    """What one step boundary costs the meter, alone (the histogram's bucket search and a sum)."""
    meter = SessionMeter()
    meter.start(0.0, 0)
    started = time.perf_counter()
    for i in range(1, n + 1):
        meter.step(i * 0.01, i)
    return (time.perf_counter() - started) / n


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pairs", type=int, default=40, help="on/off block pairs")
    ap.add_argument("--block-steps", type=int, default=25, help="steps per block")
    ap.add_argument("--width", type=int, default=512, help="hidden width of the MLP (sets the step time)")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument(
        "--every-steps",
        type=int,
        default=None,
        help="periodic checkpoint interval (default: one save per pair, as the pair starts, so that its "
        "background writing slows the off-first and the on-first pairs alike)",
    )
    ap.add_argument("--scrape-interval", type=float, default=1.0, help="seconds between scrapes while on")
    ap.add_argument("--out", type=Path, default=RESULTS)
    args = ap.parse_args(argv)
    args.every_steps = args.every_steps or 2 * args.block_steps
    torch.set_num_threads(1)  # one core: the machine's other core is the exporter's and the writer's

    work = Path(tempfile.mkdtemp(prefix="gpucloud-bench-exporter-"))
    ctl = work / "control"
    model, optimizer = build(args.width)
    session = TrainingSession(
        model,
        optimizer,
        checkpoint_uri=str(work / "ck"),
        job_id="bench",
        control_dir=str(ctl),
        every_steps=args.every_steps,
        keep_last=1,
        data_from_step=True,
    )
    step = session.restore()
    node = NodeMetrics(NodeLabels(instance_id="bench", node_group=""))
    node.attempt_started("bench", 1, ctl)
    server = MetricsServer(node, address="127.0.0.1", port=0)
    scraper = Scraper(server.url, args.scrape_interval)
    real_meter, no_meter = session.meter, NoMeter()
    times: dict[str, list[float]] = {"on": [], "off": []}
    pair_ratios: list[float] = []  # each pair's median on / median off: neighbours in time, same load
    gen = torch.Generator().manual_seed(0)
    x, y = torch.randn(args.batch, 64, generator=gen), torch.randn(args.batch, 1, generator=gen)

    def block(mode: str) -> None:
        nonlocal step
        session.meter = real_meter if mode == "on" else no_meter
        if mode == "on":
            real_meter.start(time.monotonic(), step)  # the off block's steps are not this meter's
            scraper.on.set()
        else:
            scraper.on.clear()
        for _ in range(args.block_steps):
            started = time.perf_counter()
            loss = torch.nn.functional.mse_loss(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            step += 1
            session.step_done(step)
            times[mode].append(time.perf_counter() - started)

    try:
        block("on")  # warm-up, not counted: first allocations, the first save
        times["on"].clear()
        for pair in range(args.pairs):
            before = {mode: len(times[mode]) for mode in times}
            for mode in ("off", "on") if pair % 2 == 0 else ("on", "off"):
                block(mode)
            on_block, off_block = (statistics.median(times[m][before[m] :]) for m in ("on", "off"))
            pair_ratios.append(on_block / off_block)
        session.finish()
    finally:
        scraper.close()
        server.close()
    on, off = statistics.median(times["on"]), statistics.median(times["off"])
    ratio = on / off
    paired = statistics.median(pair_ratios)
    report = {
        "benchmark": "exporter",
        "config": config_of(
            args,
            steps_per_mode=len(times["on"]),
            host=platform.node(),
            cpus=os.cpu_count(),
            torch=torch.__version__,
            exporter="in the training process (shares its GIL): an upper bound",
        ),
        "on": {
            "median_step_s": round(on, 6),
            "p90_step_s": round(percentile(times["on"], 0.9), 6),
            "scrapes": len(scraper.durations),
            "scrape_median_s": round(statistics.median(scraper.durations), 6) if scraper.durations else None,
            "meter_per_step_s": round(meter_step_seconds(), 9),  # the session's own work per step, alone
        },
        "off": {"median_step_s": round(off, 6), "p90_step_s": round(percentile(times["off"], 0.9), 6)},
        "summary": {
            "median_step_on_over_off": round(ratio, 4),
            "median_of_pair_ratios": round(paired, 4),  # the same, pair by pair: less sensitive to drift
            "median_step_on_s": round(on, 6),
            "median_step_off_s": round(off, 6),
            "scrapes": len(scraper.durations),
        },
        "goals_met": {
            f"median_step_with_metrics_within_{round((GOAL_RATIO - 1) * 100)}pct": max(ratio, paired) <= GOAL_RATIO
        },
    }
    return finish(args.out, report)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
