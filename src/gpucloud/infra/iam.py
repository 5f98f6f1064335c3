"""IAM for the nodes: an instance role and profile, SSM core, and one inline policy scoped to exactly
this cluster's bucket, queues and job table, and to the autoscaling groups tagged with this stack
(plus the two read-only describe calls and the metric publish that AWS only grants on "*", each
said why below).

The scoped policy names no group ARN, so it exists before the groups: each group ``depends_on``
it, and no node boots into AccessDenied.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import pulumi
import pulumi_aws as aws

from gpucloud.cluster.agent_contract import BLOCK_ENDING_TAG, JOB_TAG
from gpucloud.cluster.agent_contract import NAMESPACE as METRIC_NAMESPACE
from gpucloud.cluster.tags import CLUSTER_TAG, STACK_TAG, Tagging

SSM_CORE_POLICY = "policy/AmazonSSMManagedInstanceCore"


@dataclasses.dataclass(frozen=True)
class JobPlaneArns:
    """The job plane's ARNs a node touches."""

    job_queue: str
    job_dead_letter_queue: str  # poison slot messages are moved here by the agent
    events_queue: str  # EventBridge's interruption events: nodes read it, only EventBridge sends
    table: str


@dataclasses.dataclass(frozen=True)
class GroupScope:
    """Which autoscaling groups the agent may act on: those of this stack and cluster, by tag.

    A tag condition (not the groups' ARNs, which carry a UUID known only once a group exists) lets
    the policy be created before the groups, so no node ever boots without it. AWS documents the
    ``autoscaling:ResourceTag/<key>`` condition for the group actions:
    https://docs.aws.amazon.com/autoscaling/ec2/userguide/tag-security.html and
    https://docs.aws.amazon.com/service-authorization/latest/reference/list_amazonec2autoscaling.html
    """

    group_arn_pattern: str  # arn:<partition>:autoscaling:<region>:<account>:autoScalingGroup:*:autoScalingGroupName/*
    stack: str
    cluster: str

    def condition(self) -> dict[str, Any]:
        return {
            "StringEquals": {
                f"autoscaling:ResourceTag/{STACK_TAG}": self.stack,
                f"autoscaling:ResourceTag/{CLUSTER_TAG}": self.cluster,
            }
        }

    def job_tag_statements(self) -> list[dict[str, Any]]:
        """The agent's ``gpucloud:job-id`` tag (``agent/job_tags.py``): DescribeInstances on itself for
        its volumes and interfaces; CreateTags/DeleteTags only on this cluster's instances, volumes and
        interfaces (the launch template tags all three with ``gpucloud:cluster``), and only that key.

        ``aws:TagKeys`` with ``ForAllValues`` is true for a request that names no key at all, and a
        DeleteTags without tags deletes every user tag of the resources; the ``Null`` condition
        refuses such a request. Condition keys of CreateTags/DeleteTags:
        https://docs.aws.amazon.com/service-authorization/latest/reference/list_amazonec2.html and
        https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/supported-iam-actions-tagging.html
        """
        ec2 = self.group_arn_pattern.split(":autoscaling:", 1)
        arn = f"{ec2[0]}:ec2:{ec2[1].split(':autoScalingGroup', 1)[0]}"  # arn:<partition>:ec2:<region>:<account>
        return [
            # its volumes and interfaces: DescribeInstances, granted once by node_policy_document
            {
                "Sid": "JobTags",
                "Effect": "Allow",
                "Action": ["ec2:CreateTags", "ec2:DeleteTags"],
                "Resource": [f"{arn}:{kind}/*" for kind in ("instance", "volume", "network-interface")],
                "Condition": {
                    "StringEquals": {f"aws:ResourceTag/{CLUSTER_TAG}": self.cluster},
                    "ForAllValues:StringEquals": {"aws:TagKeys": [JOB_TAG]},
                    "Null": {"aws:TagKeys": "false"},
                },
            },
            # A node whose bootstrap failed tags its own instance with the reason before it leaves
            # the group (scripts/node-bootstrap.sh): that key only, this cluster's instances only.
            {
                "Sid": "BootstrapFailedTag",
                "Effect": "Allow",
                "Action": ["ec2:CreateTags"],
                "Resource": [f"{arn}:instance/*"],
                "Condition": {
                    "StringEquals": {f"aws:ResourceTag/{CLUSTER_TAG}": self.cluster},
                    "ForAllValues:StringEquals": {"aws:TagKeys": [BOOTSTRAP_FAILED_TAG]},
                    "Null": {"aws:TagKeys": "false"},
                },
            },
        ]


# What the runtime calls (grep src/gpucloud for the boto3 methods; tests/infra/test_node_iam.py
# checks each action below against the calls). Not granted because never called:
# autoscaling:SetDesiredCapacity, autoscaling:RecordLifecycleActionHeartbeat,
# s3:ListBucketMultipartUploads, s3:ListMultipartUploadParts (no ListParts: uploads are never
# resumed), s3:GetBucketLocation (every client is given its region); sqs:GetQueueUrl only on the dead-letter queue (the job queue's
# redrive policy names it by ARN; ``queue/aws/backend.py`` looks its URL up).
JOB_QUEUE_ACTIONS = [
    "sqs:ReceiveMessage",
    "sqs:DeleteMessage",
    "sqs:ChangeMessageVisibility",
    "sqs:SendMessage",
    "sqs:GetQueueAttributes",
]
DEAD_LETTER_ACTIONS = ["sqs:GetQueueUrl", "sqs:SendMessage"]
# No SendMessage: a node that could send to the events queue could forge terminations of others.
EVENTS_QUEUE_ACTIONS = ["sqs:ReceiveMessage", "sqs:DeleteMessage", "sqs:ChangeMessageVisibility"]
LIFECYCLE_ACTIONS = ["autoscaling:CompleteLifecycleAction"]
NODE_LIFECYCLE_ACTIONS = [
    "autoscaling:SetInstanceProtection",
    "autoscaling:DetachInstances",
    "autoscaling:TerminateInstanceInAutoScalingGroup",
    "autoscaling:SetInstanceHealth",  # a failed bootstrap at the group's minimum size (node-bootstrap.sh)
]
# The reason a node's bootstrap failed, on its own instance (scripts/node-bootstrap.sh, leave_group).
BOOTSTRAP_FAILED_TAG = "gpucloud:bootstrap-failed"


def node_policy_document(
    bucket_arn: str,
    jobs: JobPlaneArns,
    groups: GroupScope | None,
    agent_package_arn: str | None = None,
    agent_wheelhouse: tuple[str, str] | None = None,
    describe_instances: bool = False,
) -> dict:
    """The node role's inline policy: a pure function of the ARNs it may touch (no wildcards but the
    autoscaling groups, which are scoped by this stack's tags)."""
    statements: list[dict[str, Any]] = [
        {
            "Sid": "CheckpointBucketList",
            "Effect": "Allow",
            "Action": ["s3:ListBucket"],
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
            ],
            "Resource": [f"{bucket_arn}/*"],
        },
        {"Sid": "JobQueue", "Effect": "Allow", "Action": list(JOB_QUEUE_ACTIONS), "Resource": [jobs.job_queue]},
        {
            "Sid": "JobDeadLetterQueue",
            "Effect": "Allow",
            "Action": list(DEAD_LETTER_ACTIONS),
            "Resource": [jobs.job_dead_letter_queue],
        },
        {
            "Sid": "EventsQueueRead",
            "Effect": "Allow",
            "Action": list(EVENTS_QUEUE_ACTIONS),
            "Resource": [jobs.events_queue],
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
                "dynamodb:Scan",  # `gpucloud jobs`: every job with its attempts and timeline in one Scan
                "dynamodb:ConditionCheckItem",
            ],
            "Resource": [jobs.table, f"{jobs.table}/index/*"],
        },
    ]
    if groups is not None:
        statements += [
            {
                "Sid": "DrainOnTermination",
                "Effect": "Allow",
                "Action": list(LIFECYCLE_ACTIONS),
                "Resource": [groups.group_arn_pattern],
                "Condition": groups.condition(),
            },
            # The agent: scale-in protection while busy; on a notice, detach itself (the group
            # launches a replacement); when idle, terminate itself with a decrement.
            {
                "Sid": "NodeLifecycle",
                "Effect": "Allow",
                "Action": list(NODE_LIFECYCLE_ACTIONS),
                "Resource": [groups.group_arn_pattern],
                "Condition": groups.condition(),
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
            # The agent of a group member tags its node with the running job (cost allocation).
            *groups.job_tag_statements(),
        ]
    if agent_package_arn is not None:
        # The bootstrap copies the stack's agent wheel (agent.package = s3://...): that one object.
        statements.append(
            {"Sid": "AgentPackage", "Effect": "Allow", "Action": ["s3:GetObject"], "Resource": [agent_package_arn]}
        )
    if agent_wheelhouse is not None:
        # agent.package = s3://bucket/folder/: the bootstrap lists and copies that folder, nothing else
        # (ListBucket limited by the s3:prefix condition:
        # https://docs.aws.amazon.com/AmazonS3/latest/userguide/amazon-s3-policy-keys.html)
        house_bucket_arn, prefix = agent_wheelhouse
        statements += [
            {
                "Sid": "AgentWheelhouseList",
                "Effect": "Allow",
                "Action": ["s3:ListBucket"],
                "Resource": [house_bucket_arn],
                "Condition": {"StringLike": {"s3:prefix": [f"{prefix}*"]}},
            },
            {
                "Sid": "AgentWheelhouse",
                "Effect": "Allow",
                "Action": ["s3:GetObject"],
                "Resource": [f"{house_bucket_arn}/{prefix}*"],
            },
        ]
    if describe_instances and groups is not None:
        # A stack with a capacity block: at its expiry warning the agent that gets it marks the
        # block's groups (agent/asg_hooks.py, mark_block_ending), so their idle agents stop taking
        # work too. That one tag key, on this stack's groups only.
        statements.append(
            {
                "Sid": "MarkBlockEnding",
                "Effect": "Allow",
                "Action": ["autoscaling:CreateOrUpdateTags"],
                "Resource": [groups.group_arn_pattern],
                "Condition": {
                    **groups.condition(),
                    "ForAllValues:StringEquals": {"aws:TagKeys": [BLOCK_ENDING_TAG]},
                    "Null": {"aws:TagKeys": "false"},
                },
            }
        )
    if describe_instances or groups is not None:
        # One grant for both readers: a group member's agent finds its own volumes and interfaces
        # to tag them (job_tag_statements); in stacks with a capacity block, at the block's expiry
        # warning the agent finds the block's instances (agent/events_handler.py). Describe actions
        # take no resource-level permission ("*" only); read-only. Gang peers never need it: they
        # publish their own address with their slot claim.
        statements.append(
            {"Sid": "FindInstances", "Effect": "Allow", "Action": ["ec2:DescribeInstances"], "Resource": ["*"]}
        )
    # PutMetricData has no resource type either; the namespace condition limits it to our backlog
    # metric.
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
    job_queue_arn: pulumi.Input[str]
    job_dead_letter_queue_arn: pulumi.Input[str]
    events_queue_arn: pulumi.Input[str]
    table_arn: pulumi.Input[str]
    region: str
    stack: str
    cluster: str
    with_groups: bool = True  # grant the agent's autoscaling calls (on this stack's groups, by tag)
    describe_instances: bool = False  # a capacity-block group: the agent looks up the block's instances
    agent_package_arn: pulumi.Input[str] | None = None  # the agent wheel's S3 object, when there is one
    # or the agent's wheelhouse: its bucket's ARN and the folder (prefix, ending in "/")
    agent_wheelhouse_bucket_arn: pulumi.Input[str] | None = None
    agent_wheelhouse_prefix: str | None = None


class NodeAccessPolicy(pulumi.ComponentResource):
    """The node role's inline policy. It names no autoscaling group ARN, so it is created before
    the groups and each group ``depends_on`` it: no node boots without its permissions."""

    policy: aws.iam.RolePolicy

    def __init__(self, name: str, args: NodeAccessPolicyArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("gpucloud:iam:NodeAccessPolicy", name, None, opts)
        invoke = pulumi.InvokeOutputOptions(parent=self)
        partition = aws.get_partition_output(opts=invoke).partition
        account = aws.get_caller_identity_output(opts=invoke).account_id

        def render(v: list[Any]) -> str:
            bucket, job_queue, dlq, events, table, package, house_bucket, part, acct = v
            groups = (
                GroupScope(
                    f"arn:{part}:autoscaling:{args.region}:{acct}:autoScalingGroup:*:autoScalingGroupName/*",
                    stack=args.stack,
                    cluster=args.cluster,
                )
                if args.with_groups
                else None
            )
            jobs = JobPlaneArns(job_queue, dlq, events, table)
            house = None if house_bucket is None else (house_bucket, args.agent_wheelhouse_prefix or "")
            return json.dumps(
                node_policy_document(
                    bucket,
                    jobs,
                    groups,
                    agent_package_arn=package,
                    agent_wheelhouse=house,
                    describe_instances=args.describe_instances,
                )
            )

        document = pulumi.Output.all(
            args.bucket_arn,
            args.job_queue_arn,
            args.job_dead_letter_queue_arn,
            args.events_queue_arn,
            args.table_arn,
            args.agent_package_arn,
            args.agent_wheelhouse_bucket_arn,
            partition,
            account,
        ).apply(render)
        self.policy = aws.iam.RolePolicy(
            f"{name}-access", role=args.role_name, policy=document, opts=pulumi.ResourceOptions(parent=self)
        )
        self.register_outputs({})
