"""A group's instance types and zones as launch templates and subnets: pure functions.

Several instance types (spot groups): each type gets the EFA interface layout of its own catalog
entry, and types whose layouts are the same share a launch template. The group's mixed instances
policy lists every type as an override with its weight; a type on another template than the
primary names that template in its override (AWS: "Use multiple launch templates",
https://docs.aws.amazon.com/autoscaling/ec2/userguide/ec2-auto-scaling-mixed-instances-groups-launch-template-overrides.html).

Zones: a group with EFA or a cluster placement group stays in one zone (EFA traffic does not cross
zones, a cluster placement group lies in one); other groups spread over the cluster's zones, which
gives the spot allocation more pools to choose from.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from gpucloud.catalog import Catalog, load_catalog
from gpucloud.catalog import InstanceType as CatalogType
from gpucloud.cluster.efa_layout import EfaLayoutSummary, NicPlan, plan_network_interfaces, summarize
from gpucloud.spec.model import ClusterSpec, NodeGroup


@dataclasses.dataclass(frozen=True)
class TypeChoicePlan:
    instance_type: CatalogType
    weight: int
    nics: tuple[NicPlan, ...]
    efa_layout: EfaLayoutSummary


@dataclasses.dataclass(frozen=True)
class TemplatePlan:
    """One launch template: the instance types that share its network interfaces."""

    choices: tuple[TypeChoicePlan, ...]

    @property
    def nics(self) -> tuple[NicPlan, ...]:
        return self.choices[0].nics

    @property
    def instance_type(self) -> str:
        """The template's own instance type (overrides name the others)."""
        return self.choices[0].instance_type.name

    @property
    def efa_interfaces(self) -> int:
        return self.choices[0].efa_layout.efa_interfaces


def plan_instance_mix(group: NodeGroup, efa: bool, catalog: Catalog | None = None) -> list[TypeChoicePlan]:
    """Every instance type of the group with its weight and its own interface layout."""
    catalog = catalog or load_catalog()
    plans = []
    for choice in group.instance_mix:
        itype = catalog.instance_types[choice.instance_type]
        nics = plan_network_interfaces(itype, efa, group.efa.layout)
        plans.append(TypeChoicePlan(itype, choice.weight, tuple(nics), summarize(itype, nics, group.efa.layout)))
    return plans


def plan_templates(mix: Sequence[TypeChoicePlan]) -> list[TemplatePlan]:
    """Types grouped by interface layout, in first-seen order: the primary type's template first."""
    by_layout: dict[tuple[NicPlan, ...], list[TypeChoicePlan]] = {}
    for choice in mix:
        by_layout.setdefault(choice.nics, []).append(choice)
    return [TemplatePlan(tuple(choices)) for choices in by_layout.values()]


def cluster_zone_count(spec: ClusterSpec) -> int:
    """How many node subnets the cluster has: its zones (new VPC) or the given subnets."""
    if spec.network.existing:
        return max(1, len(spec.network.subnet_ids))
    return max(1, len(spec.availability_zones))


def group_zone_indices(spec: ClusterSpec, group: NodeGroup, single_zone: bool) -> list[int]:
    """Which of the cluster's node subnets the group launches in (indices, in zone order)."""
    count = cluster_zone_count(spec)
    if group.availability_zones is not None and not spec.network.existing:
        zones = list(spec.availability_zones)
        return [zones.index(zone) for zone in group.availability_zones]
    return [0] if single_zone else list(range(count))
