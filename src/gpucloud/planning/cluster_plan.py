"""The pure plan of a cluster: per node group, the instance type, EFA decision, NIC layout and
placement; and the cost. Used by the program (to build resources) and by ``gpucloud plan`` (to
print the summary), so both always agree. No Pulumi import here.
"""

from __future__ import annotations

import dataclasses
import posixpath

from gpucloud.catalog import Catalog, InstanceType, load_catalog
from gpucloud.cluster.efa_layout import EfaLayoutSummary, NicPlan, plan_network_interfaces, summarize
from gpucloud.cluster.emergency_save import GIB, FsxTier, Node, SaveEstimate, cluster_tiers, estimate, fastest_durable
from gpucloud.cluster.hourly_cost import CostEstimate, estimate_cost
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
    emergency_save: EmergencySavePlan


@dataclasses.dataclass(frozen=True)
class EmergencySavePlan:
    """Per tier, how a job on all of the group's nodes saves within a spot notice."""

    node_group: str
    nodes: int
    expected_gib: float | None  # gpucloud:expectedCheckpointGiB (the group's, else the stack's)
    tiers: list[SaveEstimate]  # every tier the cluster has, with the expected size (0 when unset)
    fsx_path: str | None = None  # the FSx directory linked to the bucket, when the stack has FSx

    @property
    def chosen(self) -> SaveEstimate | None:
        """The fastest durable tier."""
        return fastest_durable(self.tiers)

    @property
    def faster_than_default(self) -> SaveEstimate | None:
        """The fastest durable tier when it is not the bucket, which a job without --checkpoint-uri
        uses (checkpoint/placement.py: S3 scales with the job's nodes, so it wins for every shipped
        stack; a large, fast FSx can beat it for a few nodes)."""
        chosen = self.chosen
        return chosen if chosen is not None and chosen.tier != "s3" else None

    @property
    def misses(self) -> list[SaveEstimate]:
        """Durable tiers the expected checkpoint does not fit through (empty when no size is set)."""
        if self.expected_gib is None:
            return []
        return [e for e in self.tiers if e.durable and not e.fits]

    def to_json(self) -> dict[str, object]:
        chosen = self.chosen
        known = self.expected_gib is not None
        return {
            "node_group": self.node_group,
            "nodes": self.nodes,
            "expected_gib": self.expected_gib,
            "tier": chosen.tier if chosen else None,
            "seconds": round(chosen.seconds, 1) if chosen and known else None,
            "max_gib": round(chosen.max_gib, 1) if chosen else None,
            "fits": chosen.fits if chosen and known else None,
            "default_tier": "s3",  # what a job without --checkpoint-uri writes to
            "tiers": [{**e.to_json(), **({} if known else {"seconds": None, "fits": None})} for e in self.tiers],
        }


def plan_emergency_save(spec: ClusterSpec, group: NodeGroup, itype: InstanceType) -> EmergencySavePlan:
    """The emergency-save model for a job on all ``maxNodes`` of the group (they write at once)."""
    fsx = spec.storage.fsx
    node = Node(itype.name, itype.nvme_disks if spec.storage.nvme_scratch else 0)
    tiers = cluster_tiers(FsxTier(fsx.size_gib, fsx.throughput_per_tib) if fsx else None, node)
    expected = group.expected_checkpoint_gib
    if expected is None:
        expected = spec.expected_checkpoint_gib
    nodes = max(1, group.max_nodes)
    state = int((expected or 0) * GIB)
    fsx_path = posixpath.join(fsx.mount_path, fsx.link_path.lstrip("/")) if fsx else None
    return EmergencySavePlan(
        group.name, nodes, expected, [estimate(state, nodes, node, t) for t in tiers], fsx_path=fsx_path
    )


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
                emergency_save=plan_emergency_save(spec, group, itype),
            )
        )
    cost = estimate_cost(  # the stack's region's prices, spot in its AZ when the catalog has that history
        (sizing_for(g.group, g.instance_type) for g in groups),
        region=spec.region,
        catalog=catalog,
        availability_zone=spec.availability_zone,
    )
    return ClusterPlan(groups=groups, cost=cost)
