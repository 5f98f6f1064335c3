"""EFA needs a security group that allows all traffic to and from itself.

AWS: "An EFA requires a security group that allows all inbound and outbound traffic to and from the
security group itself." Like ParallelCluster's ``EfaSecurityGroupValidator``, only a rule for all
protocols (``-1``) whose peer is the group itself counts; a CIDR "allow all" does not. The rule may
be inline in the group or a separate ``ec2.SecurityGroupRule`` / ``vpc.SecurityGroup*Rule``
resource, so this is a stack policy: it looks across resources.
"""

from __future__ import annotations

from collections.abc import Sequence

from pulumi_policy import PolicyResource, ReportViolation, StackValidationArgs

from gpucloud.policy import resource_types as rt
from gpucloud.policy.props import as_mappings, is_true
from gpucloud.policy.references import identity_values, referenced_resources, references

EFA_INTERFACE_TYPES = frozenset({"efa", "efa-only"})
ALL_PROTOCOLS = frozenset({"-1", "all"})


def _all_protocols(value: object) -> bool:
    return (isinstance(value, str) and value in ALL_PROTOCOLS) or value == -1


def _inline_self_rule(group: PolicyResource, direction: str) -> bool:
    own = identity_values(group)
    for rule in as_mappings(group.props.get(direction)):
        peers = {g for g in rule.get("securityGroups") or [] if isinstance(g, str)}
        if _all_protocols(rule.get("protocol")) and (is_true(rule.get("self")) or own & peers):
            return True
    return False


def _standalone_self_rule(group: PolicyResource, direction: str, resources: Sequence[PolicyResource]) -> bool:
    vpc_type = rt.VPC_INGRESS_RULE if direction == "ingress" else rt.VPC_EGRESS_RULE
    for rule in resources:
        if rule.resource_type == vpc_type:
            if (
                _all_protocols(rule.props.get("ipProtocol"))
                and references(rule, "securityGroupId", group)
                and references(rule, "referencedSecurityGroupId", group)
            ):
                return True
        elif rule.resource_type == rt.SECURITY_GROUP_RULE and rule.props.get("type") == direction:
            if (
                _all_protocols(rule.props.get("protocol"))
                and references(rule, "securityGroupId", group)
                and (is_true(rule.props.get("self")) or references(rule, "sourceSecurityGroupId", group))
            ):
                return True
    return False


def has_self_rule(group: PolicyResource, direction: str, resources: Sequence[PolicyResource]) -> bool:
    """Whether ``group`` allows all traffic from (ingress) or to (egress) itself."""
    return _inline_self_rule(group, direction) or _standalone_self_rule(group, direction, resources)


def efa_groups_of(template: PolicyResource, groups: Sequence[PolicyResource]) -> tuple[list[PolicyResource], bool]:
    """The stack's security groups on ``template``'s EFA interfaces, and whether it has EFA interfaces."""
    efa_nics = [
        nic
        for nic in as_mappings(template.props.get("networkInterfaces"))
        if nic.get("interfaceType") in EFA_INTERFACE_TYPES
    ]
    found: dict[str, PolicyResource] = {}
    for nic in efa_nics:
        named = nic.get("securityGroups") or []
        for group in referenced_resources(template, "networkInterfaces", groups, value=named) if named else []:
            found[group.urn] = group
    return list(found.values()), bool(efa_nics)


def efa_interfaces_without_groups(template: PolicyResource) -> list[str]:
    """``card N`` labels of EFA interfaces that name no security group at all."""
    return [
        f"card {nic.get('networkCardIndex', 0):g}"
        for nic in as_mappings(template.props.get("networkInterfaces"))
        if nic.get("interfaceType") in EFA_INTERFACE_TYPES and not nic.get("securityGroups")
    ]


def efa_security_group_self_rules(args: StackValidationArgs, report: ReportViolation) -> None:
    resources = list(args.resources)
    groups = [r for r in resources if r.resource_type == rt.SECURITY_GROUP]
    checked: set[str] = set()
    for template in (r for r in resources if r.resource_type == rt.LAUNCH_TEMPLATE):
        efa_groups, has_efa = efa_groups_of(template, groups)
        if not has_efa:
            continue
        if bare := efa_interfaces_without_groups(template):
            report(
                f"launch template {template.name!r}: EFA interfaces on {', '.join(bare)} have no security "
                "groups; each needs the EFA security group",
                template.urn,
            )
        if not efa_groups:
            report(
                f"launch template {template.name!r} has EFA interfaces but none of their security groups "
                "is created in this stack, so their self-referencing rules cannot be verified; put the "
                "stack's EFA security group on every EFA interface",
                template.urn,
            )
            continue
        for group in efa_groups:
            if group.urn in checked:
                continue
            checked.add(group.urn)
            missing = [d for d in ("ingress", "egress") if not has_self_rule(group, d, resources)]
            if missing:
                report(
                    f"security group {group.name!r} is used by EFA interfaces of {template.name!r} but has no "
                    f"all-traffic (protocol -1) {' or '.join(missing)} rule referencing itself; EFA needs both",
                    group.urn,
                )
