"""Listing what carries ``gpucloud:stack`` in one region (plus IAM, which is global). boto3 I/O only.

The Resource Groups Tagging API's GetResources is the wide net, but it does not return IAM roles or
Auto Scaling groups ("The GetResources operation does not currently support IAM users and roles";
Auto Scaling groups "return an empty response":
https://docs.aws.amazon.com/resourcegroupstagging/latest/APIReference/supported-services.html), so
those, instance profiles, and the EC2 kinds whose state matters (a terminated instance or a deleted
NAT gateway stays listed for a while) are listed per service as well. Results merge by ARN.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Iterator
from typing import Any

from gpucloud.cluster.tags import STACK_TAG
from gpucloud.teardown.model import Found, kind_from_arn

# EC2 states after which a resource is gone (it only lingers in Describe* for a while)
_GONE_STATES = frozenset({"terminated", "shutting-down", "deleted", "deleting", "failed"})


def _tag_map(tags: list[dict[str, Any]] | None) -> dict[str, str]:
    return {str(t.get("Key", t.get("key"))): str(t.get("Value", t.get("value", ""))) for t in tags or []}


def _has_stack(tags: dict[str, str], stack: str | None) -> bool:
    return STACK_TAG in tags and (stack is None or tags[STACK_TAG] == stack)


def _stack_filter(stack: str | None) -> list[dict[str, Any]]:
    return [{"Name": f"tag:{STACK_TAG}", "Values": [stack]}] if stack else [{"Name": "tag-key", "Values": [STACK_TAG]}]


class Discovery:
    """Lists one account's stack resources. ``client(service)`` makes a boto3 client for the region."""

    def __init__(self, client: Callable[[str], Any], region: str, account: str) -> None:
        self.client = client
        self.region = region
        self.account = account
        self.gone: set[str] = set()  # ARNs per-service listings saw in a final state

    def run(self, stack: str | None) -> list[Found]:
        merged: dict[str, Found] = {}
        for found in self.tagging_api(stack):
            merged[found.arn] = found
        for listing in (
            self.autoscaling_groups,
            self.instances,
            self.launch_templates,
            self.network_interfaces,
            self.nat_gateways,
            self.addresses,
            self.vpc_endpoints,
            self.event_rules,
            self.fis_experiment_templates,
            self.kms_keys,
            self.budgets,
            self.iam_roles,
            self.iam_instance_profiles,
        ):
            for found in listing(stack):
                known = merged.get(found.arn)
                # per-service listings know creation times; keep the Tagging API's tags when richer
                merged[found.arn] = found if known is None else _merge(known, found)
        return [f for arn, f in merged.items() if arn not in self.gone and _has_stack(f.tags, stack)]

    def _arn(self, service: str, resource: str) -> str:
        return f"arn:aws:{service}:{self.region}:{self.account}:{resource}"

    def tagging_api(self, stack: str | None) -> Iterator[Found]:
        """GetResources, paginated (https://docs.aws.amazon.com/resourcegroupstagging/latest/APIReference/API_GetResources.html)."""
        tag_filter: dict[str, Any] = {"Key": STACK_TAG, **({"Values": [stack]} if stack else {})}
        pages = self.client("resourcegroupstaggingapi").get_paginator("get_resources")
        for page in pages.paginate(TagFilters=[tag_filter]):
            for item in page.get("ResourceTagMappingList", []):
                kind, ident = kind_from_arn(item["ResourceARN"])
                yield Found(item["ResourceARN"], kind, ident, _tag_map(item.get("Tags")), region=self.region)

    def autoscaling_groups(self, stack: str | None) -> Iterator[Found]:
        pages = self.client("autoscaling").get_paginator("describe_auto_scaling_groups")
        for page in pages.paginate(Filters=[{"Name": "tag-key", "Values": [STACK_TAG]}]):
            for group in page["AutoScalingGroups"]:
                tags = _tag_map(group.get("Tags"))
                if group.get("Status") == "Delete in progress" and group.get("Instances") == []:
                    self.gone.add(group["AutoScalingGroupARN"])
                yield Found(
                    group["AutoScalingGroupARN"],
                    "autoscaling:autoScalingGroup",
                    group["AutoScalingGroupName"],
                    tags,
                    group.get("CreatedTime"),
                    self.region,
                    members=group_instance_tags(self.client, group),
                )

    def instances(self, stack: str | None) -> Iterator[Found]:
        pages = self.client("ec2").get_paginator("describe_instances")
        for page in pages.paginate(Filters=_stack_filter(stack)):
            for reservation in page["Reservations"]:
                for inst in reservation["Instances"]:
                    arn = self._arn("ec2", f"instance/{inst['InstanceId']}")
                    if inst["State"]["Name"] in _GONE_STATES:
                        self.gone.add(arn)
                    yield Found(
                        arn,
                        "ec2:instance",
                        inst["InstanceId"],
                        _tag_map(inst.get("Tags")),
                        inst.get("LaunchTime"),
                        self.region,
                        instance_type=inst.get("InstanceType"),
                        lifecycle="spot" if inst.get("InstanceLifecycle") == "spot" else "on-demand",
                    )

    def launch_templates(self, stack: str | None) -> Iterator[Found]:
        pages = self.client("ec2").get_paginator("describe_launch_templates")
        for page in pages.paginate(Filters=_stack_filter(stack)):
            for lt in page["LaunchTemplates"]:
                arn = self._arn("ec2", f"launch-template/{lt['LaunchTemplateId']}")
                yield Found(
                    arn,
                    "ec2:launch-template",
                    lt["LaunchTemplateId"],
                    _tag_map(lt.get("Tags")),
                    lt.get("CreateTime"),
                    self.region,
                )

    def network_interfaces(self, stack: str | None) -> Iterator[Found]:
        """EFA and other interfaces the stack tagged (launch templates tag the interfaces they create)."""
        pages = self.client("ec2").get_paginator("describe_network_interfaces")
        for page in pages.paginate(Filters=_stack_filter(stack)):
            for eni in page["NetworkInterfaces"]:
                arn = self._arn("ec2", f"network-interface/{eni['NetworkInterfaceId']}")
                tags = _tag_map(eni.get("TagSet"))
                yield Found(arn, "ec2:network-interface", eni["NetworkInterfaceId"], tags, region=self.region)

    def nat_gateways(self, stack: str | None) -> Iterator[Found]:
        pages = self.client("ec2").get_paginator("describe_nat_gateways")
        for page in pages.paginate(Filter=_stack_filter(stack)):
            for nat in page["NatGateways"]:
                arn = self._arn("ec2", f"natgateway/{nat['NatGatewayId']}")
                if nat.get("State") in _GONE_STATES:
                    self.gone.add(arn)
                tags = _tag_map(nat.get("Tags"))
                yield Found(arn, "ec2:natgateway", nat["NatGatewayId"], tags, nat.get("CreateTime"), self.region)

    def addresses(self, stack: str | None) -> Iterator[Found]:
        for addr in self.client("ec2").describe_addresses(Filters=_stack_filter(stack))["Addresses"]:
            arn = self._arn("ec2", f"elastic-ip/{addr['AllocationId']}")
            yield Found(arn, "ec2:elastic-ip", addr["AllocationId"], _tag_map(addr.get("Tags")), region=self.region)

    def vpc_endpoints(self, stack: str | None) -> Iterator[Found]:
        pages = self.client("ec2").get_paginator("describe_vpc_endpoints")
        for page in pages.paginate(Filters=_stack_filter(stack)):
            for ep in page["VpcEndpoints"]:
                arn = self._arn("ec2", f"vpc-endpoint/{ep['VpcEndpointId']}")
                if str(ep.get("State", "")).lower() in _GONE_STATES:
                    self.gone.add(arn)
                tags = _tag_map(ep.get("Tags"))
                yield Found(
                    arn, "ec2:vpc-endpoint", ep["VpcEndpointId"], tags, ep.get("CreationTimestamp"), self.region
                )

    def event_rules(self, stack: str | None) -> Iterator[Found]:
        events = self.client("events")
        token: str | None = None
        while True:
            page = events.list_rules(**({"NextToken": token} if token else {}))
            for rule in page.get("Rules", []):
                tags = _tag_map(events.list_tags_for_resource(ResourceARN=rule["Arn"]).get("Tags"))
                if _has_stack(tags, stack):
                    yield Found(rule["Arn"], "events:rule", rule["Name"], tags, region=self.region)
            token = page.get("NextToken")
            if not token:
                return

    def fis_experiment_templates(self, stack: str | None) -> Iterator[Found]:
        """gpucloud:drill's FIS template: the summaries carry their tags and ARN, so one paginated call
        (https://docs.aws.amazon.com/fis/latest/APIReference/API_ListExperimentTemplates.html)."""
        for page in self.client("fis").get_paginator("list_experiment_templates").paginate():
            for template in page.get("experimentTemplates", []):
                tags = {str(k): str(v) for k, v in (template.get("tags") or {}).items()}
                if _has_stack(tags, stack):
                    arn = template.get("arn") or self._arn("fis", f"experiment-template/{template['id']}")
                    yield Found(
                        arn, "fis:experiment-template", template["id"], tags, template.get("creationTime"), self.region
                    )

    def kms_keys(self, stack: str | None) -> Iterator[Found]:
        """Customer managed keys (the budget and alert topics' keys): a key bills monthly until deleted.
        AWS managed keys are AWS's; a key whose deletion is already scheduled is gone
        (https://docs.aws.amazon.com/kms/latest/APIReference/API_KeyMetadata.html)."""
        kms = self.client("kms")
        for page in kms.get_paginator("list_keys").paginate():
            for key in page.get("Keys", []):
                meta = kms.describe_key(KeyId=key["KeyId"])["KeyMetadata"]
                if meta.get("KeyManager") != "CUSTOMER":
                    continue
                tags = _tag_map(
                    [
                        {"Key": t["TagKey"], "Value": t["TagValue"]}
                        for t in kms.list_resource_tags(KeyId=key["KeyId"]).get("Tags", [])
                    ]
                )
                if not _has_stack(tags, stack):
                    continue
                if meta.get("KeyState") in ("PendingDeletion", "PendingReplicaDeletion"):
                    self.gone.add(meta["Arn"])
                yield Found(meta["Arn"], "kms:key", meta["KeyId"], tags, meta.get("CreationDate"), self.region)

    def budgets(self, stack: str | None) -> Iterator[Found]:
        """The stack's AWS Budgets budget (global, like IAM). DescribeBudgets gives no tags and no ARN;
        the ARN is ``arn:aws:budgets::ACCOUNT:budget/NAME`` and ListTagsForResource takes it
        (https://docs.aws.amazon.com/aws-cost-management/latest/APIReference/API_budgets_ListTagsForResource.html)."""
        budgets = self.client("budgets")
        for page in budgets.get_paginator("describe_budgets").paginate(AccountId=self.account):
            for budget in page.get("Budgets", []):
                arn = f"arn:aws:budgets::{self.account}:budget/{budget['BudgetName']}"
                tags = _tag_map(budgets.list_tags_for_resource(ResourceARN=arn).get("ResourceTags"))
                if _has_stack(tags, stack):
                    yield Found(arn, "budgets:budget", budget["BudgetName"], tags)

    def iam_roles(self, stack: str | None) -> Iterator[Found]:
        iam = self.client("iam")
        for page in iam.get_paginator("list_roles").paginate():
            for role in page["Roles"]:
                if role.get("Path", "/").startswith("/aws-service-role/"):
                    continue  # service-linked roles belong to AWS
                tags = _tag_map(iam.list_role_tags(RoleName=role["RoleName"]).get("Tags"))
                if _has_stack(tags, stack):
                    profiles = role_profile_tags(iam, role["RoleName"])
                    yield Found(
                        role["Arn"], "iam:role", role["RoleName"], tags, role.get("CreateDate"), members=profiles
                    )

    def iam_instance_profiles(self, stack: str | None) -> Iterator[Found]:
        iam = self.client("iam")
        for page in iam.get_paginator("list_instance_profiles").paginate():
            for profile in page["InstanceProfiles"]:
                name = profile["InstanceProfileName"]
                # GetInstanceProfile returns its tags (ListInstanceProfiles does not, in AWS)
                tags = _tag_map(iam.get_instance_profile(InstanceProfileName=name)["InstanceProfile"].get("Tags"))
                if _has_stack(tags, stack):
                    yield Found(profile["Arn"], "iam:instance-profile", name, tags, profile.get("CreateDate"))


def instance_tags(ec2: Any, instance_ids: list[str]) -> dict[str, dict[str, str]]:
    """Each listed instance's tags (an instance already gone is left out). A filter rather than
    ``InstanceIds``, which fails the whole call when one id is no longer known."""
    out: dict[str, dict[str, str]] = {}
    if not instance_ids:
        return out
    pages = ec2.get_paginator("describe_instances")
    for page in pages.paginate(Filters=[{"Name": "instance-id", "Values": instance_ids}]):
        for reservation in page["Reservations"]:
            for inst in reservation["Instances"]:
                if inst["State"]["Name"] not in _GONE_STATES:
                    out[inst["InstanceId"]] = _tag_map(inst.get("Tags"))
    return out


def group_instance_tags(client: Callable[[str], Any], group: dict[str, Any]) -> dict[str, dict[str, str]]:
    """The tags of every instance in an Auto Scaling group (DescribeAutoScalingGroups lists their
    ids, not their tags)."""
    return instance_tags(client("ec2"), [i["InstanceId"] for i in group.get("Instances") or []])


def role_profile_tags(iam: Any, role: str) -> dict[str, dict[str, str]]:
    """The instance profiles that hold ``role``, with their tags (GetInstanceProfile has them)."""
    out: dict[str, dict[str, str]] = {}
    for page in iam.get_paginator("list_instance_profiles_for_role").paginate(RoleName=role):
        for profile in page["InstanceProfiles"]:
            name = profile["InstanceProfileName"]
            out[name] = _tag_map(iam.get_instance_profile(InstanceProfileName=name)["InstanceProfile"].get("Tags"))
    return out


def _merge(known: Found, listed: Found) -> Found:
    return Found(
        known.arn,
        listed.kind,
        listed.ident,
        {**known.tags, **listed.tags},
        listed.created or known.created,
        listed.region or known.region,
        listed.instance_type,
        listed.lifecycle,
        listed.members,
    )


def created_times(client: Callable[[str], Any], found: list[Found]) -> list[Found]:
    """Fill in creation times the listings did not give, for the kinds whose Describe call has one."""
    import dataclasses

    out = []
    buckets: dict[str, dt.datetime] | None = None
    for f in found:
        created = f.created
        if created is None and f.kind == "s3:bucket":
            if buckets is None:
                buckets = {b["Name"]: b["CreationDate"] for b in client("s3").list_buckets().get("Buckets", [])}
            created = buckets.get(f.ident)
        elif created is None and f.kind == "fsx:file-system":
            systems = client("fsx").describe_file_systems(FileSystemIds=[f.ident]).get("FileSystems", [])
            created = systems[0].get("CreationTime") if systems else None
        elif created is None and f.kind == "dynamodb:table":
            table = client("dynamodb").describe_table(TableName=f.ident.split("/")[0])["Table"]
            created = table.get("CreationDateTime")
        out.append(dataclasses.replace(f, created=created) if created is not None else f)
    return out
