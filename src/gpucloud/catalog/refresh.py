"""Rebuild the instance catalog from AWS: DescribeInstanceTypes, the Pricing API, spot price history.

Parsing is pure (API response dicts -> catalog models) and kept apart from the thin AWS calls, so
the same functions are tested with botocore Stubber responses and used against real AWS:

- ``ec2:DescribeInstanceTypes`` (paginated, filtered by ``instance-type`` so a type the region does
  not offer is simply absent instead of failing the whole call) gives GPUs, vCPU, memory, instance
  store, network cards, EFA and placement/usage-class support, the fields ParallelCluster reads.
- ``pricing:GetProducts`` (the Pricing endpoint lives in us-east-1) with ServiceCode AmazonEC2 and
  the filters regionCode, instanceType, tenancy=Shared, operatingSystem=Linux, preInstalledSw=NA,
  capacitystatus=Used gives the on-demand Linux price; PriceList entries are JSON strings.
- ``ec2:DescribeSpotPriceHistory`` (optional, paginated) gives the Linux/UNIX spot price history per
  AZ over the last ``--spot-days`` days; every point is kept per AZ (``prices[region]...spot_history``)
  so a job's cost can use the price in force in its AZ at the time, and the instance type's
  ``spot_usd_per_hour`` is the median over AZs of each AZ's latest price (a cluster lives in one AZ,
  and the median is neither the best nor the worst one you might land in).
  https://docs.aws.amazon.com/AWSEC2/latest/APIReference/API_DescribeSpotPriceHistory.html
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import json
import re
import statistics
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any

from gpucloud.catalog import Catalog, InstanceType, NetworkCard, RegionPrices, SpotPoint, TypePrices
from gpucloud.errors import UserError

PRICING_ENDPOINT_REGION = "us-east-1"
SPOT_HISTORY_DAYS = 7  # default window; AWS keeps 90 days of spot price history
MAX_SPOT_HISTORY_DAYS = 90
SPOT_ESTIMATE_SHARE = 0.4  # spot estimate when no history is known: the typical GPU spot discount
SPOT_PRODUCT_DESCRIPTION = "Linux/UNIX"
ON_DEMAND_FILTERS = {
    "tenancy": "Shared",
    "operatingSystem": "Linux",
    "preInstalledSw": "NA",
    "capacitystatus": "Used",
}
INSTANCE_TYPE_NAME = re.compile(r"^[a-z][a-z0-9-]*\.[a-z0-9]+$")
# IAM actions each call needs, named in the error when AWS refuses
PERMISSIONS = {
    "DescribeInstanceTypes": "ec2:DescribeInstanceTypes",
    "GetProducts": "pricing:GetProducts",
    "DescribeSpotPriceHistory": "ec2:DescribeSpotPriceHistory",
}
NO_CREDENTIALS_HELP = (
    "no AWS credentials found for `gpucloud catalog refresh`: set AWS_PROFILE (after `aws configure` or "
    "`aws sso login`) or AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY; `gpucloud plan` and `gpucloud catalog show` "
    "need none (they use the bundled catalog)"
)


# ---------------------------------------------------------------------------------------------
# Pure parsing: API responses -> models
# ---------------------------------------------------------------------------------------------


def parse_type_names(values: Iterable[str]) -> list[str]:
    """``--types`` values (repeatable, comma separated) as a sorted, de-duplicated list."""
    names = sorted({part.strip() for value in values for part in value.split(",") if part.strip()})
    bad = [name for name in names if not INSTANCE_TYPE_NAME.fullmatch(name)]
    if bad:
        raise UserError(
            f"--types: {', '.join(repr(b) for b in bad)} is not an EC2 instance type name; "
            "expected family.size such as p5.48xlarge"
        )
    return names


def instance_type_from_description(description: Mapping[str, Any]) -> InstanceType:
    """One ``InstanceTypes[]`` entry of DescribeInstanceTypes as a catalog entry (no prices yet).

    Raises ValueError for a type without GPUs: the catalog holds GPU instance types only.
    """
    name = description["InstanceType"]
    gpus = (description.get("GpuInfo") or {}).get("Gpus") or []
    if not gpus:
        raise ValueError(f"{name} has no GPUs (no GpuInfo in DescribeInstanceTypes)")
    network = description.get("NetworkInfo") or {}
    storage = description.get("InstanceStorageInfo") or {}
    nvme = storage.get("NvmeSupport") in ("supported", "required")
    cards = sorted(
        (
            NetworkCard(index=card["NetworkCardIndex"], max_interfaces=card["MaximumNetworkInterfaces"])
            for card in network.get("NetworkCards") or []
        ),
        key=lambda card: card.index,
    )
    efa = bool(network.get("EfaSupported"))
    return InstanceType(
        name=name,
        family=name.split(".", 1)[0],
        gpus=sum(int(gpu.get("Count", 0)) for gpu in gpus),
        gpu_model=str(gpus[0].get("Name", "")),
        gpu_memory_mib=int((gpus[0].get("MemoryInfo") or {}).get("SizeInMiB", 0)),
        vcpus=int((description.get("VCpuInfo") or {}).get("DefaultVCpus", 0)),
        memory_gib=round(int((description.get("MemoryInfo") or {}).get("SizeInMiB", 0)) / 1024, 3),
        nvme_disks=sum(int(d.get("Count", 0)) for d in storage.get("Disks") or []) if nvme else 0,
        nvme_gib=int(storage.get("TotalSizeInGB", 0)) if nvme else 0,
        network_cards=cards,
        efa_supported=efa,
        max_efa_interfaces=int((network.get("EfaInfo") or {}).get("MaximumEfaInterfaces", 0)) if efa else 0,
        on_demand_usd_per_hour=None,
        spot_usd_per_hour=None,
        placement_strategies=list((description.get("PlacementGroupInfo") or {}).get("SupportedStrategies") or []),
        usage_classes=list(description.get("SupportedUsageClasses") or []),
    )


def on_demand_prices(price_list: Sequence[str], instance_type: str) -> list[float]:
    """Distinct hourly USD on-demand prices in GetProducts ``PriceList`` entries for ``instance_type``.

    Only ``BoxUsage`` products count (shared-tenancy instance hours); zero-priced dimensions are
    skipped. Raises ValueError for an entry that is not a JSON price-list document.
    """
    prices: set[float] = set()
    for raw in price_list:
        try:
            item = json.loads(raw) if isinstance(raw, str) else raw
            attributes = item["product"]["attributes"]
            terms = item.get("terms", {}).get("OnDemand", {})
        except (json.JSONDecodeError, KeyError, TypeError, AttributeError) as err:
            raise ValueError(f"unreadable PriceList entry for {instance_type} ({err})") from None
        if attributes.get("instanceType") != instance_type or "BoxUsage" not in attributes.get("usagetype", ""):
            continue
        for term in terms.values():
            for dimension in (term.get("priceDimensions") or {}).values():
                if dimension.get("unit") != "Hrs":
                    continue
                usd = float(dimension.get("pricePerUnit", {}).get("USD", "0"))
                if usd > 0:
                    prices.add(usd)
    return sorted(prices)


def spot_estimates(history: Iterable[Mapping[str, Any]]) -> dict[str, float]:
    """Instance type -> median over AZs of each AZ's latest spot price."""
    latest: dict[tuple[str, str], tuple[datetime.datetime, float]] = {}
    for entry in history:
        key = (entry["InstanceType"], entry.get("AvailabilityZone", ""))
        stamp, price = entry["Timestamp"], float(entry["SpotPrice"])
        if key not in latest or stamp > latest[key][0]:
            latest[key] = (stamp, price)
    per_type: dict[str, list[float]] = {}
    for (instance_type, _az), (_stamp, price) in latest.items():
        per_type.setdefault(instance_type, []).append(price)
    return {t: round(statistics.median(prices), 4) for t, prices in sorted(per_type.items())}


def spot_history_by_az(history: Iterable[Mapping[str, Any]]) -> dict[str, dict[str, list[SpotPoint]]]:
    """Instance type -> AZ -> its spot price points, oldest first (duplicates from overlapping pages dropped)."""
    points: dict[str, dict[str, dict[datetime.datetime, float]]] = {}
    for entry in history:
        stamp = entry["Timestamp"]
        if stamp.tzinfo is None:
            stamp = stamp.replace(tzinfo=datetime.timezone.utc)
        by_az = points.setdefault(entry["InstanceType"], {}).setdefault(entry.get("AvailabilityZone", ""), {})
        by_az[stamp] = float(entry["SpotPrice"])
    return {
        instance_type: {
            az: [SpotPoint(at=at, usd_per_hour=usd) for at, usd in sorted(stamps.items())]
            for az, stamps in sorted(by_az.items())
        }
        for instance_type, by_az in sorted(points.items())
    }


@dataclasses.dataclass(frozen=True)
class TypeChange:
    """How one instance type's entry differs from the catalog it replaces."""

    name: str
    status: str  # "refreshed" | "added" | "kept" (not offered in the region; previous entry kept)
    changed_fields: list[str]
    on_demand_before: float | None
    on_demand_after: float | None
    spot_before: float | None
    spot_after: float | None


@dataclasses.dataclass(frozen=True)
class RefreshResult:
    catalog: Catalog
    changes: list[TypeChange]


def build_catalog(
    *,
    base: Catalog,
    region: str,
    as_of: datetime.date,
    requested: Sequence[str],
    descriptions: Sequence[Mapping[str, Any]],
    on_demand: Mapping[str, Sequence[float]],
    spot: Mapping[str, float] | None,
    spot_history: Mapping[str, Mapping[str, list[SpotPoint]]] | None = None,
) -> RefreshResult:
    """The refreshed catalog holding exactly ``requested``, and what changed against ``base``.

    The refreshed region's entry in ``prices`` is rebuilt (other regions' are kept from ``base``).
    """
    fresh: dict[str, InstanceType] = {}
    for description in descriptions:
        if description.get("InstanceType") not in requested:
            continue
        try:
            entry = instance_type_from_description(description)
        except ValueError as err:
            raise UserError(f"--types: {err}; the catalog holds GPU instance types only") from None
        prices = on_demand.get(entry.name) or []
        fresh[entry.name] = entry.model_copy(
            update={
                "on_demand_usd_per_hour": prices[0] if prices else None,
                "spot_usd_per_hour": (spot or {}).get(entry.name),
            }
        )
    missing = [name for name in requested if name not in fresh]
    unknown = [name for name in missing if name not in base.instance_types]
    if unknown:
        raise UserError(
            f"--types: {', '.join(unknown)} not offered in {region} according to DescribeInstanceTypes; "
            "check the name, or pick a region that offers it with --region"
        )
    notes = [
        f"Instance data from ec2:DescribeInstanceTypes in {region} on {as_of.isoformat()}.",
        f"On-demand prices: pricing:GetProducts (AmazonEC2, Linux, shared tenancy, regionCode {region}).",
    ]
    ambiguous = sorted(name for name, prices in on_demand.items() if name in fresh and len(prices) > 1)
    if ambiguous:
        notes.append(f"Several on-demand prices matched for {', '.join(ambiguous)}; the lowest was kept.")
    no_price = sorted(name for name, entry in fresh.items() if entry.on_demand_usd_per_hour is None)
    if no_price:
        notes.append(f"No on-demand price in the Pricing API for {', '.join(no_price)} (left null).")
    if spot is None:
        notes.append("Spot prices were not refreshed (--no-spot): spot_usd_per_hour is null.")
    else:
        notes.append(
            "spot_usd_per_hour: median over Availability Zones of the latest Linux/UNIX price from "
            "ec2:DescribeSpotPriceHistory; spot prices move continuously."
        )
    if missing:
        notes.append(
            f"Not offered in {region}: {', '.join(missing)}; their entries were kept from the catalog "
            f"as of {base.as_of.isoformat()} ({base.region})."
        )

    instance_types = {name: fresh.get(name) or base.instance_types[name] for name in requested}
    sources = [
        f"ec2:DescribeInstanceTypes ({region}, {as_of.isoformat()})",
        f"pricing:GetProducts ServiceCode=AmazonEC2 regionCode={region} ({as_of.isoformat()})",
    ]
    if spot is not None:
        sources.append(f"ec2:DescribeSpotPriceHistory {SPOT_PRODUCT_DESCRIPTION} ({region}, {as_of.isoformat()})")
    if missing:
        sources.extend(base.sources)
    region_prices = _region_prices(base, region, as_of, sources, instance_types, set(fresh), spot_history or {})
    catalog = Catalog(
        as_of=as_of,
        region=region,
        sources=sources,
        instance_types=instance_types,
        notes=notes,
        prices={**{r: p for r, p in base.prices.items() if r != region}, region: region_prices},
    )
    return RefreshResult(catalog=catalog, changes=_changes(base, instance_types, set(missing)))


def _region_prices(
    base: Catalog,
    region: str,
    as_of: datetime.date,
    sources: list[str],
    instance_types: Mapping[str, InstanceType],
    refreshed: set[str],
    spot_history: Mapping[str, Mapping[str, list[SpotPoint]]],
) -> RegionPrices:
    """``region``'s prices after the refresh: fresh figures for the refreshed types, the Capacity Block
    rates (no public API gives them without a reservation request) and spot estimates kept from ``base``."""
    before = base.region_prices(region)
    entries: dict[str, TypePrices] = {}
    for name, entry in instance_types.items():
        old = before.instance_types.get(name) if before else None
        if name not in refreshed:
            if old is not None:
                entries[name] = old
            continue
        on_demand = entry.on_demand_usd_per_hour
        estimate = old.spot_estimate_usd_per_hour if old and old.spot_estimate_usd_per_hour else None
        if estimate is None and on_demand is not None:
            estimate = round(SPOT_ESTIMATE_SHARE * on_demand, 4)
        entries[name] = TypePrices(
            on_demand_usd_per_hour=on_demand,
            on_demand_source=f"pricing:GetProducts ServiceCode=AmazonEC2 regionCode={region} ({as_of.isoformat()})",
            spot_estimate_usd_per_hour=estimate,
            spot_history=dict(spot_history.get(name, {})),
            capacity_block_usd_per_hour=old.capacity_block_usd_per_hour if old else None,
            capacity_block_source=old.capacity_block_source if old else "",
        )
    return RegionPrices(as_of=as_of, sources=sources, instance_types=entries)


def _changes(base: Catalog, after: Mapping[str, InstanceType], kept: set[str]) -> list[TypeChange]:
    changes = []
    for name, entry in after.items():
        before = base.instance_types.get(name)
        if before is None:
            status, fields = "added", []
        else:
            status = "kept" if name in kept else "refreshed"
            old, new = before.model_dump(), entry.model_dump()
            fields = [key for key in new if old.get(key) != new[key]]
        changes.append(
            TypeChange(
                name=name,
                status=status,
                changed_fields=fields,
                on_demand_before=before.on_demand_usd_per_hour if before else None,
                on_demand_after=entry.on_demand_usd_per_hour,
                spot_before=before.spot_usd_per_hour if before else None,
                spot_after=entry.spot_usd_per_hour,
            )
        )
    return changes


# ---------------------------------------------------------------------------------------------
# Thin AWS calls
# ---------------------------------------------------------------------------------------------


def _aws_error(operation: str, region: str, err: Exception) -> UserError:
    from botocore.exceptions import ClientError, NoCredentialsError

    if isinstance(err, NoCredentialsError):
        return UserError(NO_CREDENTIALS_HELP)
    if isinstance(err, ClientError):
        error = err.response.get("Error", {})
        code, message = error.get("Code", "Error"), error.get("Message", "")
        hint = ""
        if code in ("AccessDenied", "AccessDeniedException", "UnauthorizedOperation"):
            hint = f"; the credentials need {PERMISSIONS[operation]}"
        return UserError(f"{operation} in {region} failed: {code}: {message}{hint}")
    return UserError(f"{operation} in {region} failed: {err}")


@contextlib.contextmanager
def _calling(operation: str, region: str) -> Iterator[None]:
    """Turn botocore failures of one AWS call into a one-line UserError."""
    from botocore.exceptions import BotoCoreError, ClientError

    try:
        yield
    except (ClientError, BotoCoreError) as err:
        raise _aws_error(operation, region, err) from None


def describe_instance_types(ec2: Any, types: Sequence[str], region: str) -> list[dict[str, Any]]:
    with _calling("DescribeInstanceTypes", region):
        pages = ec2.get_paginator("describe_instance_types").paginate(
            Filters=[{"Name": "instance-type", "Values": list(types)}]
        )
        return [item for page in pages for item in page.get("InstanceTypes", [])]


def get_on_demand_price_list(pricing: Any, region: str, instance_type: str) -> list[str]:
    filters = {"regionCode": region, "instanceType": instance_type, **ON_DEMAND_FILTERS}
    with _calling("GetProducts", region):
        pages = pricing.get_paginator("get_products").paginate(
            ServiceCode="AmazonEC2",
            FormatVersion="aws_v1",
            Filters=[{"Type": "TERM_MATCH", "Field": field, "Value": value} for field, value in filters.items()],
        )
        return [item for page in pages for item in page.get("PriceList", [])]


def spot_price_history(
    ec2: Any, types: Sequence[str], region: str, now: datetime.datetime, days: int = SPOT_HISTORY_DAYS
) -> list[dict[str, Any]]:
    # From StartTime to now, per AZ; the first entry of each AZ is the price in effect at StartTime.
    with _calling("DescribeSpotPriceHistory", region):
        pages = ec2.get_paginator("describe_spot_price_history").paginate(
            InstanceTypes=list(types),
            ProductDescriptions=[SPOT_PRODUCT_DESCRIPTION],
            StartTime=now - datetime.timedelta(days=days),
            EndTime=now,
        )
        return [item for page in pages for item in page.get("SpotPriceHistory", [])]


@dataclasses.dataclass(frozen=True)
class AwsClients:
    ec2: Any
    pricing: Any


def make_clients(region: str) -> AwsClients:
    """EC2 in ``region`` and Pricing in us-east-1, after checking the region and the credentials."""
    import boto3

    session = boto3.session.Session()
    known = session.get_available_regions("ec2")
    if region not in known:
        raise UserError(f"--region: unknown AWS region {region!r}; allowed: {', '.join(sorted(known))}")
    if session.get_credentials() is None:
        raise UserError(NO_CREDENTIALS_HELP)
    return AwsClients(
        ec2=session.client("ec2", region_name=region),
        pricing=session.client("pricing", region_name=PRICING_ENDPOINT_REGION),
    )


def utcnow() -> datetime.datetime:
    return datetime.datetime.now(datetime.timezone.utc)


def refresh_steps(types: Sequence[str], include_spot: bool) -> int:
    """How many progress steps ``refresh_catalog`` reports."""
    return 1 + len(types) + (1 if include_spot else 0)


def refresh_catalog(
    clients: AwsClients,
    *,
    region: str,
    types: Sequence[str],
    base: Catalog,
    include_spot: bool = True,
    spot_days: int = SPOT_HISTORY_DAYS,
    now: datetime.datetime | None = None,
    on_step: Callable[[str], None] = lambda label: None,
) -> RefreshResult:
    """Query AWS for ``types`` and build the refreshed catalog (nothing is written here)."""
    now = now or utcnow()
    on_step("DescribeInstanceTypes")
    descriptions = describe_instance_types(clients.ec2, types, region)
    offered = sorted({d["InstanceType"] for d in descriptions} & set(types))
    on_demand: dict[str, list[float]] = {}
    for name in types:
        on_step(f"GetProducts {name}")
        if name not in offered:
            continue
        try:
            on_demand[name] = on_demand_prices(get_on_demand_price_list(clients.pricing, region, name), name)
        except ValueError as err:
            raise UserError(f"GetProducts in {region}: {err}") from None
    spot = history = None
    if include_spot:
        on_step("DescribeSpotPriceHistory")
        entries = spot_price_history(clients.ec2, offered, region, now, spot_days) if offered else []
        spot, history = spot_estimates(entries), spot_history_by_az(entries)
    return build_catalog(
        base=base,
        region=region,
        as_of=now.date(),
        requested=list(types),
        descriptions=descriptions,
        on_demand=on_demand,
        spot=spot,
        spot_history=history,
    )
