"""EFA traffic and error counters on the agent's ``/metrics`` (``gpucloud_efa_*``).

node_exporter's infiniband collector reads an InfiniBand port's PMA counters (``ports/<n>/counters``),
which an EFA device does not have: for ``rdmap*`` devices it exports info, state and rate, never
bytes, packets or errors. The EFA driver publishes those as RDMA hw stats, one file per counter in
``/sys/class/infiniband/<device>/ports/<port>/hw_counters/``:
https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/efa-working-monitor.html and the driver's
``EFA_DEFINE_PORT_STATS`` (https://github.com/torvalds/linux/blob/master/drivers/infiniband/hw/efa/efa_verbs.c).

This collector reads them when scraped (a custom collector:
https://prometheus.github.io/client_python/collector/custom/), one counter family per driver counter,
labelled ``device`` and ``port`` plus the node's ``instance_id`` and ``node_group``. Only the names
below are read, so another RDMA device's hw_counters (mlx5, irdma) are never mistaken for EFA's; a
counter an older driver lacks is simply absent. ``lifespan`` (the stats cache's milliseconds) is not a
counter and is skipped.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator
from pathlib import Path

from prometheus_client.core import CounterMetricFamily, Metric
from prometheus_client.registry import Collector

from gpucloud.agent.identity import NodeLabels

log = logging.getLogger("gpucloud.agent.efa_metrics")

DEFAULT_SYSFS = Path("/sys")
PREFIX = "gpucloud_efa_"

# The EFA driver's port counters (hw_counters file -> help text), in the driver's order.
EFA_PORT_COUNTERS: dict[str, str] = {
    "tx_bytes": "Bytes the EFA device transmitted.",
    "tx_pkts": "Packets the EFA device transmitted.",
    "rx_bytes": "Bytes the EFA device received.",
    "rx_pkts": "Packets the EFA device received.",
    "rx_drops": "Received packets the EFA device dropped.",
    "send_bytes": "Bytes of send work requests.",
    "send_wrs": "Send work requests.",
    "recv_bytes": "Bytes of receive work requests.",
    "recv_wrs": "Receive work requests.",
    "rdma_read_wrs": "RDMA read work requests.",
    "rdma_read_bytes": "Bytes of RDMA reads.",
    "rdma_read_wr_err": "RDMA read work requests that failed.",
    "rdma_read_resp_bytes": "Bytes of RDMA read responses this device served.",
    "rdma_write_wrs": "RDMA write work requests.",
    "rdma_write_bytes": "Bytes of RDMA writes.",
    "rdma_write_wr_err": "RDMA write work requests that failed.",
    "rdma_write_recv_bytes": "Bytes of RDMA writes this device received.",
    "retrans_bytes": "Bytes retransmitted.",
    "retrans_pkts": "Packets retransmitted.",
    "retrans_timeout_events": "Retransmission timeouts.",
    "unresponsive_remote_events": "Times a remote peer stopped responding.",
    "impaired_remote_conn_events": "Times a connection to a remote peer was impaired.",
}


def metric_name(counter: str) -> str:
    """The exposed name of a driver counter (a counter family: ``_total`` is appended)."""
    return f"{PREFIX}{counter}_total"


def read_port_counters(sysfs: Path) -> Iterator[tuple[str, str, dict[str, int]]]:
    """``(device, port, {counter: value})`` for every port under ``<sysfs>/class/infiniband`` with any
    EFA hw counter; unreadable or non-integer files are skipped (a device going away mid-read)."""
    root = sysfs / "class" / "infiniband"
    try:
        devices = sorted(p for p in root.iterdir() if p.is_dir())
    except OSError:
        return  # no RDMA devices on this host (off EC2, or an instance type without EFA)
    for device in devices:
        try:
            ports = sorted((device / "ports").iterdir(), key=lambda p: p.name)
        except OSError:
            continue
        for port in ports:
            values: dict[str, int] = {}
            for counter in EFA_PORT_COUNTERS:
                try:
                    values[counter] = int((port / "hw_counters" / counter).read_text().strip())
                except (OSError, ValueError):
                    continue
            if values:
                yield device.name, port.name, values


class EfaCollector(Collector):
    """The node's EFA port counters, read from sysfs at each scrape."""

    def __init__(self, labels: NodeLabels, sysfs: Path = DEFAULT_SYSFS) -> None:
        self.labels, self.sysfs = labels, Path(sysfs)

    def collect(self) -> Iterable[Metric]:
        ports = list(read_port_counters(self.sysfs))
        if not ports:
            return []
        names = ["device", "port", "instance_id", "node_group"]
        families = {
            counter: CounterMetricFamily(f"{PREFIX}{counter}", doc, labels=names)
            for counter, doc in EFA_PORT_COUNTERS.items()
        }
        for device, port, values in ports:
            for counter, value in values.items():
                families[counter].add_metric([device, port, self.labels.instance_id, self.labels.node_group], value)
        return [family for family in families.values() if family.samples]
