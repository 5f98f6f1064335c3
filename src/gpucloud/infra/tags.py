"""Tags every gpucloud resource carries: ``gpucloud:stack``, ``gpucloud:cluster``, the user's own.

Set per resource (not through provider default tags) so the recorded inputs show them and the
policy pack can check every resource, and so a stack's resources can be found with one tag filter.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

STACK_TAG = "gpucloud:stack"
CLUSTER_TAG = "gpucloud:cluster"
NODE_GROUP_TAG = "gpucloud:node-group"

# Resource types that have no tags in AWS (settings attached to a tagged parent resource).
UNTAGGABLE_TYPES: frozenset[str] = frozenset(
    {
        "aws:ec2/route:Route",
        "aws:ec2/routeTableAssociation:RouteTableAssociation",
        "aws:s3/bucketVersioning:BucketVersioning",
        "aws:s3/bucketServerSideEncryptionConfiguration:BucketServerSideEncryptionConfiguration",
        "aws:s3/bucketPublicAccessBlock:BucketPublicAccessBlock",
        "aws:s3/bucketPolicy:BucketPolicy",
        "aws:s3/bucketLifecycleConfiguration:BucketLifecycleConfiguration",
        "aws:s3/bucketOwnershipControls:BucketOwnershipControls",
        "aws:sqs/queuePolicy:QueuePolicy",
        "aws:cloudwatch/eventTarget:EventTarget",
        "aws:iam/rolePolicy:RolePolicy",
        "aws:iam/rolePolicyAttachment:RolePolicyAttachment",
        "aws:autoscaling/policy:Policy",
        "aws:autoscaling/schedule:Schedule",
        "aws:scheduler/schedule:Schedule",  # EventBridge Scheduler schedules take no tags
        "aws:ec2/volumeAttachment:VolumeAttachment",
        "aws:sns/topicSubscription:TopicSubscription",
        "aws:sns/topicPolicy:TopicPolicy",
        "aws:amp/alertManagerDefinition:AlertManagerDefinition",
        "aws:amp/workspaceConfiguration:WorkspaceConfiguration",
    }
)


@dataclasses.dataclass(frozen=True)
class Tagging:
    stack: str
    cluster: str
    extra: Mapping[str, str] = dataclasses.field(default_factory=dict)

    def tags(self, name: str | None = None, **more: str) -> dict[str, str]:
        """The tag set for one resource; ``name`` becomes the console-visible ``Name`` tag."""
        out = {**self.extra, STACK_TAG: self.stack, CLUSTER_TAG: self.cluster, **more}
        if name is not None:
            out["Name"] = f"{self.cluster}-{name}"
        return out
