"""Hourly cost of a cluster: pure functions of the node groups, the resources and the catalog prices.

Three views per node group, each at min / desired / max nodes:
- ``on_demand``: every node at the on-demand price (what the cost ceiling is checked against);
- ``spot``: every node at the spot price (spot history in the stack's AZ when ``catalog refresh``
  stored it, else an estimate, and ``spot_source`` says which); none for capacity-block and
  capacity-reservation groups, which cannot run on spot;
- ``as_configured``: what the group pays: spot groups pay on-demand for their ``onDemandBase``
  nodes and spot for the rest; on-demand groups the on-demand price per node; a capacity
  reservation is paid whether used or not (reserved count x on-demand rate at every size, the
  reserved count taken as ``maxNodes``: the group cannot use more than it reserved); a Capacity
  Block likewise, at the block's rate, for the block's whole duration (its fee is paid up front).

Then what the cluster pays per hour besides its nodes (``infrastructure_cost``, from the resources
the program registers): NAT gateway and its public IPv4 address, interface VPC endpoints (per
endpoint per AZ), FSx for Lustre (storage GiB at its throughput tier's rate), the nodes' gp3 root
volumes; the monitor's cost comes from ``monitoring_plan`` and is added to the total.
A price the catalog does not know makes that figure ``None`` (unknown), never zero.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
from collections.abc import Iterable, Mapping, Sequence
from functools import lru_cache
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from gpucloud.catalog import Catalog, InstanceType
from gpucloud.catalog.pricing import NoPrice, Price, hourly_price

SERVICE_PRICES = Path(__file__).resolve().parents[1] / "catalog" / "service_prices.json"
RESERVED = ("capacity-block", "capacity-reservation")


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


NO_FIGURE = NodeCounts(None, None, None)


@dataclasses.dataclass(frozen=True)
class GroupPrices:
    """The unit prices a group is costed at, each saying what kind of price it is (None: not known)."""

    on_demand: Price | None = None
    spot: Price | None = None
    capacity_block: Price | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "on_demand": self.on_demand and self.on_demand.to_json(),
            "spot": self.spot and self.spot.to_json(),
            "capacity_block": self.capacity_block and self.capacity_block.to_json(),
        }


@dataclasses.dataclass(frozen=True)
class GroupCost:
    name: str
    instance_type: str
    capacity_type: str
    on_demand: NodeCounts
    spot: NodeCounts  # NO_FIGURE for reserved capacity: it cannot be bought as spot
    as_configured: NodeCounts
    prices: GroupPrices = GroupPrices()
    note: str = ""  # how as_configured is paid, when it is not "per running node"

    @property
    def has_spot_view(self) -> bool:
        return self.capacity_type not in RESERVED

    @property
    def spot_source(self) -> str | None:
        return self.prices.spot.source if self.prices.spot is not None and self.has_spot_view else None


@dataclasses.dataclass(frozen=True)
class CostLine:
    """Something besides the nodes that costs money by the hour."""

    item: str  # "NAT gateway", "FSx for Lustre", ...
    detail: str  # what is counted, at what rate
    usd_per_hour: NodeCounts
    note: str = ""  # what the hourly figure leaves out (data processed per GB, ...)

    def to_json(self) -> dict[str, Any]:
        return {
            "item": self.item,
            "detail": self.detail,
            "usd_per_hour": self.usd_per_hour.to_json(),
            "note": self.note,
        }


@dataclasses.dataclass(frozen=True)
class CostEstimate:
    groups: list[GroupCost]
    on_demand: NodeCounts
    spot: NodeCounts
    as_configured: NodeCounts
    currency: str = "USD/hour"
    region: str | None = None  # the region the prices are for (None: the catalog's home region)
    prices_as_of: datetime.date | None = None
    infrastructure: list[CostLine] = dataclasses.field(default_factory=list)
    monitoring: float | None = 0.0  # the monitor's USD/hour (monitoring_plan.monitor_cost), same at every size
    warnings: list[str] = dataclasses.field(default_factory=list)  # one line each: prices plan does not have

    @property
    def total(self) -> NodeCounts:
        """Everything the stack pays per hour: the nodes as configured, the infrastructure, the monitor."""
        monitor = NodeCounts(self.monitoring, self.monitoring, self.monitoring)
        return _total([self.as_configured, *(line.usd_per_hour for line in self.infrastructure), monitor])

    def to_json(self) -> dict:
        return {
            "currency": self.currency,
            "region": self.region,
            "prices_as_of": self.prices_as_of.isoformat() if self.prices_as_of else None,
            "on_demand": self.on_demand.to_json(),
            "spot_estimate": self.spot.to_json(),  # null when a group cannot run on spot
            "as_configured": self.as_configured.to_json(),
            "infrastructure": [line.to_json() for line in self.infrastructure],
            "monitoring": self.monitoring,
            "total": self.total.to_json(),
            "warnings": self.warnings,
            "groups": [
                {
                    "name": g.name,
                    "instance_type": g.instance_type,
                    "capacity": g.capacity_type,
                    "on_demand": g.on_demand.to_json(),
                    "spot_estimate": g.spot.to_json() if g.has_spot_view else None,
                    "spot_source": g.spot_source,  # "spot-history" or "spot-estimate"
                    "as_configured": g.as_configured.to_json(),
                    "prices": g.prices.to_json(),
                    "note": g.note,
                }
                for g in self.groups
            ],
        }


def _times(price: float | None, nodes: int) -> float | None:
    if nodes == 0:
        return 0.0
    return None if price is None else round(price * nodes, 4)


def _price_or_none(*args: Any, catalog: Catalog) -> Price | None:
    try:
        return hourly_price(*args, catalog=catalog)
    except NoPrice:
        return None


def group_prices(group: GroupSizing, region: str | None, catalog: Catalog | None, az: str | None) -> GroupPrices:
    """The unit prices of ``group``: the region's (``hourly_price``), or the instance type's own
    fields (the catalog's home region) when no region is given."""
    itype = group.instance_type
    if region is None or catalog is None:
        today = datetime.date.today()
        home = "catalog home region"
        od = itype.on_demand_usd_per_hour
        spot = itype.spot_usd_per_hour
        return GroupPrices(
            on_demand=None if od is None else Price(od, "on-demand", today, home),
            spot=None if spot is None else Price(spot, "spot-estimate", today, home),
        )
    name = itype.name
    return GroupPrices(
        on_demand=_price_or_none(name, region, "on-demand", catalog=catalog),
        spot=_price_or_none(name, region, "spot", az, catalog=catalog),
        capacity_block=(
            _price_or_none(name, region, "capacity-block", az, catalog=catalog)
            if group.capacity_type == "capacity-block"
            else None
        ),
    )


def _usd(price: Price | None) -> float | None:
    return None if price is None else price.usd_per_hour


def _configured(group: GroupSizing, prices: GroupPrices, nodes: int) -> float | None:
    od, spot = _usd(prices.on_demand), _usd(prices.spot)
    if group.capacity_type == "capacity-reservation":
        return _times(od, max(nodes, group.max_nodes))  # paid whether used or not
    if group.capacity_type == "capacity-block":
        return _times(_usd(prices.capacity_block), max(nodes, group.max_nodes))
    if group.capacity_type != "spot":
        return _times(od, nodes)
    base = min(group.on_demand_base, nodes)
    on_demand_part, spot_part = _times(od, base), _times(spot, nodes - base)
    if on_demand_part is None or spot_part is None:
        return None
    return round(on_demand_part + spot_part, 4)


def _counts(fn, group: GroupSizing) -> NodeCounts:
    return NodeCounts(fn(group.min_nodes), fn(group.desired_nodes), fn(group.max_nodes))


def _sum(values: Iterable[float | None]) -> float | None:
    total = 0.0
    for v in values:
        if v is None:
            return None
        total += v
    return round(total, 4)


def _total(rows: Sequence[NodeCounts]) -> NodeCounts:
    return NodeCounts(_sum(r.min for r in rows), _sum(r.desired for r in rows), _sum(r.max for r in rows))


def _reserved_note(group: GroupSizing, prices: GroupPrices) -> str:
    if group.capacity_type == "capacity-reservation":
        return (
            f"capacity reservation: {group.max_nodes} reserved instance(s) (maxNodes) paid at the on-demand rate "
            "whether used or not"
        )
    if group.capacity_type == "capacity-block":
        rate = "rate unknown" if prices.capacity_block is None else f"{prices.capacity_block.usd_per_hour:g} USD/h"
        return (
            f"Capacity Block: {group.max_nodes} instance(s) (maxNodes) at the block rate ({rate}), paid up front for "
            "the block's whole duration (DescribeCapacityBlockOfferings UpfrontFee / DurationHours is your block's)"
        )
    return ""


def group_cost(
    group: GroupSizing, region: str | None = None, catalog: Catalog | None = None, az: str | None = None
) -> GroupCost:
    prices = group_prices(group, region, catalog, az)
    return GroupCost(
        name=group.name,
        instance_type=group.instance_type.name,
        capacity_type=group.capacity_type,
        on_demand=_counts(lambda n: _times(_usd(prices.on_demand), n), group),
        spot=(
            _counts(lambda n: _times(_usd(prices.spot), n), group) if group.capacity_type not in RESERVED else NO_FIGURE
        ),
        as_configured=_counts(lambda n: _configured(group, prices, n), group),
        prices=prices,
        note=_reserved_note(group, prices),
    )


def estimate_cost(
    groups: Iterable[GroupSizing],
    *,
    region: str | None = None,
    catalog: Catalog | None = None,
    availability_zone: str | None = None,
) -> CostEstimate:
    """The nodes' cost. With ``region`` and ``catalog``: that region's prices (``hourly_price``), spot
    in ``availability_zone`` when given; without: the instance types' own (home-region) figures."""
    rows = [group_cost(g, region, catalog, availability_zone) for g in groups]
    warnings = []
    regional = catalog.region_prices(region) if (catalog is not None and region is not None) else None
    if catalog is not None and region is not None and regional is None:
        warnings.append(
            f"no instance prices for {region} in the catalog (priced: {', '.join(catalog.priced_regions)}): node costs "
            f"are unknown; `gpucloud catalog refresh --region {region} --output-file FILE` then `--catalog-file FILE`"
        )
    spot_rows = [r.spot if r.has_spot_view else NO_FIGURE for r in rows]
    return CostEstimate(
        groups=rows,
        on_demand=_total([r.on_demand for r in rows]),
        spot=_total(spot_rows),
        as_configured=_total([r.as_configured for r in rows]),
        region=region,
        prices_as_of=regional.as_of if regional else None,
        warnings=warnings,
    )


# ---------------------------------------------------------------------------------------------
# Everything else that costs money by the hour
# ---------------------------------------------------------------------------------------------


class InfrastructurePrices(BaseModel):
    """The network and storage prices in ``catalog/service_prices.json`` (as-of date and sources inside)."""

    model_config = ConfigDict(extra="ignore", frozen=True)  # the monitor's prices are monitoring_plan's

    as_of: datetime.date
    regions: list[str]
    sources: list[str]
    hours_per_month: float = Field(gt=0)
    ebs_gp3_usd_per_gb_month: float = Field(gt=0)
    nat_gateway_usd_per_hour: float = Field(gt=0)
    nat_gateway_usd_per_gb_processed: float = Field(gt=0)
    public_ipv4_usd_per_hour: float = Field(gt=0)
    vpc_interface_endpoint_usd_per_hour_per_az: float = Field(gt=0)
    vpc_interface_endpoint_usd_per_gb_processed: float = Field(gt=0)
    cross_az_usd_per_gb_each_way: float = Field(gt=0)  # data between Availability Zones of a Region
    fsx_lustre_usd_per_gb_month: dict[str, dict[str, float]]  # deployment type -> MB/s per TiB -> USD


@lru_cache(maxsize=1)
def infrastructure_prices() -> InfrastructurePrices:
    # our own package data (not user input): a broken file is a bug, so a plain error is right
    return InfrastructurePrices.model_validate(json.loads(SERVICE_PRICES.read_text(encoding="utf-8")))


@dataclasses.dataclass(frozen=True)
class RootVolumes:
    """One node group's gp3 root volumes: one per node."""

    group: str
    gib: int
    min_nodes: int
    desired_nodes: int
    max_nodes: int


def _flat(value: float | None) -> NodeCounts:
    rounded = None if value is None else round(value, 4)
    return NodeCounts(rounded, rounded, rounded)


def infrastructure_cost(
    resources: Iterable[tuple[str, Mapping[str, Any]]],
    root_volumes: Sequence[RootVolumes],
    region: str,
    prices: InfrastructurePrices | None = None,
) -> tuple[list[CostLine], list[str]]:
    """Hourly lines for what ``resources`` (type token, inputs) and the nodes' root volumes cost in
    ``region``, and one-line warnings for what has no price. Unknown figures are None, never 0."""
    prices = prices or infrastructure_prices()
    known = region in prices.regions
    warnings = (
        []
        if known
        else [
            f"no network/storage prices for {region} in catalog/service_prices.json (priced: "
            f"{', '.join(prices.regions)}): NAT gateway, endpoints, FSx and EBS costs are unknown"
        ]
    )

    def rate(value: float) -> float | None:
        return value if known else None

    per_month = prices.hours_per_month
    by_type: dict[str, list[Mapping[str, Any]]] = {}
    for type_token, inputs in resources:
        by_type.setdefault(type_token, []).append(inputs)
    lines: list[CostLine] = []

    nats = len(by_type.get("aws:ec2/natGateway:NatGateway", []))
    if nats:
        nat = rate(prices.nat_gateway_usd_per_hour)
        lines.append(
            CostLine(
                "NAT gateway",
                f"{nats} x {prices.nat_gateway_usd_per_hour:g} USD/h",
                _flat(None if nat is None else nats * nat),
                f"plus {prices.nat_gateway_usd_per_gb_processed:g} USD per GB it processes (not included)",
            )
        )
    public_ips = len(by_type.get("aws:ec2/eip:Eip", []))
    if public_ips:
        ip = rate(prices.public_ipv4_usd_per_hour)
        lines.append(
            CostLine(
                "public IPv4 address",
                f"{public_ips} x {prices.public_ipv4_usd_per_hour:g} USD/h (the NAT gateway's Elastic IP)",
                _flat(None if ip is None else public_ips * ip),
            )
        )
    interface = [
        i for i in by_type.get("aws:ec2/vpcEndpoint:VpcEndpoint", []) if i.get("vpcEndpointType") == "Interface"
    ]
    if interface:
        zones = sum(max(1, len(i.get("subnetIds") or [])) for i in interface)  # one endpoint interface per AZ
        per_az = rate(prices.vpc_interface_endpoint_usd_per_hour_per_az)
        lines.append(
            CostLine(
                "interface VPC endpoints",
                f"{len(interface)} endpoints, {zones} endpoint-AZs x {prices.vpc_interface_endpoint_usd_per_hour_per_az:g} USD/h",
                _flat(None if per_az is None else zones * per_az),
                f"plus {prices.vpc_interface_endpoint_usd_per_gb_processed:g} USD per GB processed (not included)",
            )
        )
    for fs in by_type.get("aws:fsx/lustreFileSystem:LustreFileSystem", []):
        deployment = str(fs.get("deploymentType") or "")
        raw = fs.get("perUnitStorageThroughput")  # the engine hands numbers back as floats: 250.0
        throughput = f"{raw:g}" if isinstance(raw, int | float) else str(raw or "")
        gib = int(fs.get("storageCapacity") or 0)
        per_gb = prices.fsx_lustre_usd_per_gb_month.get(deployment, {}).get(throughput)
        if per_gb is None:
            warnings.append(
                f"no FSx for Lustre price for {deployment} at {throughput} MB/s/TiB in catalog/service_prices.json; "
                "its cost is unknown"
            )
        hourly = None if per_gb is None or not known else gib * per_gb / per_month
        lines.append(
            CostLine(
                "FSx for Lustre",
                f"{gib:,} GiB {deployment} at {throughput} MB/s/TiB x {per_gb if per_gb is not None else '?'} USD/GB-month",
                _flat(hourly),
                "backups and cross-AZ transfer not included",
            )
        )
    if root_volumes:
        gp3 = rate(prices.ebs_gp3_usd_per_gb_month)
        per_gib_hour = None if gp3 is None else gp3 / per_month

        def at(count: str) -> float | None:
            if per_gib_hour is None:
                return None
            return round(sum(v.gib * getattr(v, count) for v in root_volumes) * per_gib_hour, 4)

        sizes = ", ".join(f"{v.group} {v.gib} GiB" for v in root_volumes)
        lines.append(
            CostLine(
                "EBS gp3 root volumes",
                f"one per node ({sizes}) x {prices.ebs_gp3_usd_per_gb_month:g} USD/GB-month",
                NodeCounts(at("min_nodes"), at("desired_nodes"), at("max_nodes")),
            )
        )
    return lines, warnings
