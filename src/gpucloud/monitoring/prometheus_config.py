"""``prometheus.yml``: what Prometheus scrapes, where its rules are, where alerts and samples go.

Two ways to find the nodes:

- ``ec2_prometheus_config``, what a stack deploys: EC2 service discovery of the running instances
  that carry the stack's ``gpucloud:cluster`` tag and a ``gpucloud:node-group`` tag (the monitor
  instance itself has no node group, so it is not scraped for GPU exporters), scraped on their
  private IPs. Relabelling turns ``__meta_ec2_instance_id`` into ``instance_id`` and the node-group
  tag into ``node_group``: every series of a node carries both, so rules and dashboards join
  node-level series on ``instance_id``.
  https://prometheus.io/docs/prometheus/latest/configuration/configuration/#ec2_sd_config
- ``static_prometheus_config``, for offline use (tests, a laptop): targets given as ``host:port``
  with their ``instance_id`` and ``node_group`` set in ``static_configs``.
- ``node_agent_config``, what a *managed* stack deploys (``gpucloud monitoring node-config`` on each
  node, called by ``scripts/node-bootstrap.sh``): Prometheus in agent mode on the node, scraping the
  node's own three exporters on 127.0.0.1 with the same job names, the node's ``instance_id`` and
  ``node_group`` as external labels (what EC2 discovery's relabelling gives in self-hosted mode), and
  the same remote write to the workspace as ``ec2_prometheus_config``'s managed mode. No discovery,
  no scrape traffic between hosts. https://prometheus.io/docs/prometheus/latest/prometheus_agent/

Modes: ``self-hosted`` evaluates the rules here and sends alerts to the Alertmanager beside it;
``managed`` only scrapes and remote-writes to the Amazon Managed Service for Prometheus workspace,
signed with SigV4 (the rules and the alert manager definition live in the workspace, so evaluating
them here too would alert twice).
https://docs.aws.amazon.com/prometheus/latest/userguide/AMP-onboard-ingest-metrics-remote-write-EC2.html
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from gpucloud.cluster.tags import CLUSTER_TAG, NODE_GROUP_TAG
from gpucloud.monitoring.names import (
    AGENT_JOB,
    ALERTMANAGER_ADDRESS,
    DCGM_JOB,
    EXPORTER_PORTS,
    INSTANCE_ID,
    NODE_GROUP,
    NODE_JOB,
)
from gpucloud.monitoring.yamltext import dump

SCRAPE_INTERVAL = "15s"
EVALUATION_INTERVAL = "30s"
RULE_FILES = ["rules/*.yml"]  # relative to prometheus.yml
SD_REFRESH_INTERVAL = "60s"

# The agent's own series carry node_group (gpucloud_attempt_running{job_id,attempt,node_group}) and,
# offline, instance_id: honor_labels keeps the agent's values instead of renaming them exported_*.
HONOR_LABELS = {AGENT_JOB: True, DCGM_JOB: False, NODE_JOB: False}


def meta_tag_label(tag: str) -> str:
    """The discovery label of an EC2 tag: Prometheus replaces every character outside [a-zA-Z0-9_]
    with ``_`` (``gpucloud:node-group`` -> ``__meta_ec2_tag_gpucloud_node_group``)."""
    return "__meta_ec2_tag_" + "".join(c if c.isalnum() or c == "_" else "_" for c in tag)


@dataclasses.dataclass(frozen=True)
class StaticTarget:
    """One exporter on one node, for the offline configuration."""

    job: str  # DCGM_JOB, NODE_JOB or AGENT_JOB
    address: str  # host:port
    instance_id: str
    node_group: str


def ec2_prometheus_config(
    *, cluster: str, region: str, mode: str = "self-hosted", remote_write_url: str | None = None
) -> str:
    """The deployed ``prometheus.yml``: every node of ``cluster`` found through EC2 discovery."""
    scrape = [_ec2_job(job, cluster=cluster, region=region) for job in (DCGM_JOB, NODE_JOB, AGENT_JOB)]
    return _config(scrape, cluster=cluster, region=region, mode=mode, remote_write_url=remote_write_url)


def static_prometheus_config(
    targets: Sequence[StaticTarget],
    *,
    cluster: str = "offline",
    rule_files: bool = True,
    alertmanager: str | None = None,
    scrape_interval: str = SCRAPE_INTERVAL,
) -> str:
    """The offline ``prometheus.yml``: the same jobs and labels for targets given by address.
    ``rule_files`` loads ``rules/*.yml`` beside the file; ``alertmanager`` (host:port) receives alerts."""
    jobs: dict[str, list[StaticTarget]] = {}
    for t in targets:
        if t.job not in EXPORTER_PORTS:
            raise ValueError(f"unknown scrape job {t.job!r}; expected one of {', '.join(EXPORTER_PORTS)}")
        jobs.setdefault(t.job, []).append(t)
    scrape = [
        {
            "job_name": job,
            "honor_labels": HONOR_LABELS[job],
            "static_configs": [
                {"targets": [t.address], "labels": {INSTANCE_ID: t.instance_id, NODE_GROUP: t.node_group}}
                for t in members
            ],
        }
        for job, members in jobs.items()
    ]
    document: dict[str, Any] = {
        "global": {
            "scrape_interval": scrape_interval,
            "evaluation_interval": scrape_interval,
            "external_labels": {"cluster": cluster},
        },
    }
    if rule_files:
        document["rule_files"] = list(RULE_FILES)
    if alertmanager:
        document["alerting"] = {"alertmanagers": [{"static_configs": [{"targets": [alertmanager]}]}]}
    document["scrape_configs"] = scrape
    return dump(document, header="Offline Prometheus configuration rendered by gpucloud (static targets).")


def _ec2_job(job: str, *, cluster: str, region: str) -> dict[str, Any]:
    return {
        "job_name": job,
        "honor_labels": HONOR_LABELS[job],
        "ec2_sd_configs": [
            {
                "region": region,
                "port": EXPORTER_PORTS[job],  # the target is the private IP and this port
                "refresh_interval": SD_REFRESH_INTERVAL,
                "filters": [
                    {"name": f"tag:{CLUSTER_TAG}", "values": [cluster]},
                    {"name": "instance-state-name", "values": ["running"]},
                ],
            }
        ],
        "relabel_configs": [
            # only the nodes of a node group (the monitor instance carries the cluster tag too)
            {"source_labels": [meta_tag_label(NODE_GROUP_TAG)], "regex": ".+", "action": "keep"},
            {
                "source_labels": ["__meta_ec2_private_ip"],
                "regex": "(.+)",
                "target_label": "__address__",
                "replacement": f"$1:{EXPORTER_PORTS[job]}",
            },
            {"source_labels": ["__meta_ec2_instance_id"], "target_label": INSTANCE_ID},
            {"source_labels": [meta_tag_label(NODE_GROUP_TAG)], "target_label": NODE_GROUP},
            {"source_labels": ["__meta_ec2_instance_type"], "target_label": "instance_type"},
            {"source_labels": ["__meta_ec2_availability_zone"], "target_label": "availability_zone"},
        ],
    }


def _config(scrape: list[dict[str, Any]], *, cluster: str, region: str, mode: str, remote_write_url: str | None) -> str:
    if mode not in ("self-hosted", "managed"):
        raise ValueError(f"unknown collection mode {mode!r}; expected self-hosted or managed")
    document: dict[str, Any] = {
        "global": {
            "scrape_interval": SCRAPE_INTERVAL,
            "evaluation_interval": EVALUATION_INTERVAL,
            "external_labels": {"cluster": cluster},
        },
    }
    if mode == "self-hosted":
        document["rule_files"] = list(RULE_FILES)
        document["alerting"] = {"alertmanagers": [{"static_configs": [{"targets": [ALERTMANAGER_ADDRESS]}]}]}
    document["scrape_configs"] = scrape
    if mode == "managed":
        if not remote_write_url:
            raise ValueError("managed mode needs the workspace's remote-write URL")
        document["remote_write"] = [_remote_write(remote_write_url, region)]
    header = (
        f"Prometheus for gpucloud cluster {cluster} ({mode}), rendered by `gpucloud monitoring render`.\n"
        f"Nodes: EC2 instances tagged {CLUSTER_TAG}={cluster} with a {NODE_GROUP_TAG} tag; do not edit here."
    )
    return dump(document, header=header)


LOCALHOST = "127.0.0.1"


def node_agent_config(
    *,
    cluster: str,
    region: str,
    instance_id: str,
    node_group: str,
    remote_write_url: str,
    agent_port: int = EXPORTER_PORTS[AGENT_JOB],
    scrape_interval: str = SCRAPE_INTERVAL,
) -> str:
    """A managed stack's node: Prometheus in agent mode (``--agent``) over this node's exporters."""
    ports = {**EXPORTER_PORTS, AGENT_JOB: agent_port}
    document: dict[str, Any] = {
        "global": {
            "scrape_interval": scrape_interval,
            # Added to every sample written to the workspace: the labels rules and dashboards join on.
            "external_labels": {"cluster": cluster, INSTANCE_ID: instance_id, NODE_GROUP: node_group},
        },
        "scrape_configs": [
            {
                "job_name": job,
                "honor_labels": HONOR_LABELS[job],
                "static_configs": [{"targets": [f"{LOCALHOST}:{ports[job]}"]}],
            }
            for job in (DCGM_JOB, NODE_JOB, AGENT_JOB)
        ],
        "remote_write": [_remote_write(remote_write_url, region)],
    }
    header = (
        f"Prometheus agent of node {instance_id} ({node_group}) of gpucloud cluster {cluster} (managed), "
        "rendered by `gpucloud monitoring node-config`; do not edit here."
    )
    return dump(document, header=header)


def _remote_write(url: str, region: str) -> dict[str, Any]:
    """Remote write to an Amazon Managed Prometheus workspace, signed with SigV4 and the instance
    role's credentials (aps:RemoteWrite).
    https://docs.aws.amazon.com/prometheus/latest/userguide/AMP-onboard-ingest-metrics-remote-write-EC2.html"""
    return {
        "url": url,
        "sigv4": {"region": region},
        "queue_config": {"max_samples_per_send": 1000, "max_shards": 200, "capacity": 2500},
    }
