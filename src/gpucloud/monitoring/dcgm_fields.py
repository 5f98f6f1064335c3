"""The dcgm-exporter counters file the image installs: which DCGM fields every node exports.

The file itself is package data (``dcgm-counters.csv`` beside this module), in dcgm-exporter's format
(``etc/default-counters.csv``: ``DCGM field, Prometheus type, help``; ``#`` starts a comment).
dcgm-exporter refuses to start on a name it does not know, so every name in the file must be a real
DCGM field or one of the exporter's own ``DCGM_EXP_*`` metrics: ``KNOWN_FIELDS`` lists the ones we use
with their DCGM field ids, taken from

- NVIDIA's field list: https://docs.nvidia.com/datacenter/dcgm/latest/dcgm-api/dcgm-api-field-ids.html
- go-dcgm (what dcgm-exporter resolves names with):
  https://github.com/NVIDIA/go-dcgm/blob/main/pkg/dcgm/const_fields.go
- dcgm-exporter's exporter-computed metrics (``DCGM_EXP_XID_ERRORS_COUNT``, label ``xid``):
  https://github.com/NVIDIA/dcgm-exporter/blob/main/internal/pkg/collector/xid_collector.go

Every metric dcgm-exporter serves is named after its field and carries the labels ``gpu`` (index),
``UUID``, ``pci_bus_id``, ``device`` (``nvidia0``), ``modelName`` and ``Hostname``
(https://docs.nvidia.com/datacenter/cloud-native/gpu-telemetry/latest/dcgm-exporter.html).
"""

from __future__ import annotations

import csv
import dataclasses
import io
from importlib import resources

COUNTERS_FILE = "dcgm-counters.csv"
PROMETHEUS_TYPES = frozenset({"gauge", "counter", "label"})

# DCGM field name -> DCGM field id (sources in the module docstring). Older names for the same id:
# DCGM_FI_DEV_CLOCK_THROTTLE_REASONS (112) became DCGM_FI_DEV_CLOCKS_EVENT_REASONS in DCGM 3.3.
KNOWN_FIELDS: dict[str, int] = {
    "DCGM_FI_DRIVER_VERSION": 1,
    "DCGM_FI_DEV_SM_CLOCK": 100,
    "DCGM_FI_DEV_MEM_CLOCK": 101,
    "DCGM_FI_DEV_CLOCKS_EVENT_REASONS": 112,
    "DCGM_FI_DEV_MEMORY_TEMP": 140,
    "DCGM_FI_DEV_GPU_TEMP": 150,
    "DCGM_FI_DEV_POWER_USAGE": 155,
    "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION": 156,
    "DCGM_FI_DEV_PCIE_REPLAY_COUNTER": 202,
    "DCGM_FI_DEV_GPU_UTIL": 203,
    "DCGM_FI_DEV_MEM_COPY_UTIL": 204,
    "DCGM_FI_DEV_XID_ERRORS": 230,
    "DCGM_FI_DEV_POWER_VIOLATION": 240,
    "DCGM_FI_DEV_THERMAL_VIOLATION": 241,
    "DCGM_FI_DEV_SYNC_BOOST_VIOLATION": 242,
    "DCGM_FI_DEV_BOARD_LIMIT_VIOLATION": 243,
    "DCGM_FI_DEV_LOW_UTIL_VIOLATION": 244,
    "DCGM_FI_DEV_RELIABILITY_VIOLATION": 245,
    "DCGM_FI_DEV_FB_TOTAL": 250,
    "DCGM_FI_DEV_FB_FREE": 251,
    "DCGM_FI_DEV_FB_USED": 252,
    "DCGM_FI_DEV_FB_RESERVED": 253,
    "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL": 310,
    "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL": 311,
    "DCGM_FI_DEV_ECC_SBE_AGG_TOTAL": 312,
    "DCGM_FI_DEV_ECC_DBE_AGG_TOTAL": 313,
    "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS": 393,
    "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS": 394,
    "DCGM_FI_DEV_ROW_REMAP_FAILURE": 395,
    "DCGM_FI_DEV_ROW_REMAP_PENDING": 396,
    "DCGM_FI_PROF_GR_ENGINE_ACTIVE": 1001,
    "DCGM_FI_PROF_SM_ACTIVE": 1002,
    "DCGM_FI_PROF_SM_OCCUPANCY": 1003,
    "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": 1004,
    "DCGM_FI_PROF_DRAM_ACTIVE": 1005,
    "DCGM_FI_PROF_PCIE_TX_BYTES": 1009,
    "DCGM_FI_PROF_PCIE_RX_BYTES": 1010,
}
# Metrics dcgm-exporter computes itself from DCGM events (no DCGM field id of their own).
EXPORTER_METRICS: frozenset[str] = frozenset({"DCGM_EXP_XID_ERRORS_COUNT", "DCGM_EXP_CLOCK_EVENTS_COUNT"})

# What the alerts and dashboards read (ECC, throttling, row remapping, XID, profiling, utilisation):
# the field file must keep every one on, or a dying GPU goes unseen.
REQUIRED_FIELDS: frozenset[str] = frozenset(
    {
        # ECC single- and double-bit counts
        "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL",
        "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",
        # throttle / violation reasons
        "DCGM_FI_DEV_CLOCKS_EVENT_REASONS",
        "DCGM_FI_DEV_POWER_VIOLATION",
        "DCGM_FI_DEV_THERMAL_VIOLATION",
        # row remapping
        "DCGM_FI_DEV_ROW_REMAP_FAILURE",
        # XID: the last code and the event count
        "DCGM_FI_DEV_XID_ERRORS",
        "DCGM_EXP_XID_ERRORS_COUNT",
        # profiling
        "DCGM_FI_PROF_GR_ENGINE_ACTIVE",
        "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",
        "DCGM_FI_PROF_DRAM_ACTIVE",
        # the usual utilisation, memory, temperature, power and clock fields
        "DCGM_FI_DEV_GPU_UTIL",
        "DCGM_FI_DEV_FB_USED",
        "DCGM_FI_DEV_FB_FREE",
        "DCGM_FI_DEV_GPU_TEMP",
        "DCGM_FI_DEV_POWER_USAGE",
        "DCGM_FI_DEV_SM_CLOCK",
    }
)


@dataclasses.dataclass(frozen=True)
class Counter:
    field: str
    prometheus_type: str
    help: str
    line: int


def counters_csv() -> str:
    """The counters file as shipped (package data)."""
    return resources.files(__package__).joinpath(COUNTERS_FILE).read_text(encoding="utf-8")


def parse_counters(text: str) -> list[Counter]:
    """The file's active rows, read the way dcgm-exporter reads them (``encoding/csv``, ``#`` comments,
    three fields each, surrounding spaces trimmed); a ValueError naming the line otherwise."""
    rows: list[Counter] = []
    lines = text.splitlines()
    for number, line in enumerate(lines, 1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        record = next(csv.reader(io.StringIO(line)))
        if len(record) != 3:
            raise ValueError(f"line {number}: expected 3 fields (field, type, help), got {len(record)}: {line!r}")
        field, kind, text_help = (part.strip() for part in record)
        if kind not in PROMETHEUS_TYPES:
            raise ValueError(f"line {number}: type {kind!r} is not one of {', '.join(sorted(PROMETHEUS_TYPES))}")
        rows.append(Counter(field, kind, text_help, number))
    return rows


def unknown_fields(counters: list[Counter]) -> list[str]:
    """Names that are neither a DCGM field we know nor one of the exporter's own metrics."""
    return [c.field for c in counters if c.field not in KNOWN_FIELDS and c.field not in EXPORTER_METRICS]
