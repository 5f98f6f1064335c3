"""One source for every monitoring file a stack deploys: ``render`` returns them all as
``{relative path: text}``; ``gpucloud monitoring render`` writes them, and the stack program puts the
same texts on the monitor instance (self-hosted) or into the Amazon Managed Service for Prometheus
workspace (managed).

Files: ``prometheus.yml``, ``rules/<group>.yml``, ``alertmanager.yml``, ``dashboards/cluster.json``,
``dashboards/job.json`` and ``dcgm-counters.csv`` (dcgm-exporter's counters file for the image).

Mode ``off`` renders what ``self-hosted`` would deploy: nothing collects the metrics, but the files
are what a team's own Prometheus and Grafana would use.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from gpucloud.monitoring import alertmanager, dcgm_fields, prometheus_config, rules

if TYPE_CHECKING:
    from gpucloud.spec.model import ClusterSpec

COUNTERS_PATH = "dcgm-counters.csv"


def render(
    spec: ClusterSpec, stack_name: str, *, sns_topic_arn: str, amp_remote_write_url: str | None = None
) -> dict[str, str]:
    """Every monitoring file of the stack. ``amp_remote_write_url`` (the workspace's
    ``.../api/v1/remote_write``) is required in managed mode and ignored otherwise."""
    from gpucloud.monitoring.dashboards import render_dashboards  # the deploy extra's SDK

    cluster = spec.name_for(stack_name)
    mode = spec.monitoring.mode
    scrape_mode = "managed" if mode == "managed" else "self-hosted"
    if scrape_mode == "managed" and not amp_remote_write_url:
        raise ValueError("managed monitoring needs amp_remote_write_url, the workspace's remote-write URL")
    files = {
        "prometheus.yml": prometheus_config.ec2_prometheus_config(
            cluster=cluster,
            region=spec.region,
            mode=scrape_mode,
            remote_write_url=amp_remote_write_url if scrape_mode == "managed" else None,
        ),
        **rules.render_rules(),
        "alertmanager.yml": alertmanager.render_alertmanager(
            sns_topic_arn=sns_topic_arn, region=spec.region, cluster=cluster
        ),
        **render_dashboards(cluster),
        COUNTERS_PATH: dcgm_fields.counters_csv(),
    }
    return files


def write_files(files: dict[str, str], out_dir: Path) -> list[Path]:
    """Write ``files`` under ``out_dir`` (created), replacing files of the same names; returns the paths."""
    written = []
    root = out_dir.resolve()
    for relative, text in sorted(files.items()):
        path = (root / relative).resolve()
        if root not in path.parents:
            raise ValueError(f"{relative!r} is outside {out_dir}")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
        written.append(path)
    return written
