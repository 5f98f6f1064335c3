"""Hourly cost of a cluster: a pure function of the node groups and the catalog prices.

Three views per group, each at min / desired / max nodes:
- ``on_demand``: every node at the on-demand price (what the cost ceiling is checked against);
- ``spot``: every node at the estimated spot price;
- ``as_configured``: how the group actually buys: spot groups pay on-demand for their
  ``onDemandBase`` nodes and spot for the rest; on-demand, capacity-block and capacity-reservation
  groups pay on-demand (a capacity block's fee is paid up front and is not included).
A price the catalog does not know makes that figure ``None`` (unknown), never zero.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable

from gpucloud.catalog import InstanceType


@dataclasses.dataclass(frozen=True)
class GroupSizing:
    name: str
    instance_type: InstanceType
    capacity_type: str
    min_nodes: int
    desired_nodes: int
    max_nodes: int
    on_demand_base: int = 0


@dataclasses.dataclass(frozen=True)
class NodeCounts:
    min: float | None
    desired: float | None
    max: float | None

    def to_json(self) -> dict[str, float | None]:
        return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True)
class GroupCost:
    name: str
    instance_type: str
    capacity_type: str
    on_demand: NodeCounts
    spot: NodeCounts
    as_configured: NodeCounts


@dataclasses.dataclass(frozen=True)
class CostEstimate:
    groups: list[GroupCost]
    on_demand: NodeCounts
    spot: NodeCounts
    as_configured: NodeCounts
    currency: str = "USD/hour"

    def to_json(self) -> dict:
        return {
            "currency": self.currency,
            "on_demand": self.on_demand.to_json(),
            "spot_estimate": self.spot.to_json(),
            "as_configured": self.as_configured.to_json(),
            "groups": [
                {
                    "name": g.name,
                    "instance_type": g.instance_type,
                    "capacity": g.capacity_type,
                    "on_demand": g.on_demand.to_json(),
                    "spot_estimate": g.spot.to_json(),
                    "as_configured": g.as_configured.to_json(),
                }
                for g in self.groups
            ],
        }


def _times(price: float | None, nodes: int) -> float | None:
    if nodes == 0:
        return 0.0
    return None if price is None else round(price * nodes, 4)


def _configured(group: GroupSizing, nodes: int) -> float | None:
    od, spot = group.instance_type.on_demand_usd_per_hour, group.instance_type.spot_usd_per_hour
    if group.capacity_type != "spot":
        return _times(od, nodes)
    base = min(group.on_demand_base, nodes)
    on_demand_part, spot_part = _times(od, base), _times(spot, nodes - base)
    if on_demand_part is None or spot_part is None:
        return None
    return round(on_demand_part + spot_part, 4)


def _counts(fn, group: GroupSizing) -> NodeCounts:
    return NodeCounts(fn(group, group.min_nodes), fn(group, group.desired_nodes), fn(group, group.max_nodes))


def _sum(values: Iterable[float | None]) -> float | None:
    total = 0.0
    for v in values:
        if v is None:
            return None
        total += v
    return round(total, 4)


def _total(rows: list[NodeCounts]) -> NodeCounts:
    return NodeCounts(_sum(r.min for r in rows), _sum(r.desired for r in rows), _sum(r.max for r in rows))


def estimate_cost(groups: Iterable[GroupSizing]) -> CostEstimate:
    rows = [
        GroupCost(
            name=g.name,
            instance_type=g.instance_type.name,
            capacity_type=g.capacity_type,
            on_demand=_counts(lambda gr, n: _times(gr.instance_type.on_demand_usd_per_hour, n), g),
            spot=_counts(lambda gr, n: _times(gr.instance_type.spot_usd_per_hour, n), g),
            as_configured=_counts(_configured, g),
        )
        for g in groups
    ]
    return CostEstimate(
        groups=rows,
        on_demand=_total([r.on_demand for r in rows]),
        spot=_total([r.spot for r in rows]),
        as_configured=_total([r.as_configured for r in rows]),
    )
