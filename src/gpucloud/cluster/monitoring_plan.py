"""The monitoring plan, pure: how many series the cluster exports, how large the self-hosted monitor's
TSDB volume must be for ``retentionDays``, and what the monitor costs an hour next to the cluster.

No Pulumi import: ``gpucloud plan`` and the stack program both call these, and tests call them
directly. Prices come from ``catalog/service_prices.json`` (as-of date and sources inside).
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import math
from collections.abc import Iterable
from functools import lru_cache
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from gpucloud.catalog import InstanceType

SERVICE_PRICES = Path(__file__).resolve().parents[1] / "catalog" / "service_prices.json"

# Where the node exporters listen. dcgm-exporter's and node_exporter's defaults
# (https://github.com/NVIDIA/dcgm-exporter#quickstart, https://github.com/prometheus/node_exporter);
# the agent's /metrics port is the agent's default (`gpucloud agent --metrics-port`, agent/metrics.py).
NODE_EXPORTER_PORT = 9100
DCGM_EXPORTER_PORT = 9400
AGENT_METRICS_PORT = 9401

SCRAPE_INTERVAL_SECONDS = 15.0
# Prometheus stores "an average of only 1-2 bytes per sample" and sizes disks as
# retention_time_seconds * ingested_samples_per_second * bytes_per_sample
# (https://prometheus.io/docs/prometheus/latest/storage/#operational-aspects): we take the high end.
BYTES_PER_SAMPLE = 2.0
# The write-ahead log keeps at least two hours of raw samples and compaction writes a new block
# before it deletes the old ones: half again on top of the blocks themselves.
DISK_HEADROOM = 1.5
MIN_DATA_VOLUME_GIB = 20  # gp3's price is per GiB; below this the OS and WAL bursts leave no room
MAX_DATA_VOLUME_GIB = 16384  # the gp3 size limit
ROOT_VOLUME_GIB = 16  # the monitor's root volume (Ubuntu + Prometheus, Alertmanager, Grafana)

# Series one node exports, by source, calibrated on benchmarks/bench_scrape.py at p5 size (8 GPUs,
# 32 EFA devices, docs/monitoring.md "Scrape cost per node": dcgm-exporter 35 per GPU, infiniband 4
# per EFA device, the agent 99, node_exporter's defaults about 2,900 at 192 vCPUs), with some margin:
DCGM_SERIES_PER_GPU = 40  # one per field of the counters file, per GPU
NODE_BASE_SERIES = 700  # node_exporter's default collectors on a GPU host, less per-CPU and per-device
NODE_SERIES_PER_VCPU = 12  # node_cpu_seconds_total (8 modes), cpufreq, softnet, ...
INFINIBAND_SERIES_PER_EFA = 5  # node_infiniband_* port counters, per EFA device (4 measured)
AGENT_SERIES = 120  # the agent's /metrics: histogram buckets, counters, the state gauge (99 measured)
# The agent's gpucloud_efa_* per EFA device: the driver's 22 port counters (agent/efa_metrics.py), exact.
AGENT_SERIES_PER_EFA = 22


class ServicePrices(BaseModel):
    # "ignore": the same file also holds the network/storage prices cluster/hourly_cost.py reads
    model_config = ConfigDict(extra="ignore", frozen=True)

    as_of: datetime.date
    region: str
    sources: list[str]
    notes: list[str] = []
    hours_per_month: float = Field(gt=0)
    monitor_instances_usd_per_hour: dict[str, float]
    ebs_gp3_usd_per_gb_month: float = Field(gt=0)
    amp_ingest_usd_per_10m_samples: float = Field(gt=0)
    amp_storage_usd_per_gb_month: float = Field(gt=0)


@lru_cache(maxsize=1)
def service_prices() -> ServicePrices:
    # our own package data (not user input): a broken file is a bug, so a plain error is right
    return ServicePrices.model_validate(json.loads(SERVICE_PRICES.read_text(encoding="utf-8")))


def monitor_instance_types() -> list[str]:
    """Instance types the monitor may use: those the price file knows (so `plan` can price them)."""
    return sorted(service_prices().monitor_instances_usd_per_hour)


def series_per_node(itype: InstanceType) -> int:
    """Series one node of this type exports: dcgm-exporter per GPU, node_exporter (CPUs and the EFA
    devices' infiniband info and state), and the agent (its own, and the EFA devices' counters)."""
    node = NODE_BASE_SERIES + NODE_SERIES_PER_VCPU * itype.vcpus + INFINIBAND_SERIES_PER_EFA * itype.max_efa_interfaces
    return DCGM_SERIES_PER_GPU * itype.gpus + node + AGENT_SERIES + AGENT_SERIES_PER_EFA * itype.max_efa_interfaces


def cluster_series(groups: Iterable[tuple[InstanceType, int]]) -> int:
    """Series the whole cluster exports at its largest: ``(instance type, maxNodes)`` per group."""
    return sum(series_per_node(itype) * nodes for itype, nodes in groups)


def samples_per_second(series: int, scrape_interval_seconds: float = SCRAPE_INTERVAL_SECONDS) -> float:
    return series / scrape_interval_seconds


def stored_bytes(series: int, retention_days: int) -> float:
    """The TSDB blocks for ``retention_days`` of every series (no headroom)."""
    return samples_per_second(series) * retention_days * 86400 * BYTES_PER_SAMPLE


def retention_size_gib(volume_gib: int) -> int:
    """Prometheus' ``--storage.tsdb.retention.size`` for the volume: the blocks may fill 80% of it,
    the rest is the WAL's and compaction's, so a larger cluster than planned loses old samples
    instead of filling the disk (https://prometheus.io/docs/prometheus/latest/storage/)."""
    return max(1, int(volume_gib * 0.8))


def data_volume_gib(series: int, retention_days: int) -> int:
    """The monitor's encrypted gp3 TSDB volume: the blocks plus WAL and compaction headroom, whole
    GiB, at least ``MIN_DATA_VOLUME_GIB`` and at most gp3's limit."""
    needed = stored_bytes(series, retention_days) * DISK_HEADROOM / 2**30
    return max(MIN_DATA_VOLUME_GIB, min(MAX_DATA_VOLUME_GIB, math.ceil(needed)))


@dataclasses.dataclass(frozen=True)
class MonitorCost:
    """What the monitoring costs an hour (USD). ``None`` parts are unknown, never zero."""

    mode: str
    series: int
    samples_per_second: float
    instance_type: str | None = None
    data_volume_gib: int | None = None
    instance: float | None = None  # the monitor instance, on demand
    storage: float | None = None  # its root and TSDB gp3 volumes
    amp_ingest: float | None = None  # managed: samples ingested (an estimate from the series count)
    amp_storage: float | None = None  # managed: the samples kept for retentionDays (an estimate)
    estimate: bool = False  # True when a part is derived from the series estimate

    @property
    def total(self) -> float | None:
        parts = [self.instance, self.storage] if self.mode == "self-hosted" else [self.amp_ingest, self.amp_storage]
        if self.mode == "off":
            return 0.0
        if any(p is None for p in parts):
            return None
        return round(sum(p for p in parts if p is not None), 4)

    def to_json(self) -> dict[str, object]:
        return {
            "mode": self.mode,
            "currency": "USD/hour",
            "total": self.total,
            "instance_type": self.instance_type,
            "instance": self.instance,
            "storage": self.storage,
            "data_volume_gib": self.data_volume_gib,
            "amp_ingest": self.amp_ingest,
            "amp_storage": self.amp_storage,
            "series": self.series,
            "samples_per_second": round(self.samples_per_second, 1),
            "estimate": self.estimate,
        }


def monitor_cost(
    mode: str, series: int, retention_days: int, instance_type: str, prices: ServicePrices | None = None
) -> MonitorCost:
    """The hourly cost of ``mode`` for a cluster exporting ``series`` series."""
    prices = prices or service_prices()
    rate = samples_per_second(series)
    if mode == "off":
        return MonitorCost(mode, series, rate)
    gb_hour = 1 / prices.hours_per_month  # a GB-month, per hour
    if mode == "self-hosted":
        volume = data_volume_gib(series, retention_days)
        hourly = prices.monitor_instances_usd_per_hour.get(instance_type)
        storage = (volume + ROOT_VOLUME_GIB) * prices.ebs_gp3_usd_per_gb_month * gb_hour
        return MonitorCost(
            mode,
            series,
            rate,
            instance_type=instance_type,
            data_volume_gib=volume,
            instance=hourly,
            storage=round(storage, 4),
        )
    ingest = rate * 3600 / 1e7 * prices.amp_ingest_usd_per_10m_samples
    stored_gb = stored_bytes(series, retention_days) / 2**30  # AMP bills GB of 2**30 bytes
    return MonitorCost(
        mode,
        series,
        rate,
        amp_ingest=round(ingest, 4),
        amp_storage=round(stored_gb * prices.amp_storage_usd_per_gb_month * gb_hour, 4),
        estimate=True,
    )
