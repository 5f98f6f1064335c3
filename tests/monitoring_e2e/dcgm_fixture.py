"""The fixture dcgm-exporter: what dcgm-exporter 4.x serves on ``:9400/metrics`` for a p4d.24xlarge
(8 x A100-SXM4-40GB) and a p5.48xlarge (8 x H100 80GB HBM3) in training, and a tiny HTTP server
that serves it the way the real exporter would with a given counters file.

The recordings (``fixtures/dcgm-*.prom``) hold every field any counters file of ours may turn on;
``served_text`` keeps the fields a counters CSV lists, as dcgm-exporter's ``-f FILE`` does, so a
dashboard that queries a field the rendered counters file leaves off finds nothing here either.

Format, from public sources (fixtures/README.md names them):
* the exposition of dcgm-exporter's README and NVIDIA's docs: ``# HELP``/``# TYPE`` per field, then
  one series per GPU labelled ``gpu, UUID, pci_bus_id, device, modelName, Hostname`` and the
  ``label``-type fields of the CSV (``DCGM_FI_DRIVER_VERSION``); integer fields print as integers,
  float fields with ``%f``;
* the field names, types and HELP texts of ``etc/default-counters.csv`` and
  ``etc/dcp-metrics-included.csv`` (DCGM 4: violation durations in ns);
* the exporter's own fields (``internal/pkg/collector/expcollector.go``): ``DCGM_EXP_XID_ERRORS_COUNT``
  and ``DCGM_EXP_CLOCK_EVENTS_COUNT`` carry ``window_size_in_ms``; a GPU with no event in the window
  has one 0-valued series without the ``xid``/``clock_event`` label.

Run this file to rewrite the recordings (``tests/monitoring_e2e/test_fixtures.py`` checks that the
committed files are its output).
"""

from __future__ import annotations

import csv
import dataclasses
import http.server
import threading
import uuid
from collections.abc import Iterable, Iterator
from pathlib import Path

FIXTURES = Path(__file__).with_name("fixtures")
HOSTNAME_LABEL = "Hostname"
DRIVER_VERSION = "580.105.08"  # images/versions.yaml's NVIDIA driver
XID_WINDOW_MS = 300000  # dcgm-exporter's --xid-count-window-size default (5 minutes)
CLOCK_EVENTS_WINDOW_MS = 300000  # --clock-events-count-window-size default

# (field, Prometheus type, HELP): dcgm-exporter's counters CSVs; exporter fields last.
FIELDS: tuple[tuple[str, str, str], ...] = (
    ("DCGM_FI_DEV_SM_CLOCK", "gauge", "SM clock frequency (in MHz)."),
    ("DCGM_FI_DEV_MEM_CLOCK", "gauge", "Memory clock frequency (in MHz)."),
    ("DCGM_FI_DEV_MEMORY_TEMP", "gauge", "Memory temperature (in C)."),
    ("DCGM_FI_DEV_GPU_TEMP", "gauge", "GPU temperature (in C)."),
    ("DCGM_FI_DEV_POWER_USAGE", "gauge", "Power draw (in W)."),
    ("DCGM_FI_DEV_POWER_MGMT_LIMIT", "gauge", "Current power limit for the device (in W)."),
    ("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "counter", "Total energy consumption since boot (in mJ)."),
    ("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", "counter", "Total number of PCIe retries."),
    ("DCGM_FI_DEV_GPU_UTIL", "gauge", "GPU utilization (in %)."),
    ("DCGM_FI_DEV_MEM_COPY_UTIL", "gauge", "Memory utilization (in %)."),
    ("DCGM_FI_DEV_ENC_UTIL", "gauge", "Encoder utilization (in %)."),
    ("DCGM_FI_DEV_DEC_UTIL", "gauge", "Decoder utilization (in %)."),
    ("DCGM_FI_DEV_XID_ERRORS", "gauge", "Value of the last XID error encountered."),
    ("DCGM_FI_DEV_CLOCKS_EVENT_REASONS", "gauge", "Current clock event reasons (bitmask)."),
    ("DCGM_FI_DEV_CLOCK_THROTTLE_REASONS", "gauge", "Current clock throttle reasons (bitmask)."),
    ("DCGM_FI_DEV_POWER_VIOLATION", "counter", "Throttling duration due to power constraints (in ns)."),
    ("DCGM_FI_DEV_THERMAL_VIOLATION", "counter", "Throttling duration due to thermal constraints (in ns)."),
    ("DCGM_FI_DEV_SYNC_BOOST_VIOLATION", "counter", "Throttling duration due to sync-boost constraints (in ns)."),
    ("DCGM_FI_DEV_BOARD_LIMIT_VIOLATION", "counter", "Throttling duration due to board limit constraints (in ns)."),
    ("DCGM_FI_DEV_LOW_UTIL_VIOLATION", "counter", "Throttling duration due to low utilization (in ns)."),
    ("DCGM_FI_DEV_RELIABILITY_VIOLATION", "counter", "Throttling duration due to reliability constraints (in ns)."),
    ("DCGM_FI_DEV_FB_TOTAL", "gauge", "Framebuffer memory total (in MiB)."),
    ("DCGM_FI_DEV_FB_FREE", "gauge", "Framebuffer memory free (in MiB)."),
    ("DCGM_FI_DEV_FB_USED", "gauge", "Framebuffer memory used (in MiB)."),
    ("DCGM_FI_DEV_FB_RESERVED", "gauge", "Framebuffer memory reserved (in MiB)."),
    ("DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", "counter", "Total number of single-bit volatile ECC errors."),
    ("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "counter", "Total number of double-bit volatile ECC errors."),
    ("DCGM_FI_DEV_ECC_SBE_AGG_TOTAL", "counter", "Total number of single-bit persistent ECC errors."),
    ("DCGM_FI_DEV_ECC_DBE_AGG_TOTAL", "counter", "Total number of double-bit persistent ECC errors."),
    ("DCGM_FI_DEV_RETIRED_SBE", "counter", "Total number of retired pages due to single-bit errors."),
    ("DCGM_FI_DEV_RETIRED_DBE", "counter", "Total number of retired pages due to double-bit errors."),
    ("DCGM_FI_DEV_RETIRED_PENDING", "counter", "Total number of pages pending retirement."),
    ("DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL", "counter", "Total number of NVLink flow-control CRC errors."),
    ("DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL", "counter", "Total number of NVLink data CRC errors."),
    ("DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL", "counter", "Total number of NVLink retries."),
    ("DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL", "counter", "Total number of NVLink recovery errors."),
    ("DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL", "counter", "Total number of NVLink bandwidth counters for all lanes."),
    ("DCGM_FI_DEV_VGPU_LICENSE_STATUS", "gauge", "vGPU License status"),
    ("DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", "counter", "Number of remapped rows for uncorrectable errors"),
    ("DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS", "counter", "Number of remapped rows for correctable errors"),
    ("DCGM_FI_DEV_ROW_REMAP_FAILURE", "gauge", "Whether remapping of rows has failed"),
    ("DCGM_FI_DEV_ROW_REMAP_PENDING", "gauge", "Whether remapping of rows is pending"),
    ("DCGM_FI_PROF_GR_ENGINE_ACTIVE", "gauge", "Ratio of time the graphics engine is active."),
    ("DCGM_FI_PROF_SM_ACTIVE", "gauge", "The ratio of cycles an SM has at least 1 warp assigned."),
    ("DCGM_FI_PROF_SM_OCCUPANCY", "gauge", "The ratio of number of warps resident on an SM."),
    ("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "gauge", "Ratio of cycles the tensor (HMMA) pipe is active."),
    (
        "DCGM_FI_PROF_DRAM_ACTIVE",
        "gauge",
        "Ratio of cycles the device memory interface is active sending or receiving data.",
    ),
    ("DCGM_FI_PROF_PIPE_FP64_ACTIVE", "gauge", "Ratio of cycles the fp64 pipes are active."),
    ("DCGM_FI_PROF_PIPE_FP32_ACTIVE", "gauge", "Ratio of cycles the fp32 pipes are active."),
    ("DCGM_FI_PROF_PIPE_FP16_ACTIVE", "gauge", "Ratio of cycles the fp16 pipes are active."),
    (
        "DCGM_FI_PROF_PCIE_TX_BYTES",
        "gauge",
        "The rate of data transmitted over the PCIe bus - including both protocol headers and data payloads - in bytes per second.",
    ),
    (
        "DCGM_FI_PROF_PCIE_RX_BYTES",
        "gauge",
        "The rate of data received over the PCIe bus - including both protocol headers and data payloads - in bytes per second.",
    ),
    (
        "DCGM_FI_PROF_NVLINK_TX_BYTES",
        "gauge",
        "The rate of data transmitted over NVLink, not including protocol headers, in bytes per second.",
    ),
    (
        "DCGM_FI_PROF_NVLINK_RX_BYTES",
        "gauge",
        "The rate of data received over NVLink, not including protocol headers, in bytes per second.",
    ),
    (
        "DCGM_EXP_XID_ERRORS_COUNT",
        "gauge",
        "Count of XID Errors within user-specified time window (see xid-count-window-size flag).",
    ),
    (
        "DCGM_EXP_CLOCK_EVENTS_COUNT",
        "gauge",
        "Count of clock events within the user-specified time window (see clock-events-count-window-size param).",
    ),
)
LABEL_FIELDS = ("DCGM_FI_DRIVER_VERSION",)  # CSV type "label": a label on every series, not a metric
EXPORTER_WINDOWS = {"DCGM_EXP_XID_ERRORS_COUNT": XID_WINDOW_MS, "DCGM_EXP_CLOCK_EVENTS_COUNT": CLOCK_EVENTS_WINDOW_MS}
FLOAT_FIELDS = {"DCGM_FI_DEV_POWER_USAGE", "DCGM_FI_DEV_POWER_MGMT_LIMIT"} | {
    name for name, _, _ in FIELDS if name.startswith("DCGM_FI_PROF_") and not name.endswith("_BYTES")
}


@dataclasses.dataclass(frozen=True)
class Gpu:
    index: int
    uuid: str
    pci_bus_id: str


@dataclasses.dataclass(frozen=True)
class Node:
    """One instance type in training: its GPUs and the readings of one scrape."""

    instance_type: str
    model_name: str
    hostname: str
    gpus: tuple[Gpu, ...]
    readings: dict[str, tuple[float, ...]]  # field -> one value per GPU


def _gpus(instance_type: str, buses: Iterable[str]) -> tuple[Gpu, ...]:
    # Stable made-up UUIDs in NVML's form (GPU-<uuid>): the recordings must not name real boards.
    return tuple(
        Gpu(
            index=i,
            uuid=f"GPU-{uuid.uuid5(uuid.NAMESPACE_DNS, f'{instance_type}.gpu{i}')}",
            pci_bus_id=f"00000000:{bus}",
        )
        for i, bus in enumerate(buses)
    )


def _per_gpu(*values: float) -> tuple[float, ...]:
    assert len(values) == 8
    return values


def _same(value: float) -> tuple[float, ...]:
    return (value,) * 8


def _common(fb_total: int, fb_used: tuple[float, ...], fb_reserved: int) -> dict[str, tuple[float, ...]]:
    """The fields that read the same on both: healthy GPUs, no errors, no retired pages."""
    zero = _same(0)
    return {
        "DCGM_FI_DEV_ENC_UTIL": zero,
        "DCGM_FI_DEV_DEC_UTIL": zero,
        "DCGM_FI_DEV_XID_ERRORS": zero,
        "DCGM_FI_DEV_PCIE_REPLAY_COUNTER": zero,
        "DCGM_FI_DEV_SYNC_BOOST_VIOLATION": zero,
        "DCGM_FI_DEV_BOARD_LIMIT_VIOLATION": zero,
        "DCGM_FI_DEV_LOW_UTIL_VIOLATION": zero,
        "DCGM_FI_DEV_RELIABILITY_VIOLATION": zero,
        "DCGM_FI_DEV_THERMAL_VIOLATION": zero,
        "DCGM_FI_DEV_FB_TOTAL": _same(fb_total),
        "DCGM_FI_DEV_FB_USED": fb_used,
        "DCGM_FI_DEV_FB_FREE": tuple(fb_total - fb_reserved - used for used in fb_used),
        "DCGM_FI_DEV_FB_RESERVED": _same(fb_reserved),
        **{f"DCGM_FI_DEV_ECC_{kind}_{scope}_TOTAL": zero for kind in ("SBE", "DBE") for scope in ("VOL", "AGG")},
        "DCGM_FI_DEV_RETIRED_SBE": zero,
        "DCGM_FI_DEV_RETIRED_DBE": zero,
        "DCGM_FI_DEV_RETIRED_PENDING": zero,
        "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL": zero,
        "DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL": zero,
        "DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL": zero,
        "DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL": zero,
        "DCGM_FI_DEV_VGPU_LICENSE_STATUS": zero,
        "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS": zero,
        "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS": zero,
        "DCGM_FI_DEV_ROW_REMAP_FAILURE": zero,
        "DCGM_FI_DEV_ROW_REMAP_PENDING": zero,
        "DCGM_FI_PROF_PIPE_FP64_ACTIVE": zero,
        "DCGM_FI_DEV_GPU_UTIL": _same(100),
        # 0: no clock event (DCGM_CLOCKS_EVENT_REASON_NONE); bit 0x4 is the software power cap.
        "DCGM_FI_DEV_CLOCKS_EVENT_REASONS": _per_gpu(0, 0, 4, 0, 0, 0, 4, 0),
        "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS": _per_gpu(0, 0, 4, 0, 0, 0, 4, 0),
        "DCGM_EXP_XID_ERRORS_COUNT": zero,
        "DCGM_EXP_CLOCK_EVENTS_COUNT": zero,
    }


# p4d.24xlarge: 8 x A100-SXM4-40GB (400 W), GPUs on the PCI buses nvidia-smi lists there.
P4D = Node(
    instance_type="p4d.24xlarge",
    model_name="NVIDIA A100-SXM4-40GB",
    hostname="ip-10-0-12-34",
    gpus=_gpus(
        "p4d.24xlarge", ("10:1C.0", "10:1D.0", "20:1C.0", "20:1D.0", "90:1C.0", "90:1D.0", "A0:1C.0", "A0:1D.0")
    ),
    readings={
        **_common(40960, _per_gpu(36829, 36829, 36831, 36829, 36829, 36833, 36829, 36829), 635),
        "DCGM_FI_DEV_SM_CLOCK": _same(1410),
        "DCGM_FI_DEV_MEM_CLOCK": _same(1215),
        "DCGM_FI_DEV_GPU_TEMP": _per_gpu(55, 52, 58, 54, 57, 53, 60, 56),
        "DCGM_FI_DEV_MEMORY_TEMP": _per_gpu(63, 60, 66, 62, 65, 61, 68, 64),
        "DCGM_FI_DEV_POWER_USAGE": _per_gpu(318.517, 301.224, 356.071, 322.996, 340.418, 297.853, 389.062, 331.575),
        "DCGM_FI_DEV_POWER_MGMT_LIMIT": _same(400),
        "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION": _per_gpu(
            9817612330, 9662004181, 10140883512, 9744981207, 9902118436, 9605520817, 10377209964, 9811420075
        ),
        "DCGM_FI_DEV_MEM_COPY_UTIL": _per_gpu(38, 36, 41, 37, 39, 35, 44, 38),
        "DCGM_FI_DEV_POWER_VIOLATION": _per_gpu(0, 0, 1835000000, 0, 0, 0, 4120000000, 0),
        "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL": _per_gpu(
            81734416, 81734102, 81735009, 81733877, 81734622, 81734240, 81735512, 81734091
        ),
        "DCGM_FI_PROF_GR_ENGINE_ACTIVE": _per_gpu(0.912, 0.905, 0.931, 0.909, 0.921, 0.899, 0.944, 0.914),
        "DCGM_FI_PROF_SM_ACTIVE": _per_gpu(0.873, 0.866, 0.895, 0.870, 0.884, 0.861, 0.909, 0.876),
        "DCGM_FI_PROF_SM_OCCUPANCY": _per_gpu(0.402, 0.398, 0.417, 0.401, 0.409, 0.395, 0.426, 0.404),
        "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": _per_gpu(0.431, 0.425, 0.452, 0.428, 0.440, 0.421, 0.463, 0.434),
        "DCGM_FI_PROF_DRAM_ACTIVE": _per_gpu(0.512, 0.507, 0.534, 0.510, 0.521, 0.503, 0.547, 0.515),
        "DCGM_FI_PROF_PIPE_FP32_ACTIVE": _per_gpu(0.118, 0.116, 0.124, 0.117, 0.120, 0.115, 0.128, 0.118),
        "DCGM_FI_PROF_PIPE_FP16_ACTIVE": _per_gpu(0.021, 0.020, 0.023, 0.021, 0.022, 0.020, 0.024, 0.021),
        "DCGM_FI_PROF_PCIE_TX_BYTES": _per_gpu(
            412838912, 409726208, 421527552, 411238400, 415891456, 407142400, 428343296, 412549120
        ),
        "DCGM_FI_PROF_PCIE_RX_BYTES": _per_gpu(
            1207959552, 1199570944, 1233125376, 1204813824, 1217396736, 1193279488, 1254096896, 1209008128
        ),
        "DCGM_FI_PROF_NVLINK_TX_BYTES": _per_gpu(
            98172518400, 97900154880, 99643162624, 98024873984, 98774548480, 97626603520, 100796416000, 98237235200
        ),
        "DCGM_FI_PROF_NVLINK_RX_BYTES": _per_gpu(
            98137800704, 97866215424, 99609608192, 97990451200, 98740076544, 97592524800, 100762177536, 98202812416
        ),
    },
)

# p5.48xlarge: 8 x H100 80GB HBM3 (700 W); the bus ids of an HGX H100 board.
P5 = Node(
    instance_type="p5.48xlarge",
    model_name="NVIDIA H100 80GB HBM3",
    hostname="ip-10-0-40-71",
    gpus=_gpus("p5.48xlarge", ("53:00.0", "64:00.0", "75:00.0", "86:00.0", "97:00.0", "A8:00.0", "B9:00.0", "CA:00.0")),
    readings={
        **_common(81559, _per_gpu(74211, 74211, 74215, 74211, 74211, 74219, 74211, 74211), 527),
        "DCGM_FI_DEV_SM_CLOCK": _per_gpu(1980, 1980, 1755, 1980, 1980, 1980, 1710, 1980),
        "DCGM_FI_DEV_MEM_CLOCK": _same(2619),
        "DCGM_FI_DEV_GPU_TEMP": _per_gpu(48, 46, 53, 47, 50, 45, 55, 49),
        "DCGM_FI_DEV_MEMORY_TEMP": _per_gpu(57, 55, 62, 56, 59, 54, 64, 58),
        "DCGM_FI_DEV_POWER_USAGE": _per_gpu(611.402, 598.113, 688.941, 604.557, 625.880, 589.036, 696.218, 617.309),
        "DCGM_FI_DEV_POWER_MGMT_LIMIT": _same(700),
        "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION": _per_gpu(
            21977214633, 21600410982, 23104725519, 21803317740, 22291605001, 21437218863, 23530110276, 22035882115
        ),
        "DCGM_FI_DEV_MEM_COPY_UTIL": _per_gpu(46, 44, 51, 45, 48, 43, 53, 46),
        "DCGM_FI_DEV_POWER_VIOLATION": _per_gpu(0, 0, 2750000000, 0, 0, 0, 6185000000, 0),
        "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL": _per_gpu(
            163469440, 163468911, 163470877, 163468102, 163469563, 163468377, 163471326, 163469005
        ),
        "DCGM_FI_PROF_GR_ENGINE_ACTIVE": _per_gpu(0.936, 0.929, 0.957, 0.932, 0.944, 0.925, 0.963, 0.938),
        "DCGM_FI_PROF_SM_ACTIVE": _per_gpu(0.891, 0.884, 0.915, 0.888, 0.901, 0.879, 0.922, 0.893),
        "DCGM_FI_PROF_SM_OCCUPANCY": _per_gpu(0.377, 0.372, 0.394, 0.375, 0.384, 0.369, 0.399, 0.379),
        "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": _per_gpu(0.518, 0.511, 0.541, 0.515, 0.527, 0.506, 0.552, 0.520),
        "DCGM_FI_PROF_DRAM_ACTIVE": _per_gpu(0.587, 0.581, 0.612, 0.584, 0.597, 0.576, 0.623, 0.589),
        "DCGM_FI_PROF_PIPE_FP32_ACTIVE": _per_gpu(0.097, 0.095, 0.103, 0.096, 0.099, 0.094, 0.106, 0.097),
        "DCGM_FI_PROF_PIPE_FP16_ACTIVE": _per_gpu(0.014, 0.013, 0.016, 0.014, 0.015, 0.013, 0.017, 0.014),
        "DCGM_FI_PROF_PCIE_TX_BYTES": _per_gpu(
            825753600, 819462144, 843055104, 822476800, 831782912, 814284800, 856686592, 825098240
        ),
        "DCGM_FI_PROF_PCIE_RX_BYTES": _per_gpu(
            2415919104, 2399141888, 2466250752, 2409627648, 2434793472, 2386558976, 2508193792, 2418016256
        ),
        "DCGM_FI_PROF_NVLINK_TX_BYTES": _per_gpu(
            196345036800,
            195800309760,
            199286325248,
            196049747968,
            197549096960,
            195253207040,
            201592832000,
            196474470400,
        ),
        "DCGM_FI_PROF_NVLINK_RX_BYTES": _per_gpu(
            196275601408,
            195732430848,
            199219216384,
            195980902400,
            197480153088,
            195185049600,
            201524355072,
            196405624832,
        ),
    },
)

NODES = {node.instance_type: node for node in (P4D, P5)}


def fixture_path(instance_type: str) -> Path:
    return FIXTURES / f"dcgm-{instance_type}.prom"


def _value(field: str, value: float) -> str:
    return f"{value:f}" if field in FLOAT_FIELDS else str(int(value))


def _series_labels(node: Node, gpu: Gpu) -> list[tuple[str, str]]:
    return [
        ("gpu", str(gpu.index)),
        ("UUID", gpu.uuid),
        ("pci_bus_id", gpu.pci_bus_id),
        ("device", f"nvidia{gpu.index}"),
        ("modelName", node.model_name),
        (HOSTNAME_LABEL, node.hostname),
        ("DCGM_FI_DRIVER_VERSION", DRIVER_VERSION),
    ]


def recording(node: Node) -> str:
    """The whole exposition: every field of FIELDS for every GPU, in dcgm-exporter's order."""
    missing = [name for name, _, _ in FIELDS if name not in node.readings]
    assert not missing, f"{node.instance_type}: no reading for {missing}"
    lines: list[str] = []
    for name, kind, help_text in FIELDS:
        lines += [f"# HELP {name} {help_text}", f"# TYPE {name} {kind}"]
        for gpu, value in zip(node.gpus, node.readings[name], strict=True):
            labels = _series_labels(node, gpu)
            if name in EXPORTER_WINDOWS:
                labels.append(("window_size_in_ms", str(EXPORTER_WINDOWS[name])))
            rendered = ",".join(f'{k}="{v}"' for k, v in labels)
            lines.append(f"{name}{{{rendered}}} {_value(name, value)}")
    return "\n".join(lines) + "\n"


def counters_fields(counters_csv: str) -> tuple[set[str], set[str]]:
    """(metric fields, label fields) a dcgm-exporter counters CSV turns on (comments are '#' lines)."""
    metrics: set[str] = set()
    labels: set[str] = set()
    rows = (line for line in counters_csv.splitlines() if line.strip() and not line.lstrip().startswith("#"))
    for row in csv.reader(rows, skipinitialspace=True):
        field, kind = row[0].strip(), row[1].strip() if len(row) > 1 else ""
        (labels if kind == "label" else metrics).add(field)
    return metrics, labels


def served_text(recorded: str, counters_csv: str | None) -> str:
    """What dcgm-exporter serves with ``-f counters_csv``: the fields the CSV lists, the label fields
    it lists as labels. ``None``: the recording unchanged."""
    if counters_csv is None:
        return recorded
    metrics, label_fields = counters_fields(counters_csv)
    out: list[str] = []
    for line in recorded.splitlines():
        name = line.split(" ")[2] if line.startswith("# ") else line.split("{", 1)[0]
        if name not in metrics:
            continue
        for dropped in set(LABEL_FIELDS) - label_fields:
            line = _drop_label(line, dropped)
        out.append(line)
    return "\n".join(out) + "\n"


def _drop_label(line: str, label: str) -> str:
    if line.startswith("#") or f"{label}=" not in line:
        return line
    head, rest = line.split("{", 1)
    body, value = rest.rsplit("} ", 1)
    kept = [pair for pair in _split_labels(body) if not pair.startswith(f"{label}=")]
    return f"{head}{{{','.join(kept)}}} {value}"


def _split_labels(body: str) -> Iterator[str]:
    # Values here never contain '",' (no escapes in the recordings), so '",' ends a pair.
    parts = body.split('",')
    for i, part in enumerate(parts):
        yield part if i == len(parts) - 1 else part + '"'


class FixtureExporter:
    """A dcgm-exporter stand-in on 127.0.0.1:<kernel-chosen port>: GET /metrics serves ``text``."""

    def __init__(self, text: str) -> None:
        body = text.encode()
        self.scrapes = 0

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(handler) -> None:
                if handler.path.split("?")[0] != "/metrics":
                    handler.send_error(404)
                    return
                self.scrapes += 1
                handler.send_response(200)
                handler.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
                handler.send_header("Content-Length", str(len(body)))
                handler.end_headers()
                handler.wfile.write(body)

            def log_message(handler, format: str, *args: object) -> None:
                pass

        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True)

    @property
    def address(self) -> str:
        host, port = self._server.server_address[:2]
        return f"{host}:{port}"

    def __enter__(self) -> FixtureExporter:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=10)


def main() -> None:
    for node in NODES.values():
        fixture_path(node.instance_type).write_text(recording(node))
        print(f"wrote {fixture_path(node.instance_type)}")


if __name__ == "__main__":
    main()
