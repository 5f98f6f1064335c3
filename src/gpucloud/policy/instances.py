"""Node-level rules: IMDSv2 only, no public IP addresses on nodes, a placement group in one zone."""

from __future__ import annotations

from pulumi_policy import ReportViolation, ResourceValidationArgs

from gpucloud.policy import resource_types as rt
from gpucloud.policy.props import as_mappings, get_path, is_true

# where each resource type keeps its instance metadata options
_METADATA_OPTIONS_KEY = {
    rt.LAUNCH_TEMPLATE: "metadataOptions",
    rt.INSTANCE: "metadataOptions",
    rt.IMAGE_BUILDER_INFRASTRUCTURE: "instanceMetadataOptions",
}


def imdsv2_required(args: ResourceValidationArgs, report: ReportViolation) -> None:
    """Instances must use session tokens for IMDS: a stolen SSRF GET cannot read role credentials."""
    key = _METADATA_OPTIONS_KEY.get(args.resource_type)
    if key is None:
        return
    tokens = get_path(args.props, key, "httpTokens")
    if tokens != "required":
        report(f"{key}.httpTokens is {tokens!r}; it must be 'required' (IMDSv2 only)", None)


def no_public_ips(args: ResourceValidationArgs, report: ReportViolation) -> None:
    """Nodes live in private subnets and are reached through SSM, never through a public address."""
    if args.resource_type == rt.LAUNCH_TEMPLATE:
        for nic in as_mappings(args.props.get("networkInterfaces")):
            if is_true(nic.get("associatePublicIpAddress")):
                card = nic.get("networkCardIndex", 0)
                device = nic.get("deviceIndex", 0)
                report(
                    f"networkInterfaces (card {card:g}, device {device:g}) sets associatePublicIpAddress "
                    "'true'; nodes must not get public IPs (omit it or set 'false')",
                    None,
                )
    elif args.resource_type == rt.INSTANCE:
        if is_true(args.props.get("associatePublicIpAddress")):
            report("associatePublicIpAddress is true; nodes must not get public IPs (omit it or set false)", None)
    elif args.resource_type == rt.SUBNET:
        if is_true(args.props.get("mapPublicIpOnLaunch")):
            report("mapPublicIpOnLaunch is true; subnets must not hand out public IPs (omit it or set false)", None)


def placement_group_in_one_zone(args: ResourceValidationArgs, report: ReportViolation) -> None:
    """A cluster placement group lies in one Availability Zone, and EFA groups use one (EFA traffic
    does not cross zones): an autoscaling group with a placement group gets exactly one subnet.
    https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/placement-strategies.html#placement-groups-cluster"""
    if args.resource_type != rt.AUTOSCALING_GROUP or not args.props.get("placementGroup"):
        return
    subnets = [s for s in (args.props.get("vpcZoneIdentifiers") or []) if isinstance(s, str)]
    if len(subnets) != 1:
        report(
            f"uses placement group {args.props.get('placementGroup')!r} with {len(subnets)} subnets; a cluster "
            "placement group lies in one Availability Zone: give the group exactly one subnet",
            None,
        )
