"""Names every monitoring file shares: scrape jobs, ports, the labels series are joined on.

Metric names are the exporters' own: dcgm-exporter's (``dcgm_fields.py``), node_exporter's infiniband
collector (https://github.com/prometheus/node_exporter/blob/master/collector/infiniband_linux.go; EFA
devices show up there as ``rdmap*``), and the agent's ``gpucloud_*`` (docs/monitoring.md, "The agent's
metrics").
"""

from __future__ import annotations

from gpucloud.cluster.monitoring_plan import AGENT_METRICS_PORT, DCGM_EXPORTER_PORT, NODE_EXPORTER_PORT

# Labels every node series carries (set by service discovery's relabelling, or by static_configs offline).
INSTANCE_ID = "instance_id"
NODE_GROUP = "node_group"

# Scrape jobs, and the port each exporter listens on.
DCGM_JOB = "dcgm-exporter"
NODE_JOB = "node-exporter"
AGENT_JOB = "gpucloud-agent"
# The ports the monitor's security group opens and the bootstrap starts the exporters on: one definition
# (cluster/monitoring_plan.py; the agent's is `gpucloud agent --metrics-port`'s default).
EXPORTER_PORTS: dict[str, int] = {
    DCGM_JOB: DCGM_EXPORTER_PORT,
    NODE_JOB: NODE_EXPORTER_PORT,
    AGENT_JOB: AGENT_METRICS_PORT,
}

ALERTMANAGER_ADDRESS = "localhost:9093"  # self-hosted: Alertmanager runs beside Prometheus on the monitor

# XIDs that mean the GPU (or its memory) is in trouble: page. Others warn. From NVIDIA's XID catalogue
# (https://docs.nvidia.com/deploy/xid-errors/): 48 double-bit ECC error; 63/64 ECC page retirement or
# row remapping recording event / failure; 74 NVLink error; 79 GPU has fallen off the bus;
# 94/95 contained / uncontained ECC error.
CRITICAL_XIDS: tuple[int, ...] = (48, 63, 64, 74, 79, 94, 95)


def alert_topic_name(cluster: str) -> str:
    """The SNS topic the stack creates for alerts (the Pulumi side uses the same name)."""
    return f"{cluster}-alerts"


PLACEHOLDER_ACCOUNT = "000000000000"


def placeholder_topic_arn(region: str, cluster: str) -> str:
    """The alert topic's ARN with an account that cannot be real: what offline renders show."""
    return f"arn:aws:sns:{region}:{PLACEHOLDER_ACCOUNT}:{alert_topic_name(cluster)}"
