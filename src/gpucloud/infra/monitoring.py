"""Collection per stack (``gpucloud:monitoring.mode``): which monitoring components the program
builds, and what the nodes learn about it.

- ``self-hosted``: ``SelfHostedMonitor`` (monitoring_selfhosted.py);
- ``managed``: ``ManagedMonitoring`` (monitoring_managed.py); nodes remote-write;
- ``off``: nothing; the nodes' bootstrap starts no exporter either (nothing would scrape them).

The files deployed are exactly what `gpucloud monitoring render` writes for the stack
(``gpucloud.monitoring.render``, imported here when a stack has a monitor).
"""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Callable, Mapping, Sequence
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING

import pulumi

from gpucloud.cluster.monitoring_plan import AGENT_METRICS_PORT, cluster_series
from gpucloud.cluster.tags import Tagging
from gpucloud.planning.cluster_plan import ClusterPlan
from gpucloud.queue.aws.uri import AwsQueueAddress
from gpucloud.spec.model import ClusterSpec

if TYPE_CHECKING:
    from gpucloud.infra.monitoring_selfhosted import DailyReport

MATRIX_FILE = Path(__file__).resolve().parents[3] / "images" / "versions.yaml"

# render(spec, stack_name, *, sns_topic_arn, amp_remote_write_url=None) -> {relative path: text}
Render = Callable[..., Mapping[str, str]]


def alert_topic_name(cluster: str) -> str:
    """The SNS topic's name: what the rendered alertmanager.yml names (monitoring/names.py)."""
    return f"{cluster}-alerts"


def default_render() -> Render:
    # lazy: the renderer pulls in the dashboard SDK, and only stacks with a monitor need it
    render: Render = importlib.import_module("gpucloud.monitoring").render
    return render


@lru_cache(maxsize=1)
def exporter_versions() -> dict[str, str]:
    """The exporters' and Prometheus' pins in images/versions.yaml, as node.env settings."""
    from gpucloud.image.matrix import load_matrix

    pinned = load_matrix(MATRIX_FILE).versions
    return {
        "GPUCLOUD_NODE_EXPORTER_VERSION": pinned.node_exporter,
        "GPUCLOUD_DCGM_EXPORTER_VERSION": pinned.dcgm_exporter,
        "GPUCLOUD_PROMETHEUS_VERSION": pinned.prometheus,
    }


def pinned_prometheus() -> str:
    """The image's Prometheus (nodes' agent mode), also the self-hosted monitor's."""
    return exporter_versions()["GPUCLOUD_PROMETHEUS_VERSION"]


@dataclasses.dataclass
class MonitoringArgs:
    tagging: Tagging
    spec: ClusterSpec
    stack_name: str
    plan: ClusterPlan
    vpc_id: pulumi.Input[str]
    subnet_id: pulumi.Input[str]
    node_security_group_id: pulumi.Input[str]
    node_role_name: pulumi.Input[str]
    bucket_name: pulumi.Input[str]
    bucket_arn: pulumi.Input[str]
    render: Render | None = None  # tests give a stand-in; the product renders with gpucloud.monitoring
    # the job plane, for the self-hosted monitor's daily report (None: no report, whatever the spec says)
    job_table_name: pulumi.Input[str] | None = None
    job_table_arn: pulumi.Input[str] | None = None
    job_queue_url: pulumi.Input[str] | None = None
    job_queue_arn: pulumi.Input[str] | None = None  # opening the queue reads its redrive policy
    job_dead_letter_queue_arn: pulumi.Input[str] | None = None  # ... and looks up its dead-letter queue


@dataclasses.dataclass
class BuiltMonitoring:
    """What the rest of the program needs: node settings, and what a node must not boot before."""

    node_settings: dict[str, pulumi.Input[str]]
    node_depends_on: Sequence[pulumi.Resource] = ()
    alert_topic_arn: pulumi.Output[str] | None = None
    monitor_instance_id: pulumi.Output[str] | None = None  # self-hosted: the SSM session's --target
    component: pulumi.ComponentResource | None = None


def node_settings(mode: str, remote_write_url: pulumi.Input[str] | None = None) -> dict[str, pulumi.Input[str]]:
    """What scripts/node-bootstrap.sh reads: the mode (off: no exporters), the agent's /metrics port,
    and, managed, where the node's agent-mode Prometheus writes."""
    settings: dict[str, pulumi.Input[str]] = {
        "GPUCLOUD_MONITORING": mode,
        "GPUCLOUD_METRICS_PORT": str(AGENT_METRICS_PORT),
    }
    if mode != "off":  # what a node without the gpucloud image fetches (the image's pins)
        settings.update(exporter_versions())
    if remote_write_url is not None:
        settings["GPUCLOUD_AMP_REMOTE_WRITE_URL"] = remote_write_url
    return settings


def daily_report(args: MonitoringArgs) -> DailyReport | None:
    """The monitor's daily report setting (``monitoring.dailyReport``, docs/cost.md): the job plane's
    queue URI (what `gpucloud report --queue` takes) and table, and the stack's agent package, which
    the monitor installs as the nodes do (``scripts/monitor-bootstrap.sh``)."""
    from gpucloud.infra.monitoring_selfhosted import DailyReport

    spec = args.spec
    package = spec.agent.package
    if not spec.monitoring.daily_report_on(package) or package is None:  # rules.py refuses true without one
        return None
    table, table_arn, queue_url = args.job_table_name, args.job_table_arn, args.job_queue_url
    queue_arn, dead_letter_arn = args.job_queue_arn, args.job_dead_letter_queue_arn
    if table is None or table_arn is None or queue_url is None or queue_arn is None or dead_letter_arn is None:
        return None
    region = spec.region
    queue_uri = pulumi.Output.all(table, queue_url).apply(
        lambda v: AwsQueueAddress(region=region, table=v[0], queue_url=v[1]).uri
    )
    return DailyReport(
        queue_uri=queue_uri,
        table_arn=table_arn,
        package=package,
        queue_arn=queue_arn,
        dead_letter_queue_arn=dead_letter_arn,
    )


def build_monitoring(name: str, args: MonitoringArgs) -> BuiltMonitoring:
    settings = args.spec.monitoring
    if settings.mode == "off":
        return BuiltMonitoring(node_settings("off"))
    render = args.render or default_render()
    spec, stack = args.spec, args.stack_name
    series = cluster_series((g.instance_type, g.group.max_nodes) for g in args.plan.groups)
    if settings.mode == "self-hosted":
        from gpucloud.infra.monitoring_selfhosted import SelfHostedMonitor, SelfHostedMonitorArgs

        monitor = SelfHostedMonitor(
            name,
            SelfHostedMonitorArgs(
                tagging=args.tagging,
                region=spec.region,
                vpc_id=args.vpc_id,
                subnet_id=args.subnet_id,
                node_security_group_id=args.node_security_group_id,
                bucket_name=args.bucket_name,
                bucket_arn=args.bucket_arn,
                instance_type=settings.instance_type,
                retention_days=settings.retention_days,
                series=series,
                prometheus_version=pinned_prometheus(),
                render_files=lambda arn: render(spec, stack, sns_topic_arn=arn),
                topic_name=alert_topic_name(args.tagging.cluster),
                alert_emails=tuple(settings.alert_emails),
                report=daily_report(args),
            ),
        )
        return BuiltMonitoring(
            node_settings("self-hosted"),
            alert_topic_arn=monitor.topic.arn,
            monitor_instance_id=monitor.instance.id,
            component=monitor,
        )
    from gpucloud.infra.monitoring_managed import ManagedMonitoring, ManagedMonitoringArgs

    managed = ManagedMonitoring(
        name,
        ManagedMonitoringArgs(
            tagging=args.tagging,
            region=spec.region,
            node_role_name=args.node_role_name,
            retention_days=settings.retention_days,
            render_files=lambda arn, url: render(spec, stack, sns_topic_arn=arn, amp_remote_write_url=url),
            topic_name=alert_topic_name(args.tagging.cluster),
            alert_emails=tuple(settings.alert_emails),
            managed_grafana=settings.managed_grafana,
        ),
    )
    return BuiltMonitoring(
        node_settings("managed", managed.remote_write_url),
        node_depends_on=[managed.node_policy],
        alert_topic_arn=managed.topic.arn,
        component=managed,
    )
