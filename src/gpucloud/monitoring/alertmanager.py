"""``alertmanager.yml``: every alert goes to the stack's SNS topic (mail subscribers, or whatever the
team subscribes), grouped per alert and node, timed by severity.

- ``critical`` pages at once and repeats hourly while it fires; ``warning`` waits a little to batch
  a node's GPUs into one message and repeats every 4 h; ``info`` (interruption notices) is batched
  per node group and never repeats within a day.
- Inhibition: while a critical alert fires on a node, its info and warning alerts are held back
  (a node with a fallen-off GPU also idles and stalls; one message is enough).
- ``sns_configs`` with ``sigv4``: Alertmanager signs with the instance role's credentials (self-hosted)
  and the Amazon Managed Service for Prometheus alert manager requires it too.
  https://prometheus.io/docs/alerting/latest/configuration/#sns_config
  https://docs.aws.amazon.com/prometheus/latest/userguide/AMP-alertmanager-receiver-config.html
"""

from __future__ import annotations

from typing import Any

from gpucloud.monitoring.names import INSTANCE_ID, NODE_GROUP
from gpucloud.monitoring.yamltext import dump

# One receiver per severity, all to the same topic: the route a message took shows in its receiver
# name (and `amtool config routes test severity=critical` can check the routing).
RECEIVERS = {"critical": "sns-critical", "warning": "sns-warning", "info": "sns-info"}
DEFAULT_RECEIVER = "sns-warning"  # an alert without a known severity is treated as a warning

# SNS subjects are at most 100 characters (SNS Publish API); the rest goes in the message body.
SUBJECT = "[{{ .Status | toUpper }}] {{ .CommonLabels.alertname }} ({{ .CommonLabels.severity }}) {{ .CommonLabels.instance_id }}"
MESSAGE = """{{ range .Alerts -}}
[{{ .Status }}] {{ .Labels.alertname }} ({{ .Labels.severity }})
{{ .Annotations.summary }}
{{ .Annotations.description }}
Runbook: {{ .Annotations.runbook }}
Started: {{ .StartsAt }}

{{ end -}}"""


def alertmanager_config(*, sns_topic_arn: str, region: str) -> dict[str, Any]:
    return {
        "route": {
            "receiver": DEFAULT_RECEIVER,
            "group_by": ["alertname", INSTANCE_ID],
            "group_wait": "30s",
            "group_interval": "5m",
            "repeat_interval": "4h",
            "routes": [
                {
                    "matchers": ['severity="critical"'],
                    "receiver": RECEIVERS["critical"],
                    "group_wait": "10s",
                    "group_interval": "1m",
                    "repeat_interval": "1h",
                },
                {"matchers": ['severity="warning"'], "receiver": RECEIVERS["warning"], "group_wait": "1m"},
                {
                    "matchers": ['severity="info"'],
                    "receiver": RECEIVERS["info"],
                    "group_by": ["alertname", NODE_GROUP],
                    "group_wait": "1m",
                    "repeat_interval": "24h",
                },
            ],
        },
        "inhibit_rules": [
            {
                "source_matchers": ['severity="critical"'],
                "target_matchers": ['severity=~"info|warning"'],
                "equal": [INSTANCE_ID],
            },
        ],
        "receivers": [{"name": name, "sns_configs": [_sns(sns_topic_arn, region)]} for name in RECEIVERS.values()],
    }


def _sns(topic_arn: str, region: str) -> dict[str, Any]:
    return {
        "topic_arn": topic_arn,
        "sigv4": {"region": region},
        "subject": SUBJECT,
        "message": MESSAGE,
        "attributes": {"severity": "{{ .CommonLabels.severity }}"},
        "send_resolved": True,
    }


def render_alertmanager(*, sns_topic_arn: str, region: str, cluster: str) -> str:
    header = (
        f"Alertmanager for gpucloud cluster {cluster}, rendered by `gpucloud monitoring render`; do not edit here.\n"
        f"Every alert goes to the SNS topic {sns_topic_arn}."
    )
    return dump(alertmanager_config(sns_topic_arn=sns_topic_arn, region=region), header=header)
