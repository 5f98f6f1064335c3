"""The pure plan of a cluster: per node group, the instance type, EFA decision, NIC layout and
placement; and the cost. Used by the program (to build resources) and by ``gpucloud plan`` (to
print the summary), so both always agree. No Pulumi import here.
"""

from __future__ import annotations

import dataclasses

from gpucloud.catalog import Catalog, InstanceType, load_catalog
from gpucloud.infra.cost import CostEstimate, estimate_cost
from gpucloud.infra.efa_layout import EfaLayoutSummary, NicPlan, plan_network_interfaces, summarize
from gpucloud.spec.decisions import efa_enabled, uses_placement_group
from gpucloud.spec.model import ClusterSpec, NodeGroup
from gpucloud.spec.rules import sizing_for


@dataclasses.dataclass(frozen=True)
class GroupPlan:
    group: NodeGroup
    instance_type: InstanceType
    efa: bool
    nics: list[NicPlan]
    placement_group: bool
    efa_layout: EfaLayoutSummary


@dataclasses.dataclass(frozen=True)
class ClusterPlan:
    groups: list[GroupPlan]
    cost: CostEstimate


def plan_cluster(spec: ClusterSpec, catalog: Catalog | None = None) -> ClusterPlan:
    catalog = catalog or load_catalog()
    groups = []
    for group in spec.node_groups:
        itype = catalog.instance_types[group.instance_type]
        efa = efa_enabled(group, itype)
        nics = plan_network_interfaces(itype, efa, group.efa.layout)
        groups.append(
            GroupPlan(
                group=group,
                instance_type=itype,
                efa=efa,
                nics=nics,
                placement_group=uses_placement_group(group, itype),
                efa_layout=summarize(itype, nics, group.efa.layout),
            )
        )
    cost = estimate_cost(sizing_for(g.group, g.instance_type) for g in groups)
    return ClusterPlan(groups=groups, cost=cost)
