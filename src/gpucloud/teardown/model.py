"""What sweep found: one tagged resource, named by ARN, with the tags that decide its fate."""

from __future__ import annotations

import dataclasses
import datetime as dt

from gpucloud.cluster.tags import EXPIRES_AT_TAG, KEEP_TAG, STACK_TAG

# Resource kinds sweep knows how to delete, in the order it deletes them: what uses a thing goes
# before the thing (instances before their subnets, NAT gateways before their addresses, the VPC
# after everything in it), and buckets last so checkpoints outlive everything that writes them.
DELETE_ORDER: tuple[str, ...] = (
    "autoscaling:autoScalingGroup",
    "ec2:instance",
    "ec2:volume",  # the monitor's data volume: free once its instance has terminated
    "fsx:file-system",
    "ec2:launch-template",
    "ec2:network-interface",
    "ec2:vpc-endpoint",
    "ec2:natgateway",
    "ec2:elastic-ip",
    "ec2:subnet",
    "ec2:route-table",
    "ec2:internet-gateway",
    "ec2:security-group",
    "ec2:placement-group",
    "ec2:vpc",
    "sqs:queue",
    "dynamodb:table",
    "events:rule",
    "fis:experiment-template",  # gpucloud:drill's template: before the alarm and the role it names
    "budgets:budget",  # before the topic it notifies (global, like IAM)
    "sns:topic",
    "lambda:function",  # the budget's stop function: after the topic that invokes it
    "cloudwatch:alarm",
    "logs:log-group",
    "iam:instance-profile",
    "iam:role",
    "s3:bucket",
    "kms:key",  # last: the topics and buckets encrypted with it are gone first (deletion is scheduled)
)


# Values of the keep tag that do NOT keep a resource. Anything else does ("true", "yes", "1", "",
# a typo): a keep tag is someone's wish to keep the thing, and a sweep that misreads it loses data,
# while one that keeps too much only leaves a resource for a second look.
NOT_KEPT_VALUES = frozenset({"false", "no", "0", "off"})


def keep_tag(tags: dict[str, str]) -> str | None:
    """``key=value`` of the tag that asks sweep to keep the resource, or None: a ``gpucloud:keep``
    key in any letter case (AWS tag keys are case-sensitive, so ``GPUCloud:Keep`` is another key,
    but it says the same thing to a person), with any value except false / no / 0 / off (case and
    spaces ignored)."""
    for key, value in sorted(tags.items()):
        if key.strip().lower() == KEEP_TAG and value.strip().lower() not in NOT_KEPT_VALUES:
            return f"{key}={value}"
    return None


def is_kept(tags: dict[str, str]) -> bool:
    return keep_tag(tags) is not None


def sweepable(tags: dict[str, str], stack: str | None) -> bool:
    """Whether a resource with ``tags`` may go with stack ``stack``'s resources: it carries that
    stack's tag and is not kept. Used for what another resource's delete would take with it (an
    Auto Scaling group's instances, an instance profile emptied by deleting its role)."""
    return stack is not None and tags.get(STACK_TAG) == stack and not is_kept(tags)


@dataclasses.dataclass(frozen=True)
class Found:
    """One resource carrying ``gpucloud:stack``. ``ident`` is what the service's delete call takes."""

    arn: str
    kind: str  # "service:type", as in DELETE_ORDER (unknown kinds are listed, never deleted)
    ident: str
    tags: dict[str, str]
    created: dt.datetime | None = None
    region: str | None = None
    instance_type: str | None = None  # instances: what the hourly cost is looked up by
    lifecycle: str | None = None  # instances: "spot" or "on-demand"
    # what deleting this takes with it, by id, with their tags: an Auto Scaling group's instances
    # (ForceDelete terminates them all), the instance profiles a role is in (its delete empties them)
    members: dict[str, dict[str, str]] = dataclasses.field(default_factory=dict)

    def spared_members(self) -> list[str]:
        """The members that must outlive this resource: kept ones and those of another stack."""
        return sorted(m for m, tags in self.members.items() if not sweepable(tags, self.stack))

    @property
    def stack(self) -> str | None:
        return self.tags.get(STACK_TAG)

    @property
    def keep(self) -> bool:
        return is_kept(self.tags)

    @property
    def expires_at(self) -> dt.datetime | None:
        """The ``gpucloud:expires-at`` tag as a time; None when absent or not a time."""
        text = self.tags.get(EXPIRES_AT_TAG)
        if not text:
            return None
        try:
            moment = dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
        except ValueError:
            return None
        return moment if moment.tzinfo is not None else moment.replace(tzinfo=dt.timezone.utc)


def kind_from_arn(arn: str) -> tuple[str, str]:
    """(kind, ident) for an ARN: ``arn:aws:ec2:r:a:vpc/vpc-1`` -> (``ec2:vpc``, ``vpc-1``).

    ARN formats: https://docs.aws.amazon.com/IAM/latest/UserGuide/reference-arns.html
    """
    parts = arn.split(":", 5)
    if len(parts) < 6:
        return ("unknown", arn)
    service, resource = parts[2], parts[5]
    if service == "sqs":
        return ("sqs:queue", resource)
    if service == "s3":
        return ("s3:bucket", resource)
    if service == "sns":
        return ("sns:topic", resource)
    if service in ("cloudwatch", "logs", "lambda") and ":" in resource:
        rtype, _, name = resource.partition(":")
        return (f"{service}:{rtype}", name.removesuffix(":*"))
    rtype, sep, ident = resource.partition("/")
    if not sep:
        return (f"{service}:{rtype}", rtype)
    if service == "autoscaling":  # autoScalingGroup:uuid:autoScalingGroupName/NAME
        return ("autoscaling:autoScalingGroup", ident)
    if service == "iam":  # role/optional/path/NAME: the calls take the name alone
        return (f"iam:{rtype}", ident.rsplit("/", 1)[-1])
    return (f"{service}:{rtype}", ident)
