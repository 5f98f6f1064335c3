"""What one instance hour costs: ``hourly_price(instance_type, region, lifecycle, az, at)``.

The single place every dollar figure of an instance comes from (``plan``, per-job cost, reports), so
each figure says which kind of price it is:

- ``on-demand``: the catalog's on-demand price for the region (one figure per catalog as-of date);
- ``spot-history``: a ``DescribeSpotPriceHistory`` point in force at ``at`` (``catalog refresh`` stores
  them per AZ; with no AZ, the median over the region's AZs);
- ``spot-estimate``: no spot history is known for the type and region: a fixed share of on-demand,
  which must be shown as an estimate wherever it is shown;
- ``capacity-block``: a Capacity Block's effective hourly rate (its up-front fee over its hours).

Why not gpuhunt (https://pypi.org/project/gpuhunt/, dstack's offer catalog)? It lists on-demand and
spot offers per region for GPU instances, but it has no spot price per AZ or over time, no Capacity
Block rates, and nothing for the non-instance items plan prices (NAT gateway, FSx, endpoints, EBS);
and it fetches its catalog from dstack's servers at run time, while ``plan`` must work offline.
The catalog therefore keeps its own dated, sourced figures and refreshes them from AWS's own APIs.
"""

from __future__ import annotations

import dataclasses
import datetime
import statistics
from typing import Literal

from gpucloud.catalog import Catalog, SpotPoint, TypePrices, load_catalog
from gpucloud.errors import UserError

PriceSource = Literal["on-demand", "spot-history", "spot-estimate", "capacity-block"]
LIFECYCLES = ("on-demand", "spot", "capacity-block")


@dataclasses.dataclass(frozen=True)
class Price:
    usd_per_hour: float
    source: PriceSource
    as_of: datetime.date  # the catalog's as-of date, or the spot history point's date
    region: str
    az: str | None = None  # the AZ a spot-history price is for; None for region-wide figures
    detail: str = ""  # where the figure comes from (URL, API call), for people reading a report

    @property
    def is_estimate(self) -> bool:
        return self.source == "spot-estimate"

    def to_json(self) -> dict[str, object]:
        return {
            "usd_per_hour": self.usd_per_hour,
            "source": self.source,
            "as_of": self.as_of.isoformat(),
            "region": self.region,
            "az": self.az,
            "detail": self.detail,
        }


class NoPrice(UserError):
    """The catalog has no price for this type, region and lifecycle (one line, names what it has)."""


def _point_at(points: list[SpotPoint], at: datetime.datetime | None) -> SpotPoint | None:
    """The point in force at ``at`` (the latest one at or before it); the latest point when ``at`` is None."""
    chosen = None
    for point in sorted(points, key=lambda p: p.at):
        if at is not None and point.at > at:
            break
        chosen = point
    return chosen


def _aware(at: datetime.datetime | None) -> datetime.datetime | None:
    if at is None or at.tzinfo is not None:
        return at
    return at.replace(tzinfo=datetime.timezone.utc)  # naive times are taken as UTC, as AWS reports them


def _spot(prices: TypePrices, instance_type: str, region: str, az: str | None, at: datetime.datetime | None, as_of):
    if az is not None and az in prices.spot_history:
        point = _point_at(prices.spot_history[az], at)
        if point is not None:
            return Price(
                point.usd_per_hour,
                "spot-history",
                point.at.date(),
                region,
                az,
                "ec2:DescribeSpotPriceHistory Linux/UNIX",
            )
    if az is None and prices.spot_history:
        in_force = [p for points in prices.spot_history.values() if (p := _point_at(points, at)) is not None]
        if in_force:
            return Price(
                round(statistics.median(p.usd_per_hour for p in in_force), 4),
                "spot-history",
                max(p.at for p in in_force).date(),
                region,
                None,
                f"median over {len(in_force)} AZs of ec2:DescribeSpotPriceHistory Linux/UNIX",
            )
    if prices.spot_estimate_usd_per_hour is None:
        raise NoPrice(f"no spot price or estimate for {instance_type} in {region}")
    return Price(
        prices.spot_estimate_usd_per_hour,
        "spot-estimate",
        as_of,
        region,
        az,
        "estimate: no spot price history known; about 40% of on-demand",
    )


def hourly_price(
    instance_type: str,
    region: str,
    lifecycle: str,
    az: str | None = None,
    at: datetime.datetime | None = None,
    *,
    catalog: Catalog | None = None,
) -> Price:
    """The hourly USD price of one ``instance_type`` instance in ``region``.

    ``lifecycle`` is ``on-demand``, ``spot`` or ``capacity-block``. For spot, ``az`` picks that AZ's
    history (else the median over AZs) and ``at`` the point in force then (else the latest); with no
    history the catalog's estimate is returned with source ``spot-estimate``. Raises ``NoPrice``
    (a one-line UserError) when the catalog has no figure.
    """
    if lifecycle not in LIFECYCLES:
        raise UserError(f"unknown lifecycle {lifecycle!r}; allowed: {', '.join(LIFECYCLES)}")
    catalog = catalog or load_catalog()
    regional = catalog.region_prices(region)
    if regional is None:
        raise NoPrice(
            f"no prices for region {region} in the catalog; priced regions: {', '.join(catalog.priced_regions)}"
        )
    prices = regional.instance_types.get(instance_type)
    if prices is None:
        raise NoPrice(f"no prices for {instance_type} in {region} in the catalog")
    if lifecycle == "spot":
        return _spot(prices, instance_type, region, az, _aware(at), regional.as_of)
    if lifecycle == "capacity-block":
        if prices.capacity_block_usd_per_hour is None:
            raise NoPrice(f"no Capacity Block rate for {instance_type} in {region}")
        return Price(
            prices.capacity_block_usd_per_hour,
            "capacity-block",
            regional.as_of,
            region,
            az,
            prices.capacity_block_source,
        )
    if prices.on_demand_usd_per_hour is None:
        raise NoPrice(f"no on-demand price for {instance_type} in {region}")
    return Price(prices.on_demand_usd_per_hour, "on-demand", regional.as_of, region, az, prices.on_demand_source)


def spot_price_changes(
    instance_type: str,
    region: str,
    az: str | None,
    after: datetime.datetime,
    before: datetime.datetime,
    *,
    catalog: Catalog | None = None,
) -> list[datetime.datetime]:
    """When the spot price ``hourly_price`` gives changes strictly between ``after`` and ``before``:
    the times of the history points recorded there (that AZ's; with no AZ, every AZ's, since the
    median over them moves with any). None known (no history, an AZ without it): ``[]``."""
    catalog = catalog or load_catalog()
    regional = catalog.region_prices(region)
    prices = regional.instance_types.get(instance_type) if regional is not None else None
    if prices is None or not prices.spot_history:
        return []
    if az is not None:
        series = [prices.spot_history[az]] if az in prices.spot_history else []
    else:
        series = list(prices.spot_history.values())
    lo, hi = _aware(after), _aware(before)
    assert lo is not None and hi is not None
    return sorted({p.at for points in series for p in points if lo < p.at < hi})
