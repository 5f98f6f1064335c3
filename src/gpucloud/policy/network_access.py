"""No security group accepts traffic from the whole internet (0.0.0.0/0 or ::/0)."""

from __future__ import annotations

from pulumi_policy import ReportViolation, ResourceValidationArgs

from gpucloud.policy import resource_types as rt
from gpucloud.policy.props import as_list, as_mappings

OPEN_CIDRS = frozenset({"0.0.0.0/0", "::/0"})


def _open_cidrs(*values: object) -> list[str]:
    return sorted({c for value in values for c in as_list(value) if c in OPEN_CIDRS})


def _describe_ports(rule: dict) -> str:
    protocol = rule.get("protocol", rule.get("ipProtocol"))
    if protocol in ("-1", "all", -1):
        return "all traffic"
    low, high = rule.get("fromPort"), rule.get("toPort")
    if isinstance(low, (int, float)) and isinstance(high, (int, float)):
        ports = f"{low:g}" if low == high else f"{low:g}-{high:g}"
        return f"{protocol} {ports}"
    return str(protocol)


def no_open_ingress(args: ResourceValidationArgs, report: ReportViolation) -> None:
    """Inline ingress blocks and standalone ingress rules must not allow 0.0.0.0/0 or ::/0."""
    props = args.props
    found: list[tuple[str, dict]] = []
    if args.resource_type == rt.SECURITY_GROUP:
        for rule in as_mappings(props.get("ingress")):
            for cidr in _open_cidrs(rule.get("cidrBlocks"), rule.get("ipv6CidrBlocks")):
                found.append((cidr, dict(rule)))
    elif args.resource_type == rt.VPC_INGRESS_RULE:
        for cidr in _open_cidrs(props.get("cidrIpv4"), props.get("cidrIpv6")):
            found.append((cidr, dict(props)))
    elif args.resource_type == rt.SECURITY_GROUP_RULE and props.get("type") == "ingress":
        for cidr in _open_cidrs(props.get("cidrBlocks"), props.get("ipv6CidrBlocks")):
            found.append((cidr, dict(props)))
    for cidr, rule in found:
        report(
            f"ingress ({_describe_ports(rule)}) is open to {cidr}; allow only security groups, "
            "prefix lists or private CIDRs (nodes are reached through SSM)",
            None,
        )
