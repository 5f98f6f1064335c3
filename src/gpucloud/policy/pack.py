"""The gpucloud policy pack: every policy, in the order they are reported."""

from __future__ import annotations

from pulumi_policy import EnforcementLevel, Policy, ResourceValidationPolicy, StackValidationPolicy

from gpucloud.policy.buckets import buckets_encrypted, buckets_private_and_tls_only
from gpucloud.policy.efa_security_group import efa_security_group_self_rules
from gpucloud.policy.encryption import storage_encrypted
from gpucloud.policy.events_queue import events_queue_senders
from gpucloud.policy.iam_statements import no_wildcard_admin
from gpucloud.policy.instances import imdsv2_required, no_public_ips, placement_group_in_one_zone
from gpucloud.policy.least_privilege import no_wildcard_actions, sns_topic_not_public
from gpucloud.policy.network_access import no_open_ingress
from gpucloud.policy.tagging import expiry_on_every_resource, tagged_with_stack

PACK_NAME = "gpucloud-policies"
MANDATORY = EnforcementLevel.MANDATORY

POLICIES: list[Policy] = [
    ResourceValidationPolicy(
        name="imdsv2-required",
        description="Launch templates, instances and image builds require IMDSv2 (httpTokens = required).",
        validate=imdsv2_required,
        enforcement_level=MANDATORY,
    ),
    ResourceValidationPolicy(
        name="no-public-ips",
        description="Nodes get no public IP: no associatePublicIpAddress on interfaces or mapPublicIpOnLaunch subnets.",
        validate=no_public_ips,
        enforcement_level=MANDATORY,
    ),
    ResourceValidationPolicy(
        name="placement-group-one-zone",
        description="An autoscaling group in a cluster placement group (EFA groups) has exactly one subnet.",
        validate=placement_group_in_one_zone,
        enforcement_level=MANDATORY,
    ),
    ResourceValidationPolicy(
        name="no-internet-ingress",
        description="No security group ingress from 0.0.0.0/0 or ::/0.",
        validate=no_open_ingress,
        enforcement_level=MANDATORY,
    ),
    ResourceValidationPolicy(
        name="storage-encrypted",
        description="EBS volumes (instances' too), DynamoDB tables, SQS queues and SNS topics are encrypted at rest.",
        validate=storage_encrypted,
        enforcement_level=MANDATORY,
    ),
    StackValidationPolicy(
        name="bucket-encrypted",
        description="Every S3 bucket has a server-side encryption configuration.",
        validate=buckets_encrypted,
        enforcement_level=MANDATORY,
    ),
    StackValidationPolicy(
        name="bucket-private-tls-only",
        description="Every S3 bucket blocks public access (all four flags) and denies requests without TLS.",
        validate=buckets_private_and_tls_only,
        enforcement_level=MANDATORY,
    ),
    ResourceValidationPolicy(
        name="no-iam-wildcard-admin",
        description="No IAM statement allows action '*' on resource '*'.",
        validate=no_wildcard_admin,
        enforcement_level=MANDATORY,
    ),
    ResourceValidationPolicy(
        name="no-iam-wildcard-actions",
        description="No IAM statement allows a wildcard action (*, service:*, service:Prefix*) or uses NotAction.",
        validate=no_wildcard_actions,
        enforcement_level=MANDATORY,
    ),
    ResourceValidationPolicy(
        name="sns-topic-not-public",
        description="No SNS topic policy allows every principal without a condition.",
        validate=sns_topic_not_public,
        enforcement_level=MANDATORY,
    ),
    StackValidationPolicy(
        name="efa-security-group-self-rules",
        description="Security groups on EFA interfaces allow all traffic to and from themselves.",
        validate=efa_security_group_self_rules,
        enforcement_level=MANDATORY,
    ),
    StackValidationPolicy(
        name="events-queue-eventbridge-only",
        description="Only EventBridge may send to a queue EventBridge rules deliver to (no node can forge interruptions).",
        validate=events_queue_senders,
        enforcement_level=MANDATORY,
    ),
    ResourceValidationPolicy(
        name="tagged-with-stack",
        description="Every taggable resource carries the gpucloud:stack tag naming its stack.",
        validate=tagged_with_stack,
        enforcement_level=MANDATORY,
    ),
    StackValidationPolicy(
        name="expiry-on-every-resource",
        description="With gpucloud:ttlHours, every resource tagged with the stack carries the same gpucloud:expires-at.",
        validate=expiry_on_every_resource,
        enforcement_level=MANDATORY,
    ),
]
