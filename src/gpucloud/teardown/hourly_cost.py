"""What a found resource costs an hour while it is left running, from gpucloud's catalog. Pure.

Only what the catalog prices: instances (``catalog.pricing.hourly_price``, the same figures ``plan``
uses) and the monitor instance types (``catalog/service_prices.json``). Everything else is None
(unknown), never zero: FSx, NAT gateways, public IPv4 addresses and interface endpoints bill by the
hour too, but the catalog carries no price for them.
"""

from __future__ import annotations

import json
from functools import cache
from importlib import resources

from gpucloud.catalog import Catalog
from gpucloud.teardown.model import Found


@cache
def _service_prices() -> dict:
    text = resources.files("gpucloud.catalog").joinpath("service_prices.json").read_text(encoding="utf-8")
    return dict(json.loads(text))


def hourly_usd(found: Found, region: str, catalog: Catalog | None = None) -> float | None:
    if found.kind != "ec2:instance" or found.instance_type is None:
        return None
    from gpucloud.catalog.pricing import hourly_price
    from gpucloud.errors import UserError

    try:
        return hourly_price(found.instance_type, region, found.lifecycle or "on-demand", catalog=catalog).usd_per_hour
    except UserError:  # NoPrice: not a GPU type the catalog knows; the monitor's types are priced apart
        price = _service_prices().get("monitor_instances_usd_per_hour", {}).get(found.instance_type)
        return float(price) if price is not None else None
