"""The monitoring plan's pure functions: series estimate, TSDB volume size, hourly cost."""

from __future__ import annotations

import json

import pytest

from gpucloud.catalog import load_catalog
from gpucloud.catalog.pricing import hourly_price
from gpucloud.cluster import monitoring_plan as mp


@pytest.fixture(scope="module")
def types():
    return load_catalog().instance_types


def test_p5_node_exports_more_series_than_p4d(types):
    # p5: 8 GPUs, 192 vCPUs, 32 EFA devices; p4d: 8 GPUs, 96 vCPUs, 4 EFA devices
    p5, p4d = mp.series_per_node(types["p5.48xlarge"]), mp.series_per_node(types["p4d.24xlarge"])
    dcgm, node = 8 * mp.DCGM_SERIES_PER_GPU, mp.NODE_BASE_SERIES + 192 * mp.NODE_SERIES_PER_VCPU + 32 * 5
    assert p5 == dcgm + node + 120 + 32 * 22  # the agent: its own series, and 22 EFA counters per device
    assert p5 > p4d
    assert p5 >= 4118  # measured at p5 size by benchmarks/bench_scrape.py (docs/monitoring.md): cover it


def test_cluster_series_counts_every_node_at_max(types):
    p5 = types["p5.48xlarge"]
    assert mp.cluster_series([(p5, 2), (types["g6.xlarge"], 0)]) == 2 * mp.series_per_node(p5)


def test_volume_follows_prometheus_sizing_formula():
    # retention_s * samples/s * bytes/sample (prometheus.io storage docs), plus headroom, whole GiB
    series, days = 1_000_000, 30
    expected = series / mp.SCRAPE_INTERVAL_SECONDS * days * 86400 * mp.BYTES_PER_SAMPLE * mp.DISK_HEADROOM / 2**30
    assert mp.data_volume_gib(series, days) == int(expected) + 1


def test_volume_has_a_floor_and_grows_with_retention():
    assert mp.data_volume_gib(10, 1) == mp.MIN_DATA_VOLUME_GIB
    assert mp.data_volume_gib(100_000, 365) > mp.data_volume_gib(100_000, 30) > mp.MIN_DATA_VOLUME_GIB


def test_retention_size_leaves_room_for_the_wal():
    assert mp.retention_size_gib(20) == 16 and mp.retention_size_gib(1) == 1


def test_volume_never_exceeds_gp3_limit():
    assert mp.data_volume_gib(10**9, 3650) == mp.MAX_DATA_VOLUME_GIB


def test_self_hosted_cost_is_instance_plus_both_volumes():
    prices = mp.service_prices()
    cost = mp.monitor_cost("self-hosted", 10_000, 15, "t3.large")
    assert cost.instance == prices.monitor_instances_usd_per_hour["t3.large"]
    gib = mp.MIN_DATA_VOLUME_GIB + mp.ROOT_VOLUME_GIB
    assert cost.storage == pytest.approx(gib * prices.ebs_gp3_usd_per_gb_month / prices.hours_per_month, abs=1e-4)
    assert cost.total == pytest.approx(cost.instance + cost.storage, abs=1e-4)
    assert not cost.estimate


def test_managed_cost_is_an_estimate_from_samples():
    prices = mp.service_prices()
    cost = mp.monitor_cost("managed", 15_000, 15, "t3.large")  # 1000 samples/s at a 15 s scrape
    assert cost.amp_ingest == pytest.approx(3.6e6 / 1e7 * prices.amp_ingest_usd_per_10m_samples, abs=1e-4)
    assert cost.instance is None and cost.estimate
    assert cost.total == pytest.approx(cost.amp_ingest + cost.amp_storage, abs=1e-4)


def test_unknown_instance_price_makes_the_total_unknown_not_zero():
    assert mp.monitor_cost("self-hosted", 100, 15, "x9.huge").total is None


def test_off_costs_nothing():
    assert mp.monitor_cost("off", 10_000, 15, "t3.large").total == 0.0


def test_price_file_has_its_date_and_sources():
    prices = mp.service_prices()
    assert prices.sources and prices.as_of.year >= 2026
    assert "t3.large" in mp.monitor_instance_types()


# --- `gpucloud plan` shows the monitor's cost next to the cluster's --------------------------------


def run_plan(argv: list[str], capsys) -> str:
    from gpucloud.cli import main

    try:
        main(argv)
    except SystemExit as done:
        assert (done.code or 0) == 0
    return capsys.readouterr().out


def test_plan_prints_the_self_hosted_monitor_next_to_the_cluster(capsys, types):
    out = " ".join(run_plan(["plan", "--stack", "p5-capacity-block"], capsys).split())
    series = mp.cluster_series([(types["p5.48xlarge"], 2)])
    cost = mp.monitor_cost("self-hosted", series, 15, "t3.large")
    assert f"Monitoring (self-hosted): ${cost.total:.4f}/hour (t3.large ${cost.instance:.4f}" in out
    assert f"gp3 TSDB {mp.MIN_DATA_VOLUME_GIB} GiB" in out
    block = hourly_price("p5.48xlarge", "us-east-1", "capacity-block").usd_per_hour  # what the block's nodes cost
    assert f"{100 * cost.total / (2 * block):.2f}% of the cluster's" in out


def test_plan_json_carries_the_monitoring_cost(capsys, tmp_path):
    from gpucloud.spec import stack_file_for

    text = stack_file_for("p4d-spot").read_text().replace("mode: self-hosted", "mode: managed")
    assert "mode: managed" in text
    path = tmp_path / "Pulumi.amp.yaml"
    path.write_text(text)
    data = json.loads(run_plan(["plan", "--stack-file", str(path), "--output", "json"], capsys))
    monitoring = data["monitoring"]
    assert monitoring["mode"] == "managed" and monitoring["estimate"] is True
    assert monitoring["total"] == pytest.approx(monitoring["amp_ingest"] + monitoring["amp_storage"], abs=1e-4)
    assert any(r["type"] == "aws:amp/workspace:Workspace" for r in data["resources"])
    assert data["policy_violations"] == []
