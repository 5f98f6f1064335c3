"""Managed monitoring (``monitoring.mode: managed``): an Amazon Managed Service for Prometheus
workspace with the stack's rule groups and alert manager definition, an SNS topic the workspace's
alert manager publishes to, and, when ``managedGrafana``, an Amazon Managed Grafana workspace.

Who remote-writes: every node runs Prometheus in agent mode (``scripts/node-bootstrap.sh``), scraping
its own exporters on localhost and writing to the workspace with SigV4 and the node role, which gets
``aps:RemoteWrite`` on this workspace only. No monitor instance, no scrape traffic between hosts, and
a node's samples stop with the node. The rules are evaluated by the workspace.
https://docs.aws.amazon.com/prometheus/latest/userguide/AMP-onboard-ingest-metrics-remote-write-EC2.html
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Mapping, Sequence

import pulumi
import pulumi_aws as aws

from gpucloud.cluster.tags import Tagging
from gpucloud.infra.monitoring_iam import (
    alert_topic_policy_document,
    publisher_key_policy_document,
    remote_write_policy_document,
)

RenderFiles = Callable[[str, str], Mapping[str, str]]  # (topic ARN, remote-write URL) -> {path: text}


def amp_alertmanager_definition(alertmanager_yml: str) -> str:
    """AMP takes the Alertmanager configuration under an ``alertmanager_config`` block scalar
    (https://docs.aws.amazon.com/prometheus/latest/userguide/AMP-alertmanager-config.html)."""
    body = "\n".join(f"  {line}" if line else "" for line in alertmanager_yml.rstrip("\n").splitlines())
    return f"alertmanager_config: |\n{body}\n"


def _file(path: str) -> Callable[[Mapping[str, str]], str]:
    return lambda files: files[path]


def rule_namespace(path: str) -> str:
    """``rules/gpu.yml`` -> ``gpu``: one rule group namespace per rules file."""
    return path.rsplit("/", 1)[-1].rsplit(".", 1)[0]


@dataclasses.dataclass
class ManagedMonitoringArgs:
    tagging: Tagging
    region: str
    node_role_name: pulumi.Input[str]
    retention_days: int
    render_files: RenderFiles
    topic_name: str
    alert_emails: Sequence[str] = ()
    managed_grafana: bool = False


class ManagedMonitoring(pulumi.ComponentResource):
    workspace: aws.amp.Workspace
    topic: aws.sns.Topic
    remote_write_url: pulumi.Output[str]
    node_policy: aws.iam.RolePolicy
    grafana: aws.grafana.Workspace | None

    def __init__(self, name: str, args: ManagedMonitoringArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("gpucloud:monitoring:ManagedMonitoring", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        invoke = pulumi.InvokeOutputOptions(parent=self)
        t = args.tagging
        partition = aws.get_partition_output(opts=invoke).partition
        account = aws.get_caller_identity_output(opts=invoke).account_id

        self.workspace = aws.amp.Workspace(f"{name}-amp", alias=t.cluster, tags=t.tags("metrics"), opts=child)
        aws.amp.WorkspaceConfiguration(
            f"{name}-amp-config",
            workspace_id=self.workspace.id,
            retention_period_in_days=args.retention_days,  # spec rule: at most AMP's 1095
            opts=child,
        )
        self.remote_write_url = pulumi.Output.concat(self.workspace.prometheus_endpoint, "api/v1/remote_write")

        # The alert manager is the aps.amazonaws.com principal: an AWS-managed SNS key cannot be
        # granted to it, so the topic gets its own key.
        key = aws.kms.Key(
            f"{name}-alerts-key",
            description=f"gpucloud {t.cluster} alert topic",
            enable_key_rotation=True,
            policy=pulumi.Output.all(partition, account).apply(
                lambda v: json.dumps(publisher_key_policy_document(v[0], v[1], "aps.amazonaws.com"))
            ),
            tags=t.tags("alerts-key"),
            opts=child,
        )
        self.topic = aws.sns.Topic(
            f"{name}-alerts", name=args.topic_name, kms_master_key_id=key.arn, tags=t.tags("alerts"), opts=child
        )
        aws.sns.TopicPolicy(
            f"{name}-alerts-policy",
            arn=self.topic.arn,
            policy=pulumi.Output.all(self.topic.arn, account, self.workspace.arn).apply(
                lambda v: json.dumps(alert_topic_policy_document(v[0], v[1], v[2]))
            ),
            opts=child,
        )
        for i, email in enumerate(args.alert_emails):
            aws.sns.TopicSubscription(
                f"{name}-alerts-email-{i}", topic=self.topic.arn, protocol="email", endpoint=email, opts=child
            )

        placeholder = dict(args.render_files("arn:aws:sns:placeholder", "https://placeholder/api/v1/remote_write"))
        rendered = pulumi.Output.all(self.topic.arn, self.remote_write_url).apply(
            lambda v: dict(args.render_files(v[0], v[1]))
        )
        for path in sorted(p for p in placeholder if p.startswith("rules/")):
            aws.amp.RuleGroupNamespace(
                f"{name}-rules-{rule_namespace(path)}",
                workspace_id=self.workspace.id,
                name=rule_namespace(path),
                data=rendered.apply(_file(path)),
                tags=t.tags(),
                opts=child,
            )
        aws.amp.AlertManagerDefinition(
            f"{name}-alertmanager",
            workspace_id=self.workspace.id,
            definition=rendered.apply(lambda files: amp_alertmanager_definition(files["alertmanager.yml"])),
            opts=child,
        )

        self.node_policy = aws.iam.RolePolicy(
            f"{name}-remote-write",
            role=args.node_role_name,
            policy=self.workspace.arn.apply(lambda arn: json.dumps(remote_write_policy_document(arn))),
            opts=child,
        )
        self.grafana = self._grafana(name, args) if args.managed_grafana else None
        self.register_outputs(
            {"workspaceId": self.workspace.id, "remoteWriteUrl": self.remote_write_url, "alertTopicArn": self.topic.arn}
        )

    def _grafana(self, name: str, args: ManagedMonitoringArgs) -> aws.grafana.Workspace:
        """Amazon Managed Grafana, signing in with IAM Identity Center; its service-managed role
        reads Prometheus workspaces (data_sources), nothing else is granted here."""
        return aws.grafana.Workspace(
            f"{name}-grafana",
            name=f"{args.tagging.cluster}-grafana",
            account_access_type="CURRENT_ACCOUNT",
            authentication_providers=["AWS_SSO"],
            permission_type="SERVICE_MANAGED",
            data_sources=["PROMETHEUS"],
            tags=args.tagging.tags("grafana"),
            opts=pulumi.ResourceOptions(parent=self),
        )
