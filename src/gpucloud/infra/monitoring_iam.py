"""IAM documents for monitoring, as pure functions of the ARNs they name (tests read them directly).

- the self-hosted monitor's role: discover the nodes, publish alerts to the stack's topic, read the
  monitoring files the stack staged in the bucket; nothing else;
- the nodes' remote write to Amazon Managed Prometheus (managed mode): that one workspace;
- the alert topic's policy (managed mode): Amazon Managed Prometheus' alert manager may publish,
  for this account's workspace only;
- the managed topic's KMS key policy: the account administers the key, the alert manager encrypts.
"""

from __future__ import annotations

from typing import Any

# EC2 service discovery (prometheus.io ec2_sd_config) calls DescribeInstances and, for the
# availability-zone id label, DescribeAvailabilityZones. Neither supports resource-level
# permissions ("*" is the only resource they accept:
# https://docs.aws.amazon.com/service-authorization/latest/reference/list_amazonec2.html); both
# are read-only.
DISCOVERY_ACTIONS = ["ec2:DescribeInstances", "ec2:DescribeAvailabilityZones"]
# What the nodes' Prometheus agent needs to remote-write with SigV4:
# https://docs.aws.amazon.com/prometheus/latest/userguide/AMP-onboard-ingest-metrics-remote-write.html
REMOTE_WRITE_ACTIONS = ["aps:RemoteWrite"]


def monitor_policy_document(topic_arn: str, bucket_arn: str, files_prefix: str) -> dict[str, Any]:
    """The monitor instance's inline policy. ``files_prefix`` ends in ``/``."""
    return {
        "Version": "2012-10-17",
        "Statement": [
            {"Sid": "DiscoverNodes", "Effect": "Allow", "Action": list(DISCOVERY_ACTIONS), "Resource": ["*"]},
            # Alertmanager's sns_configs sign with the instance role (SigV4)
            {"Sid": "PublishAlerts", "Effect": "Allow", "Action": ["sns:Publish"], "Resource": [topic_arn]},
            {
                "Sid": "ListMonitoringFiles",
                "Effect": "Allow",
                "Action": ["s3:ListBucket"],
                "Resource": [bucket_arn],
                "Condition": {"StringLike": {"s3:prefix": [f"{files_prefix}*"]}},
            },
            {
                "Sid": "ReadMonitoringFiles",
                "Effect": "Allow",
                "Action": ["s3:GetObject"],
                "Resource": [f"{bucket_arn}/{files_prefix}*"],
            },
        ],
    }


def remote_write_policy_document(workspace_arn: str) -> dict[str, Any]:
    return {
        "Version": "2012-10-17",
        "Statement": [
            {"Sid": "RemoteWrite", "Effect": "Allow", "Action": list(REMOTE_WRITE_ACTIONS), "Resource": [workspace_arn]}
        ],
    }


def alert_topic_policy_document(topic_arn: str, account: str, workspace_arn: str) -> dict[str, Any]:
    """Amazon Managed Prometheus' alert manager publishes to the topic as the service principal
    (https://docs.aws.amazon.com/prometheus/latest/userguide/AMP-alertmanager-receiver-AMPpermission.html),
    confused-deputy guarded by the source account and workspace."""
    return {
        "Version": "2012-10-17",
        "Statement": [
            {
                "Sid": "AmpAlertManagerPublish",
                "Effect": "Allow",
                "Principal": {"Service": "aps.amazonaws.com"},
                "Action": ["sns:Publish", "sns:GetTopicAttributes"],
                "Resource": topic_arn,
                "Condition": {
                    "StringEquals": {"aws:SourceAccount": account},
                    "ArnEquals": {"aws:SourceArn": workspace_arn},
                },
            }
        ],
    }


def publisher_key_policy_document(partition: str, account: str, publisher: str) -> dict[str, Any]:
    """A customer managed key for a topic an AWS service publishes to (``publisher``: its service
    principal, e.g. aps.amazonaws.com or budgets.amazonaws.com). AWS-managed aws/sns cannot be granted
    to a service principal (the receiver-permission page above), and an encrypted topic's publisher
    needs GenerateDataKey and Decrypt on its key."""
    return {
        "Version": "2012-10-17",
        "Statement": [
            # AWS's default key policy: the account (its IAM policies) administers the key
            {
                "Sid": "AccountAdministers",
                "Effect": "Allow",
                "Principal": {"AWS": f"arn:{partition}:iam::{account}:root"},
                "Action": "kms:*",
                "Resource": "*",
            },
            {
                "Sid": "PublisherEncrypts",
                "Effect": "Allow",
                "Principal": {"Service": publisher},
                "Action": ["kms:GenerateDataKey*", "kms:Decrypt"],
                "Resource": "*",
                "Condition": {"StringEquals": {"aws:SourceAccount": account}},
            },
        ],
    }
