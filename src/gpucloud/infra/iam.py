"""IAM for the nodes: an instance role and profile, SSM core, and one inline policy scoped to exactly
this cluster's bucket, queues, job table and autoscaling groups (plus the two read-only describe
calls and the metric publish that AWS only grants on "*", each said why below).

The scoped policy is attached after the autoscaling groups exist because it names their ARNs; a
node that boots in the seconds before sees AccessDenied and the agent retries (it never needs these
permissions before it has a job).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from typing import Any

import pulumi
import pulumi_aws as aws

from gpucloud.agent.backlog_metric import NAMESPACE as METRIC_NAMESPACE
from gpucloud.infra.tags import Tagging

SSM_CORE_POLICY = "policy/AmazonSSMManagedInstanceCore"


def node_policy_document(
    bucket_arn: str,
    queue_arns: Sequence[str],
    table_arn: str,
    asg_arns: Sequence[str],
    agent_package_arn: str | None = None,
) -> dict:
    """The node role's inline policy: a pure function of the ARNs it may touch (no wildcards)."""
    statements: list[dict[str, Any]] = [
        {
            "Sid": "CheckpointBucketList",
            "Effect": "Allow",
            "Action": ["s3:ListBucket", "s3:GetBucketLocation", "s3:ListBucketMultipartUploads"],
            "Resource": [bucket_arn],
        },
        {
            "Sid": "CheckpointObjects",
            "Effect": "Allow",
            "Action": [
                "s3:GetObject",
                "s3:PutObject",
                "s3:DeleteObject",
                "s3:AbortMultipartUpload",
                "s3:ListMultipartUploadParts",
            ],
            "Resource": [f"{bucket_arn}/*"],
        },
        {
            "Sid": "JobQueues",
            "Effect": "Allow",
            "Action": [
                "sqs:ReceiveMessage",
                "sqs:DeleteMessage",
                "sqs:ChangeMessageVisibility",
                "sqs:SendMessage",
                "sqs:GetQueueAttributes",
                "sqs:GetQueueUrl",
            ],
            "Resource": list(queue_arns),
        },
        {
            "Sid": "JobTable",
            "Effect": "Allow",
            "Action": [
                "dynamodb:GetItem",
                "dynamodb:PutItem",
                "dynamodb:UpdateItem",
                "dynamodb:DeleteItem",
                "dynamodb:Query",
                "dynamodb:ConditionCheckItem",
            ],
            "Resource": [table_arn, f"{table_arn}/index/*"],
        },
    ]
    if asg_arns:
        statements += [
            {
                "Sid": "DrainOnTermination",
                "Effect": "Allow",
                "Action": ["autoscaling:CompleteLifecycleAction", "autoscaling:RecordLifecycleActionHeartbeat"],
                "Resource": list(asg_arns),
            },
            # The agent: scale-in protection while busy; on a notice, detach itself (the group
            # launches a replacement) or raise desired capacity; when idle, terminate itself with
            # a decrement. All four take the group's ARN as resource.
            {
                "Sid": "NodeLifecycle",
                "Effect": "Allow",
                "Action": [
                    "autoscaling:SetInstanceProtection",
                    "autoscaling:DetachInstances",
                    "autoscaling:TerminateInstanceInAutoScalingGroup",
                    "autoscaling:SetDesiredCapacity",
                ],
                "Resource": list(asg_arns),
            },
            # The agent finds its own group (and its min/desired) by instance id. Describe actions
            # support no resource-level permissions in the Service Authorization Reference, so
            # "*" is the only resource they accept; they are read-only.
            {
                "Sid": "FindOwnGroup",
                "Effect": "Allow",
                "Action": ["autoscaling:DescribeAutoScalingInstances", "autoscaling:DescribeAutoScalingGroups"],
                "Resource": ["*"],
            },
        ]
    if agent_package_arn is not None:
        # The bootstrap copies the stack's agent wheel (agent.package = s3://...): that one object.
        statements.append(
            {"Sid": "AgentPackage", "Effect": "Allow", "Action": ["s3:GetObject"], "Resource": [agent_package_arn]}
        )
    # PutMetricData has no resource type either; the namespace condition limits it to our backlog
    # metric. No ec2:DescribeInstances: gang peers publish their own private address with their
    # slot claim (from their IMDS), so no node needs to look other instances up.
    statements.append(
        {
            "Sid": "PublishBacklog",
            "Effect": "Allow",
            "Action": ["cloudwatch:PutMetricData"],
            "Resource": ["*"],
            "Condition": {"StringEquals": {"cloudwatch:namespace": METRIC_NAMESPACE}},
        }
    )
    return {"Version": "2012-10-17", "Statement": statements}


@dataclasses.dataclass
class NodeIdentityArgs:
    tagging: Tagging
    ssm: bool = True


class NodeIdentity(pulumi.ComponentResource):
    role: aws.iam.Role
    profile: aws.iam.InstanceProfile

    def __init__(self, name: str, args: NodeIdentityArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("gpucloud:iam:NodeIdentity", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        self.role = aws.iam.Role(
            f"{name}-role",
            description=f"gpucloud {args.tagging.cluster} nodes",
            assume_role_policy=json.dumps(
                {
                    "Version": "2012-10-17",
                    "Statement": [
                        {"Effect": "Allow", "Principal": {"Service": "ec2.amazonaws.com"}, "Action": "sts:AssumeRole"}
                    ],
                }
            ),
            tags=args.tagging.tags("nodes"),
            opts=child,
        )
        if args.ssm:
            partition = aws.get_partition_output(opts=pulumi.InvokeOutputOptions(parent=self)).partition
            aws.iam.RolePolicyAttachment(
                f"{name}-ssm",
                role=self.role.name,
                policy_arn=pulumi.Output.concat("arn:", partition, ":iam::aws:", SSM_CORE_POLICY),
                opts=child,
            )
        self.profile = aws.iam.InstanceProfile(
            f"{name}-profile", role=self.role.name, tags=args.tagging.tags("nodes"), opts=child
        )
        self.register_outputs({"roleArn": self.role.arn, "instanceProfileArn": self.profile.arn})


@dataclasses.dataclass
class NodeAccessPolicyArgs:
    role_name: pulumi.Input[str]
    bucket_arn: pulumi.Input[str]
    queue_arns: Sequence[pulumi.Input[str]]
    table_arn: pulumi.Input[str]
    asg_arns: Sequence[pulumi.Input[str]]
    agent_package_arn: pulumi.Input[str] | None = None  # the agent wheel's S3 object, when there is one


class NodeAccessPolicy(pulumi.ComponentResource):
    def __init__(self, name: str, args: NodeAccessPolicyArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("gpucloud:iam:NodeAccessPolicy", name, None, opts)
        n_queues = len(args.queue_arns)
        document = pulumi.Output.all(
            args.bucket_arn, args.table_arn, args.agent_package_arn, *args.queue_arns, *args.asg_arns
        ).apply(
            lambda v: json.dumps(
                node_policy_document(
                    v[0],
                    v[3 : 3 + n_queues],
                    v[1],
                    v[3 + n_queues :],
                    agent_package_arn=v[2],
                )
            )
        )
        aws.iam.RolePolicy(
            f"{name}-access", role=args.role_name, policy=document, opts=pulumi.ResourceOptions(parent=self)
        )
        self.register_outputs({})
