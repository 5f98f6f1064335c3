"""Tags every gpucloud resource carries: ``gpucloud:stack``, ``gpucloud:cluster``, the user's own.

Set per resource (not through provider default tags) so the recorded inputs show them and the
policy pack can check every resource, and so a stack's resources can be found with one tag filter.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Callable, Iterable, Mapping
from typing import Any

STACK_TAG = "gpucloud:stack"
CLUSTER_TAG = "gpucloud:cluster"
NODE_GROUP_TAG = "gpucloud:node-group"
# gpucloud:ttlHours: when `gpucloud sweep --expired` may delete the resource (ISO 8601 UTC)
EXPIRES_AT_TAG = "gpucloud:expires-at"
KEEP_TAG = "gpucloud:keep"  # "true": sweep never touches the resource
# AWS's limits (https://docs.aws.amazon.com/tag-editor/latest/userguide/tagging.html): 50 tags on a
# resource, 10 on an S3 object (https://docs.aws.amazon.com/AmazonS3/latest/userguide/object-tagging.html).
MAX_RESOURCE_TAGS = 50
MAX_OBJECT_TAGS = 10
# What gpucloud adds to the user's tags on one resource at most: stack, cluster, Name, node group, expiry.
OWN_TAGS_MAX = 5


def _utcnow() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc)


# The clock the program reads when it runs (the first run's time is kept: infra/expiry.py); tests set it.
clock: Callable[[], dt.datetime] = _utcnow


def expires_at(ttl_hours: float | None, now: dt.datetime | None = None) -> str | None:
    """``gpucloud:expires-at`` for a stack with ``gpucloud:ttlHours`` (None without one), to the second."""
    if ttl_hours is None:
        return None
    moment = (now or clock()).astimezone(dt.timezone.utc) + dt.timedelta(hours=ttl_hours)
    return moment.replace(microsecond=0).isoformat().replace("+00:00", "Z")


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
        "aws:autoscaling/lifecycleHook:LifecycleHook",
        "aws:autoscaling/schedule:Schedule",
        "aws:scheduler/schedule:Schedule",  # EventBridge Scheduler schedules take no tags
        "aws:ec2/volumeAttachment:VolumeAttachment",
        "aws:sns/topicSubscription:TopicSubscription",
        "aws:sns/topicPolicy:TopicPolicy",
        "aws:lambda/permission:Permission",  # a statement of the function's resource policy
        "aws:amp/alertManagerDefinition:AlertManagerDefinition",
        "aws:amp/workspaceConfiguration:WorkspaceConfiguration",
    }
)


def recorded_expires_at(inputs: Iterable[Mapping[str, Any]]) -> str | None:
    """The ``gpucloud:expires-at`` the resources were given (their recorded inputs), for ``plan``."""
    for resource_inputs in inputs:
        tags = resource_inputs.get("tags")
        if isinstance(tags, Mapping) and isinstance(tags.get(EXPIRES_AT_TAG), str):
            return str(tags[EXPIRES_AT_TAG])
    return None


@dataclasses.dataclass(frozen=True)
class Tagging:
    stack: str
    cluster: str
    extra: Mapping[str, str] = dataclasses.field(default_factory=dict)
    # EXPIRES_AT_TAG's value: ``expires_at(spec.ttl_hours)``, or on a stack the value the first run
    # stored (``infra/expiry.py``: a Pulumi output, hence Any)
    expires_at: Any = None

    def tags(self, name: str | None = None, **more: str) -> dict[str, Any]:
        """The tag set for one resource; ``name`` becomes the console-visible ``Name`` tag."""
        out: dict[str, Any] = {**self.extra, STACK_TAG: self.stack, CLUSTER_TAG: self.cluster, **more}
        if self.expires_at is not None:
            out[EXPIRES_AT_TAG] = self.expires_at
        if name is not None:
            out["Name"] = f"{self.cluster}-{name}"
        return out

    def object_tags(self) -> dict[str, Any]:
        """An S3 object's tags: stack, cluster and the expiry only (S3 takes at most 10 on an object,
        and the user's own would not fit beside them); the sweep finds it by these."""
        out: dict[str, Any] = {STACK_TAG: self.stack, CLUSTER_TAG: self.cluster}
        if self.expires_at is not None:
            out[EXPIRES_AT_TAG] = self.expires_at
        return out
