"""Every PromQL expression of the rendered dashboards and rules reads what a node exports.

A real Prometheus on 127.0.0.1 scrapes, every second, a p5.48xlarge node made of a real
``gpucloud agent`` running a real ``spot-train`` attempt (torchrun, gloo, the example training
script), the real node_exporter over a sysfs of 32 EFA devices, and the fixture dcgm-exporter serving
a recorded p5 scrape with the counters file the image ships (``scenario.py``); the agent reads the
same sysfs's EFA counters. Every expression ``gpucloud.monitoring.all_expressions`` lists is evaluated
through the HTTP API (range-vector expressions as written, Grafana's variables replaced by the node's
values) at two instants: while the attempt runs, and once the notice and its commit were scraped:

* an expression that returns samples passes;
* one that returns nothing passes only if it waits for an event this run did not have (an XID, a
  remapped row, ...): every metric it reads must have series in Prometheus, and every label it
  matches on must be on them (``xid``/``clock_event`` appear with their events only). A panel or
  rule that queries a metric nothing exports, or a label no exporter sets, fails here.

The gate opens at the notice: the rank saves, the attempt is requeued and the agent prints its summary
(exit code 75), then keeps serving /metrics (``--metrics-linger``): Prometheus scrapes the notice, its
commit and the emergency save after the attempt ended, and SIGTERM ends the agent with 75.
"""

from __future__ import annotations

import os
import re
import signal
import time
from pathlib import Path

import pytest

from agent.gated_train import held_marker
from helpers.waiting import wait_for
from node_env import NODE_ENV

from .promql import selectors
from .scenario import GATE_AFTER_STEP, INSTANCE_ID, JOB_ID, monitored_node
from .tools import NODE_EXPORTER, PROMETHEUS, ci_requires_tools, missing_tools_reason

MISSING = missing_tools_reason(PROMETHEUS, NODE_EXPORTER)
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(bool(MISSING) and not ci_requires_tools(), reason=MISSING or ""),
]

# Labels that exist only with their events (dcgm-exporter's expcollector.go): absent from a healthy node.
EVENT_LABELS = {"DCGM_EXP_XID_ERRORS_COUNT": {"xid"}, "DCGM_EXP_CLOCK_EVENTS_COUNT": {"clock_event"}}


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    clean = {k: v for k, v in os.environ.items() if k not in NODE_ENV}
    return clean | {"GPUCLOUD_HOME": str(tmp_path / "home")}


def grafana_values(node_group: str) -> dict[str, str]:
    """What the dashboards' template variables select: this node, this job (Grafana's interval
    variables keep expressions_in's durations)."""
    return {"instance_id": INSTANCE_ID, "node_group": node_group, "job_id": JOB_ID}


def unexported(expr: str, label_names: dict[str, set[str]]) -> list[tuple[str, str]]:
    """(metric, why) for what an expression that returned nothing reads and no exporter sets (empty:
    the expression only waits for an event)."""
    problems = []
    for selector in selectors(expr):
        name = selector.name or next((v for k, op, v in selector.matchers if k == "__name__" and op == "="), "")
        if not name:
            continue
        if name not in label_names:
            problems.append((name, "no series"))
            continue
        allowed = label_names[name] | EVENT_LABELS.get(name, set())
        for label, op, wanted in selector.matchers:
            matches_missing = op in ("=", "=~") and re.fullmatch(wanted, "") is not None
            if label != "__name__" and label not in allowed and not matches_missing:
                problems.append((name, f"no label {label} (it has {', '.join(sorted(label_names[name]))})"))
    return problems


def test_every_dashboard_and_rule_expression_reads_what_the_node_exports(tmp_path, env):
    from gpucloud.monitoring import all_expressions, expressions_in

    with monitored_node(tmp_path, env) as node:
        prom = node.prometheus
        agent = node.agent
        wait_for(
            lambda: prom.query(f'gpucloud_attempt_running{{job_id="{JOB_ID}"}} == 1'),
            180,
            f"Prometheus to scrape the agent running the attempt\n{agent.output()}",
            every=0.1,  # polling an HTTP server
        )
        running = wait_for(
            lambda: held_marker(node.gate).exists() and prom.query("gpucloud_training_step > 0"),
            120,
            f"the rank at the gate (after step {GATE_AFTER_STEP}) and its step in Prometheus\n{agent.output()}",
            every=0.1,  # polling an HTTP server
        )
        running_at = float(running[0]["value"][0])
        # The notice, and the run goes on as on the node: the rank saves, the job is requeued, the
        # agent prints its summary (exit code 75) within seconds, then keeps /metrics up (--metrics-linger).
        node.emulator.spot_interruption("terminate", lead_seconds=120)
        node.open_gate()
        wait_for(
            lambda: any(line.get("event") == "summary" for line in agent.lines),
            120,
            f"the attempt to end and the agent to print its summary\n{agent.output()}",
            every=0.1,  # polling an HTTP server
        )
        ended_at = time.time()
        # Prometheus still scrapes the agent after its work ended: the notice, its commit and the
        # emergency save, in one scrape taken after the summary line.
        after = wait_for(
            lambda: prom.query(
                # timestamp() of a bare selector: the scrape's time (of anything else: the query's)
                f"timestamp(gpucloud_notice_to_commit_seconds_count) > {ended_at:.3f}"
                " and on (instance_id) (gpucloud_notice_to_commit_seconds_count == 1)"
                ' and on (instance_id) (gpucloud_notices_total{kind="spot-interruption"} == 1)'
                ' and on (instance_id) (gpucloud_checkpoint_save_seconds_count{kind="emergency"} > 0)'
            ),
            60,
            f"Prometheus to scrape the notice and its commit after the attempt ended\n{agent.output()}",
            every=0.1,  # polling an HTTP server
        )
        at = float(after[0]["value"][0])
        summary = next(line for line in agent.lines if line.get("event") == "summary")
        assert (summary["stopped_by"], summary["exit_code"]) == ("spot-interruption", 75), summary
        assert agent.proc.poll() is None, "the agent lingers with /metrics up"
        up = {s["metric"]["job"]: s["value"][1] for s in prom.query("up", at=at)}
        assert up == {"dcgm-exporter": "1", "node-exporter": "1", "gpucloud-agent": "1"}, up
        # Every series of the node carries its instance id and group, the agent's own included (the
        # labels rules and dashboards join on).
        labelled = prom.query('count by (job, instance_id, node_group) ({job=~".+"})', at=at)
        assert {(s["metric"].get("instance_id"), s["metric"].get("node_group")) for s in labelled} == {
            (INSTANCE_ID, node.node_group)
        }, labelled
        assert {s["metric"]["job"] for s in labelled} == set(up)

        label_names: dict[str, set[str]] = {}
        for series in prom.api(
            "series", **{"match[]": '{__name__=~".+"}', "start": f"{running_at - 600:.3f}", "end": f"{at:.3f}"}
        ):
            label_names.setdefault(series["__name__"], set()).update(k for k in series if k != "__name__")

        expressions = expressions_in(node.files, grafana_values(node.node_group))
        assert {e.raw for e in expressions} == set(all_expressions(node.files))
        assert {e.kind for e in expressions} == {"rule", "panel", "variable"}, "rules and both dashboards"
        # An expression returns data while the attempt ran (held at the gate), or once its notice and
        # commit were scraped.
        returned, waiting, failures = [], [], []
        for e in expressions:
            if prom.query(e.promql, at=running_at) or prom.query(e.promql, at=at):
                returned.append(e)
                continue
            if problems := unexported(e.promql, label_names):
                failures.append(
                    f"{e.file} {e.kind} {e.where!r}: {e.raw}\n    -> " + "; ".join(f"{m}: {w}" for m, w in problems)
                )
            else:
                waiting.append(e)
        assert not failures, "expressions that read what no exporter exports:\n" + "\n".join(failures)
        efa = [e for e in returned if "gpucloud_efa_" in e.raw]
        assert len(efa) >= 2, "the EFA throughput and error panels read the agent's EFA counters"
        assert len(returned) > len(waiting), f"most expressions should return data; empty: {waiting}"
        print(
            f"\n{len(returned)} of {len(expressions)} expressions returned data; waiting for an event: "
            + ", ".join(sorted({e.where for e in waiting}))
        )

        # SIGTERM ends the linger; the exit code is still the notice's.
        agent.proc.send_signal(signal.SIGTERM)
        assert agent.proc.wait(timeout=60) == 75, agent.output()
