"""The GPU instance catalog: what each supported EC2 instance type offers, and what it costs.

The catalog is data (``catalog/instance_types.json``) with an as-of date and its sources, so every
number the planner uses (network cards, EFA interfaces, NVMe, prices) can be traced and refreshed
(``gpucloud catalog refresh`` rebuilds it from DescribeInstanceTypes and the Pricing API). The field
names mirror DescribeInstanceTypes (``NetworkInfo.NetworkCards``, ``EfaInfo.MaximumEfaInterfaces``,
``PlacementGroupInfo.SupportedStrategies``, ``SupportedUsageClasses``).
"""

from __future__ import annotations

import datetime
from functools import lru_cache
from pathlib import Path
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from gpucloud.errors import UserError
from gpucloud.payload import parse_json

BUNDLED_CATALOG = Path(__file__).parent / "instance_types.json"
MAX_QUOTED_CHARS = 80

# A catalog file is user input (`--catalog-file`): a NaN price compares false with every ceiling
# and a negative one lowers the estimate, so both would get a stack past its cost ceiling.
Count = Annotated[int, Field(ge=0, strict=True)]  # strict: `true` is not 1 GPU
UsdRate = Annotated[float, Field(gt=0, allow_inf_nan=False)]
Amount = Annotated[float, Field(ge=0, allow_inf_nan=False)]


class NetworkCard(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    index: Count
    max_interfaces: Count


class InstanceType(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    family: str
    gpus: Count
    gpu_model: str
    gpu_memory_mib: Count  # per GPU, as GpuInfo.Gpus[].MemoryInfo.SizeInMiB reports it
    vcpus: Count
    memory_gib: Amount
    nvme_disks: Count
    nvme_gib: Count  # instance store total (InstanceStorageInfo.TotalSizeInGB); 0 when none
    network_cards: list[NetworkCard]
    efa_supported: bool
    max_efa_interfaces: Count
    # The catalog's home region (``Catalog.region``); other regions' prices are in ``Catalog.prices``.
    on_demand_usd_per_hour: UsdRate | None
    spot_usd_per_hour: UsdRate | None  # an estimate: spot prices move every few minutes
    placement_strategies: list[str]
    usage_classes: list[str]  # "on-demand", "spot", "capacity-block"

    @property
    def supports_cluster_placement(self) -> bool:
        return "cluster" in self.placement_strategies


class SpotPoint(BaseModel):
    """One DescribeSpotPriceHistory entry: the price in force in one AZ from ``at`` on."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    at: datetime.datetime
    usd_per_hour: UsdRate


class TypePrices(BaseModel):
    """What one instance type costs in one region, each figure with where it came from."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    on_demand_usd_per_hour: UsdRate | None = None
    on_demand_source: str = ""
    # Used only when no spot history is known for the type (then labelled an estimate everywhere).
    spot_estimate_usd_per_hour: UsdRate | None = None
    spot_history: dict[str, list[SpotPoint]] = {}  # AZ name -> points, oldest first
    # A Capacity Block's effective hourly rate (its up-front fee / its hours), per instance.
    capacity_block_usd_per_hour: UsdRate | None = None
    capacity_block_source: str = ""


class RegionPrices(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    as_of: datetime.date
    sources: list[str]
    instance_types: dict[str, TypePrices]


class Catalog(BaseModel):
    model_config = ConfigDict(extra="forbid")

    as_of: datetime.date
    region: str  # the home region: the InstanceType price fields are this region's
    sources: list[str]
    instance_types: dict[str, InstanceType]
    notes: list[str] = []  # what the sources could not confirm, and which numbers are estimates
    prices: dict[str, RegionPrices] = {}  # region -> prices; a catalog without it knows its home region only

    def region_prices(self, region: str) -> RegionPrices | None:
        """The prices known for ``region``; None when the catalog has none for it.

        For the home region the instance types' own price fields win over ``prices[region]`` (they
        are what a person edits, and what an older catalog file without ``prices`` holds); spot
        history and Capacity Block rates still come from ``prices[region]``.
        """
        stored = self.prices.get(region)
        if region != self.region:
            return stored
        entries = dict(stored.instance_types) if stored else {}
        for name, t in self.instance_types.items():
            entry = entries.get(name) or TypePrices()
            updates: dict[str, object] = {}
            if entry.on_demand_usd_per_hour != t.on_demand_usd_per_hour:
                updates["on_demand_usd_per_hour"] = t.on_demand_usd_per_hour
                updates["on_demand_source"] = f"catalog instance_types ({self.region}, as of {self.as_of.isoformat()})"
            if t.spot_usd_per_hour is not None and entry.spot_estimate_usd_per_hour != t.spot_usd_per_hour:
                updates["spot_estimate_usd_per_hour"] = t.spot_usd_per_hour
            entries[name] = entry.model_copy(update=updates) if updates else entry
        return RegionPrices(
            as_of=stored.as_of if stored else self.as_of,
            sources=stored.sources if stored else self.sources,
            instance_types=entries,
        )

    @property
    def priced_regions(self) -> list[str]:
        return sorted(set(self.prices) | {self.region})


def load_catalog(path: Path | None = None) -> Catalog:
    """Load a catalog file; the bundled one when ``path`` is None (parsed once per process)."""
    if path is None:
        return _bundled_catalog()
    return _read_catalog(Path(path))


@lru_cache(maxsize=1)
def _bundled_catalog() -> Catalog:
    return _read_catalog(BUNDLED_CATALOG)


def _read_catalog(path: Path) -> Catalog:
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise UserError(f"{path}: catalog file not found") from None
    except OSError as err:
        raise UserError(f"{path}: not a readable JSON catalog ({err.strerror or err.__class__.__name__})") from None
    try:
        raw = parse_json(data, "the file", _Unreadable)  # deep nesting, huge integers, bad UTF-8: one line
    except _Unreadable as err:
        raise UserError(f"{path}: not a readable JSON catalog ({err})") from None
    try:
        return Catalog.model_validate(raw)
    except ValidationError as err:
        first = err.errors()[0]
        where = _short(".".join(str(p) for p in first["loc"]) or "(top level)")
        value = f" = {_short(repr(first['input']))}" if first["type"] != "missing" and _scalar(first["input"]) else ""
        raise UserError(f"{path}: invalid catalog at {where}{value}: {first['msg']}") from None


class _Unreadable(Exception):
    pass


def _scalar(value: object) -> bool:
    return isinstance(value, str | float | bool) or (isinstance(value, int) and value.bit_length() < 200)


def _short(text: str) -> str:
    text = text.encode("unicode_escape").decode("ascii") if not text.isprintable() else text
    return text if len(text) <= MAX_QUOTED_CHARS else text[: MAX_QUOTED_CHARS - 3] + "..."


def save_catalog(catalog: Catalog, path: Path) -> None:
    """Write ``catalog`` as JSON atomically (a reader never sees a half-written file)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(catalog.model_dump_json(indent=2) + "\n", encoding="utf-8")
    tmp.replace(path)


def get_instance_type(name: str, catalog: Catalog | None = None) -> InstanceType:
    """The catalog entry for ``name``; a UserError listing the known types otherwise."""
    catalog = catalog or load_catalog()
    try:
        return catalog.instance_types[name]
    except KeyError:
        known = ", ".join(sorted(catalog.instance_types))
        raise UserError(f"unknown instance type {name!r}; known types: {known}") from None
