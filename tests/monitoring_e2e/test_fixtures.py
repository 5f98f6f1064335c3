"""The stand-ins of the end-to-end test are what they claim to be: the recorded dcgm-exporter scrapes
(8 GPUs of the right model, dcgm-exporter's labels, every field our counters file turns on), the
fixture exporter serves them as dcgm-exporter would with a counters file, and the real node_exporter
reads the fixture sysfs as 32 EFA devices."""

from __future__ import annotations

import pytest
from prometheus_client.parser import text_string_to_metric_families

from .dcgm_fixture import FIELDS, NODES, FixtureExporter, fixture_path, recording, served_text
from .efa_sysfs import EFA_DEVICES, write_efa_sysfs
from .tools import NODE_EXPORTER, NodeExporter, ci_requires_tools, http_get, missing_tools_reason

DCGM_LABELS = {"gpu", "UUID", "pci_bus_id", "device", "modelName", "Hostname", "DCGM_FI_DRIVER_VERSION"}


def families(text: str) -> dict[str, list]:
    return {f.name: f.samples for f in text_string_to_metric_families(text)}


@pytest.mark.parametrize("instance_type", sorted(NODES))
def test_the_committed_recording_is_the_generators_output(instance_type):
    assert fixture_path(instance_type).read_text() == recording(NODES[instance_type]), (
        "regenerate with: .venv/bin/python tests/monitoring_e2e/dcgm_fixture.py"
    )


@pytest.mark.parametrize(
    ("instance_type", "model", "fb_total_mib"),
    [("p4d.24xlarge", "NVIDIA A100-SXM4-40GB", 40960), ("p5.48xlarge", "NVIDIA H100 80GB HBM3", 81559)],
)
def test_a_recording_has_eight_gpus_of_the_model_with_dcgm_exporters_labels(instance_type, model, fb_total_mib):
    parsed = families(fixture_path(instance_type).read_text())
    assert len(parsed) == len(FIELDS)
    for name, samples in parsed.items():
        assert sorted(int(s.labels["gpu"]) for s in samples) == list(range(8)), name
        assert {s.labels["modelName"] for s in samples} == {model}, name
        assert {s.labels["device"] for s in samples} == {f"nvidia{i}" for i in range(8)}, name
        assert all(set(s.labels) >= DCGM_LABELS for s in samples), name
    assert len({s.labels["UUID"] for s in parsed["DCGM_FI_DEV_GPU_UTIL"]}) == 8
    memory = {
        name: {s.labels["gpu"]: s.value for s in parsed[name]}
        for name in ("DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_FB_FREE", "DCGM_FI_DEV_FB_RESERVED")
    }
    for gpu in memory["DCGM_FI_DEV_FB_USED"]:
        assert sum(m[gpu] for m in memory.values()) == fb_total_mib  # used + free + reserved = the board's memory


def test_every_field_the_shipped_counters_file_turns_on_is_in_both_recordings():
    from gpucloud.monitoring.dcgm_fields import counters_csv, parse_counters

    wanted = {c.field for c in parse_counters(counters_csv()) if c.prometheus_type != "label"}
    for instance_type in NODES:
        recorded = set(families(fixture_path(instance_type).read_text()))
        assert wanted <= recorded, f"{instance_type}: record these too: {sorted(wanted - recorded)}"


def test_the_fixture_exporter_serves_only_what_a_counters_file_lists():
    counters = (
        "# a comment\n"
        "DCGM_FI_DEV_GPU_UTIL, gauge, GPU utilization (in %).\n"
        "DCGM_EXP_XID_ERRORS_COUNT, gauge, XID events.\n"
    )
    served = families(served_text(recording(NODES["p5.48xlarge"]), counters))
    assert set(served) == {"DCGM_FI_DEV_GPU_UTIL", "DCGM_EXP_XID_ERRORS_COUNT"}
    # DCGM_FI_DRIVER_VERSION is a label only when the file lists it as one (type "label")
    assert not any("DCGM_FI_DRIVER_VERSION" in s.labels for samples in served.values() for s in samples)
    # no XID in the window: one 0-valued series per GPU, without an xid label
    xid = served["DCGM_EXP_XID_ERRORS_COUNT"]
    assert len(xid) == 8 and {s.value for s in xid} == {0} and not any("xid" in s.labels for s in xid)
    assert {s.labels["window_size_in_ms"] for s in xid} == {"300000"}

    with_label = families(
        served_text(recording(NODES["p5.48xlarge"]), counters + "DCGM_FI_DRIVER_VERSION, label, Driver\n")
    )
    assert {s.labels["DCGM_FI_DRIVER_VERSION"] for s in with_label["DCGM_FI_DEV_GPU_UTIL"]} == {"580.105.08"}


def test_the_fixture_exporter_answers_over_http():
    text = recording(NODES["p4d.24xlarge"])
    with FixtureExporter(text) as exporter:
        assert http_get(f"http://{exporter.address}/metrics") == text.encode()
        assert http_get(f"http://{exporter.address}/other") is None
        assert exporter.scrapes == 1


needs_node_exporter = pytest.mark.skipif(
    bool(missing_tools_reason(NODE_EXPORTER)) and not ci_requires_tools(),
    reason=missing_tools_reason(NODE_EXPORTER) or "",
)


@needs_node_exporter
@pytest.mark.parametrize("instance_type", sorted(EFA_DEVICES))
def test_the_real_node_exporter_reads_the_fixture_sysfs_as_the_instances_efa_devices(tmp_path, instance_type):
    names = write_efa_sysfs(tmp_path / "sys", EFA_DEVICES[instance_type])
    with NodeExporter(tmp_path / "sys", tmp_path / "node_exporter.log") as node_exporter:
        body = http_get(f"http://{node_exporter.address}/metrics")
    assert body is not None
    parsed = families(body.decode())
    assert [s.value for s in parsed["node_scrape_collector_success"] if s.labels["collector"] == "infiniband"] == [1]
    assert sorted(s.labels["device"] for s in parsed["node_infiniband_info"]) == sorted(names)
    assert len(names) == EFA_DEVICES[instance_type]
    assert {(s.labels["port"], s.value) for s in parsed["node_infiniband_state_id"]} == {("1", 4)}  # ACTIVE
    assert {s.value for s in parsed["node_infiniband_rate_bytes_per_second"]} == {100e9 / 8}
    # EFA has no PMA port counters: node_exporter exports no port traffic for it (module docstring).
    assert not any(name.startswith("node_infiniband_port_data") for name in parsed)


@needs_node_exporter
def test_with_pma_counters_the_collector_exports_port_traffic_too(tmp_path):
    write_efa_sysfs(tmp_path / "sys", 2, pma_counters=True)
    with NodeExporter(tmp_path / "sys", tmp_path / "node_exporter.log") as node_exporter:
        body = http_get(f"http://{node_exporter.address}/metrics")
    assert body is not None
    parsed = families(body.decode())
    assert len(parsed["node_infiniband_port_data_received_bytes"]) == 2
