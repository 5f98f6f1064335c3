"""Carving the VPC CIDR into subnets: a pure function.

One private subnet for the nodes (EFA and a cluster placement group need a single AZ), large
because every ENA interface takes an address and legacy-layout p5 nodes take 32; one small public
subnet that only holds the NAT gateway.
"""

from __future__ import annotations

import dataclasses
import ipaddress


@dataclasses.dataclass(frozen=True)
class SubnetPlan:
    private: str
    public: str


def plan_subnets(vpc_cidr: str) -> SubnetPlan:
    vpc = ipaddress.IPv4Network(vpc_cidr, strict=True)
    lower, upper = vpc.subnets(prefixlen_diff=1)
    # /20 for the NAT subnet in a /16 (4096 addresses is plenty); never smaller than /28 (AWS minimum)
    public_prefix = min(max(vpc.prefixlen + 4, 20), 28)
    public = next(upper.subnets(new_prefix=public_prefix))
    return SubnetPlan(private=str(lower), public=str(public))
