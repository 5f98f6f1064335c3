"""The dashboards: built with grafana-foundation-sdk, every panel has a query, and every PromQL
expression of the dashboards and rules parses (promtool)."""

from __future__ import annotations

import json

import pytest

from gpucloud.monitoring import all_expressions, check_rules_file, expressions_in, render
from gpucloud.monitoring.dashboards import panels, render_dashboards
from gpucloud.monitoring.expressions import Expression, substitute

from .conftest import TOPIC, assert_ok, run_tool, shipped_spec


@pytest.fixture(scope="module")
def files() -> dict[str, str]:
    return render(shipped_spec(), "p5-capacity-block", sns_topic_arn=TOPIC)


def test_two_dashboards_for_the_cluster_and_a_job(files):
    boards = {p: json.loads(t) for p, t in files.items() if p.startswith("dashboards/")}
    assert set(boards) == {"dashboards/cluster.json", "dashboards/job.json"}
    assert boards["dashboards/cluster.json"]["uid"] == "gpucloud-p5-capacity-block-cluster"
    job_vars = {v["name"] for v in boards["dashboards/job.json"]["templating"]["list"]}
    assert {"job_id", "datasource"} <= job_vars


@pytest.mark.parametrize("board", ["dashboards/cluster.json", "dashboards/job.json"])
def test_every_panel_has_a_query_on_the_datasource_variable(files, board):
    found = panels(json.loads(files[board]))
    assert len(found) >= 10
    for panel in found:
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, panel["title"]
        assert panel["targets"], f"{panel['title']}: no query"
        assert all(t.get("expr", "").strip() for t in panel["targets"]), panel["title"]


def test_the_cluster_dashboard_covers_what_the_issue_lists(files):
    exprs = " ".join(e.raw for e in expressions_in({"dashboards/cluster.json": files["dashboards/cluster.json"]}))
    for metric in (
        "DCGM_FI_DEV_GPU_UTIL",
        "DCGM_FI_DEV_FB_USED",
        "DCGM_FI_DEV_GPU_TEMP",
        "DCGM_FI_DEV_POWER_USAGE",
        "DCGM_EXP_XID_ERRORS_COUNT",
        "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",
        # EFA throughput and errors: the driver's hw_counters, which the agent exports (node_exporter's
        # infiniband collector has none for EFA devices)
        "gpucloud_efa_rx_bytes_total",
        "gpucloud_efa_tx_bytes_total",
        "gpucloud_efa_rx_drops_total",
        "gpucloud_efa_retrans_pkts_total",
    ):
        assert metric in exprs, metric
    assert "node_infiniband_port_" not in exprs, "EFA devices have no PMA port counters: such a panel stays empty"


def test_the_job_dashboard_covers_what_the_issue_lists(files):
    exprs = " ".join(e.raw for e in expressions_in({"dashboards/job.json": files["dashboards/job.json"]}))
    for metric in (
        "gpucloud_step_seconds_count",  # steps per second
        "gpucloud_checkpoint_stall_seconds_sum",  # stalls and their share of time
        "gpucloud_notices_total",
        "gpucloud_steps_lost_total",
        "DCGM_FI_DEV_GPU_UTIL",  # the GPUs it holds, and how busy they are
    ):
        assert metric in exprs, metric
    assert 'job_id=~"$job_id"' in exprs


def test_all_expressions_lists_every_rule_and_panel_query(files):
    listed = all_expressions(files)
    assert all(isinstance(e, str) for e in listed) and len(listed) == len(set(listed))
    found = expressions_in(files)
    rules = [e for e in found if e.kind == "rule"]
    assert {e.where for e in rules} >= {"GpuXidError", "TrainingStalled", "NodeAgentDown"}
    targets = sum(
        len(p["targets"])
        for b in ("dashboards/cluster.json", "dashboards/job.json")
        for p in panels(json.loads(files[b]))
    )
    assert len([e for e in found if e.kind == "panel"]) == targets
    assert set(listed) == {e.raw for e in found}


def test_grafana_variables_become_promql():
    assert substitute('rate(x{job_id=~"$job_id", n=~"${node_group}"}[$__rate_interval])') == (
        'rate(x{job_id=~".*", n=~".*"}[5m])'
    )
    assert substitute('x{a=~"[[a]]"}', {"a": "i-1"}) == 'x{a=~"i-1"}'


def test_promtool_parses_every_expression(tmp_path, promtool, files):
    found = expressions_in(files)
    (tmp_path / "check.yml").write_text(check_rules_file(found))
    result = run_tool([promtool, "check", "rules", "check.yml"], cwd=tmp_path)
    assert_ok(result)
    assert f"{len(found)} rules found" in result.stdout


def test_promtool_fails_on_a_broken_expression(tmp_path, promtool, files):
    broken = [*expressions_in(files), Expression("dashboards/x.json", "x", "panel", "rate(up[5m]", "rate(up[5m]")]
    (tmp_path / "check.yml").write_text(check_rules_file(broken))
    assert run_tool([promtool, "check", "rules", "check.yml"], cwd=tmp_path).returncode != 0


def test_dashboards_are_built_by_the_sdk_not_written_by_hand():
    # the SDK's builders write fields no hand-written JSON here would (schemaVersion, fieldConfig)
    board = json.loads(render_dashboards("c")["dashboards/job.json"])
    assert board["schemaVersion"] >= 36
    assert all("fieldConfig" in p for p in panels(board))
