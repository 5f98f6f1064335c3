"""The EFA devices' counters on the agent's /metrics (``gpucloud_efa_*``), read from a fixture sysfs
shaped as the EFA driver publishes it (``tests/monitoring_e2e/efa_sysfs.py``)."""

from __future__ import annotations

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from gpucloud.agent.efa_metrics import EFA_PORT_COUNTERS, metric_name
from gpucloud.agent.metrics import registry_for
from monitoring_e2e.efa_sysfs import EFA_HW_COUNTERS, write_efa_sysfs

from .test_metrics import node_metrics


def samples(text: str) -> dict[tuple[str, str, str], float]:
    """(sample name, device, port) -> value of every gpucloud_efa_* sample."""
    return {
        (s.name, s.labels["device"], s.labels["port"]): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name.startswith("gpucloud_efa_")
    }


def test_every_efa_port_counter_is_a_counter_per_device_and_port_with_the_nodes_labels(tmp_path):
    devices = write_efa_sysfs(tmp_path / "sys", 32)
    text = generate_latest(registry_for(node_metrics(), sysfs=tmp_path / "sys")).decode()
    families = {f.name: f for f in text_string_to_metric_families(text) if f.name.startswith("gpucloud_efa_")}
    # every counter the driver publishes but lifespan (the stats cache's lifetime, not a count)
    assert set(EFA_PORT_COUNTERS) == set(EFA_HW_COUNTERS) - {"lifespan"}
    assert set(families) == {metric_name(c).removesuffix("_total") for c in EFA_PORT_COUNTERS}
    assert {f.type for f in families.values()} == {"counter"}
    values = samples(text)
    assert len(values) == 32 * len(EFA_PORT_COUNTERS)
    # the value is the file's: write_efa_sysfs writes (device index + 1) * 1000003 * (counter index)
    index = EFA_HW_COUNTERS.index("rdma_read_bytes")
    assert values[("gpucloud_efa_rdma_read_bytes_total", devices[2], "1")] == 3 * 1000003 * index
    labels = {k: v for f in families.values() for s in f.samples for k, v in s.labels.items() if k != "device"}
    assert labels == {"port": "1", "instance_id": "i-0123456789abcdef0", "node_group": "p5"}


def test_counters_are_read_at_each_scrape_and_what_is_missing_or_unreadable_is_skipped(tmp_path):
    (device,) = write_efa_sysfs(tmp_path / "sys", 1)
    counters = tmp_path / "sys" / "class" / "infiniband" / device / "ports" / "1" / "hw_counters"
    # another RDMA device's hw_counters (an mlx5 NIC) share none of EFA's names: not exported
    other = tmp_path / "sys" / "class" / "infiniband" / "mlx5_0" / "ports" / "1" / "hw_counters"
    other.mkdir(parents=True)
    (other / "out_of_buffer").write_text("7\n")
    registry = registry_for(node_metrics(), sysfs=tmp_path / "sys")
    (counters / "tx_bytes").write_text("123\n")
    (counters / "rx_drops").write_text("not a number\n")
    (counters / "retrans_pkts").unlink()  # an older driver without it
    first = samples(generate_latest(registry).decode())
    assert first[("gpucloud_efa_tx_bytes_total", device, "1")] == 123
    assert ("gpucloud_efa_rx_drops_total", device, "1") not in first
    assert ("gpucloud_efa_retrans_pkts_total", device, "1") not in first
    assert {d for _, d, _ in first} == {device}
    (counters / "tx_bytes").write_text("456\n")
    assert samples(generate_latest(registry).decode())[("gpucloud_efa_tx_bytes_total", device, "1")] == 456


def test_a_host_without_rdma_devices_exports_no_efa_series(tmp_path):
    for sysfs in (tmp_path / "empty", None):
        text = generate_latest(registry_for(node_metrics(), sysfs=sysfs)).decode()
        assert "gpucloud_efa_" not in text
        assert "gpucloud_agent_state" in text
