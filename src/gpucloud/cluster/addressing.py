"""Carving the VPC CIDR into subnets: a pure function.

One private node subnet per Availability Zone, large because every ENA interface takes an address
and legacy-layout p5 nodes take 32; one small public subnet per zone that only holds that zone's
NAT gateway (the first zone's is where the single one was, so its address never moves).

The first zone's subnet is the lower half of the VPC (EFA groups, placement groups and FSx live
there; a one-zone stack has only it, so its addresses never move when zones are added). Further
zones get one eighth of the VPC each, from the upper half, beside the NAT subnet: up to
``MAX_ZONES`` zones.
"""

from __future__ import annotations

import dataclasses
import ipaddress

MAX_ZONES = 4  # the first zone's half plus three eighths of the upper half (its first eighth holds the NAT subnet)


@dataclasses.dataclass(frozen=True)
class SubnetPlan:
    private: str  # the first zone's node subnet
    public: str  # the first zone's NAT subnet
    more_private: tuple[str, ...] = ()  # node subnets of the further zones, in zone order
    more_public: tuple[str, ...] = ()  # NAT subnets of the further zones, in zone order

    @property
    def node_subnets(self) -> tuple[str, ...]:
        return (self.private, *self.more_private)

    @property
    def public_subnets(self) -> tuple[str, ...]:
        return (self.public, *self.more_public)


def plan_subnets(vpc_cidr: str, zones: int = 1) -> SubnetPlan:
    if not 1 <= zones <= MAX_ZONES:
        raise ValueError(f"{zones} zones: a VPC is carved into 1 to {MAX_ZONES} node subnets")
    vpc = ipaddress.IPv4Network(vpc_cidr, strict=True)
    lower, upper = vpc.subnets(prefixlen_diff=1)
    # /20 for the NAT subnet in a /16 (4096 addresses is plenty); never smaller than /28 (AWS minimum)
    public_prefix = min(max(vpc.prefixlen + 4, 20), 28)
    eighths = list(upper.subnets(prefixlen_diff=2))  # the first one holds the NAT subnets
    first, rest = list(eighths[0].subnets(new_prefix=public_prefix))[:2]  # the first zone's, as ever
    others = list(rest.subnets(new_prefix=min(public_prefix + 2, 28))) if rest.prefixlen < 28 else [rest]
    publics = [first, *others]
    if len(publics) < zones:
        raise ValueError(f"{vpc_cidr} is too small for {zones} zones' NAT subnets (a /28 each)")
    more = tuple(str(net) for net in eighths[1:zones])
    return SubnetPlan(
        private=str(lower),
        public=str(publics[0]),
        more_private=more,
        more_public=tuple(str(net) for net in publics[1:zones]),
    )
