"""`gpucloud catalog`: show the GPU instance catalog, or rebuild it from AWS."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import click

from gpucloud.output import output_option, print_json, print_table


def _money(value: float | None) -> str:
    return "-" if value is None else f"{value:,.2f}"


def _spot_label(price) -> str:
    """A spot figure as shown in tables: an estimate says so, a history figure says where from."""
    if price is None:
        return "-"
    kind = "estimate" if price.is_estimate else "history"
    return f"{price.usd_per_hour:,.2f} ({kind})"


def _region_rows(data, region: str) -> tuple[list[tuple], dict[str, dict]]:
    """Table rows and JSON entries of ``region``'s prices: each figure with its kind and as-of date."""
    from gpucloud.catalog.pricing import NoPrice, hourly_price

    def price(name: str, lifecycle: str):
        try:
            return hourly_price(name, region, lifecycle, catalog=data)
        except NoPrice:
            return None

    rows, entries = [], {}
    regional = data.region_prices(region)
    for name in regional.instance_types if regional else []:
        od, spot, block = price(name, "on-demand"), price(name, "spot"), price(name, "capacity-block")
        rows.append((name, _money(od and od.usd_per_hour), _spot_label(spot), _money(block and block.usd_per_hour)))
        entries[name] = {
            "on_demand": od and od.to_json(),
            "spot": spot and spot.to_json(),  # source "spot-estimate" when no history is known
            "capacity_block": block and block.to_json(),
        }
    return rows, entries


@click.group(name="catalog")
def catalog() -> None:
    """Show or refresh the GPU instance catalog the planner uses.

    \b
    The catalog lists, per instance type: GPUs, GPU memory, vCPU, memory, NVMe instance store,
    network cards, EFA interfaces and prices, with its as-of date and sources. `gpucloud plan`
    reads it for EFA layouts and costs, so it needs no AWS access.

    \b
      gpucloud catalog show
      gpucloud catalog show --output json
      gpucloud catalog refresh --region us-east-1 --dry-run
    """


@catalog.command(name="show")
@click.option(
    "--catalog-file",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Catalog JSON to show (default: the bundled catalog).",
)
@click.option(
    "--region",
    default=None,
    help="Show this region's prices (on-demand, spot with its kind, Capacity Block) instead of the instance table.",
)
@output_option()
def show(catalog_file: Path | None, region: str | None, output: str) -> None:
    """Show every instance type in the catalog, with prices and the as-of date.

    \b
    Spot figures say what they are: "history" (ec2:DescribeSpotPriceHistory, stored by
    `catalog refresh`, median over AZs) or "estimate" (no history known: about 40% of on-demand).

    \b
      gpucloud catalog show --region us-west-2
    """
    from gpucloud.catalog import load_catalog
    from gpucloud.errors import UserError

    data = load_catalog(catalog_file)
    if region is not None:
        regional = data.region_prices(region)
        if regional is None:
            raise UserError(
                f"--region: no prices for {region} in the catalog; priced regions: {', '.join(data.priced_regions)}"
            )
        rows, entries = _region_rows(data, region)
        if output == "json":
            print_json(
                {"region": region, "as_of": regional.as_of.isoformat(), "sources": regional.sources, "prices": entries}
            )
            return
        print_table(
            f"Prices - {region}, as of {regional.as_of.isoformat()}",
            ["Type", "On-demand $/h", "Spot $/h", "Capacity Block $/h"],
            rows,
        )
        for source in regional.sources:
            click.echo(f"source: {source}")
        return
    if output == "json":
        print_json(
            data.model_dump(mode="json")
            | {"prices_summary": {r: _region_rows(data, r)[1] for r in data.priced_regions}}
        )
        return
    spot_labels = {row[0]: row[2] for row in _region_rows(data, data.region)[0]}
    rows = [
        (
            t.name,
            f"{t.gpus}x{t.gpu_model}",
            f"{t.gpu_memory_mib / 1024:g}",
            t.vcpus,
            f"{t.memory_gib:g}",
            f"{t.nvme_disks}x{t.nvme_gib // t.nvme_disks}" if t.nvme_disks else "-",
            len(t.network_cards),
            t.max_efa_interfaces if t.efa_supported else "-",
            _money(t.on_demand_usd_per_hour),
            spot_labels.get(t.name, "-"),
        )
        for t in data.instance_types.values()
    ]
    print_table(
        f"GPU instance catalog - {data.region}, as of {data.as_of.isoformat()}",
        ["Type", "GPUs", "GiB/GPU", "vCPU", "Mem GiB", "NVMe GB", "Cards", "EFA", "OD $/h", "Spot $/h"],
        rows,
    )
    click.echo(
        f"OD: on-demand (Linux). Spot: an estimate unless `catalog refresh` stored spot history. Prices for "
        f"{', '.join(data.priced_regions)}: `gpucloud catalog show --region REGION`."
    )
    for note in data.notes:
        click.echo(f"note: {note}")


@catalog.command(name="refresh")
@click.option(
    "--region", default=None, help="Region whose instance data and prices to fetch (default: the current catalog's)."
)
@click.option(
    "--types",
    "types",
    multiple=True,
    metavar="TYPE[,TYPE...]",
    help="Instance types the new catalog holds; repeat or comma-separate (default: the current catalog's types).",
)
@click.option(
    "--output-file",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Where to write the catalog (default: the bundled catalog the planner reads).",
)
@click.option(
    "--spot/--no-spot",
    default=True,
    show_default=True,
    help="Also fetch the spot price history per Availability Zone (DescribeSpotPriceHistory).",
)
@click.option(
    "--spot-days",
    type=click.IntRange(1, 90),
    default=7,
    show_default=True,
    help="Days of spot price history to keep per AZ (AWS keeps 90).",
)
@click.option("--dry-run", is_flag=True, help="Show what would change without writing anything.")
@output_option()
def refresh(
    region: str | None,
    types: tuple[str, ...],
    output_file: Path | None,
    spot: bool,
    spot_days: int,
    dry_run: bool,
    output: str,
) -> None:
    """Rebuild the catalog from DescribeInstanceTypes and the Pricing API (needs AWS credentials).

    \b
    Calls (read-only): ec2:DescribeInstanceTypes, pricing:GetProducts (us-east-1 endpoint) and,
    unless --no-spot, ec2:DescribeSpotPriceHistory (every point per AZ over --spot-days, so job
    costs use the spot price in force in their AZ). The region's prices replace its entry in the
    catalog's prices; other regions' prices are kept. A type the region does not offer keeps its
    previous entry (noted in the catalog); an unknown type is an error and nothing is written.

    \b
      gpucloud catalog refresh --dry-run
      gpucloud catalog refresh --region us-west-2 --types p5.48xlarge,p4d.24xlarge --output-file us-west-2.json
    """
    from gpucloud.catalog import BUNDLED_CATALOG, load_catalog, save_catalog
    from gpucloud.catalog import refresh as catalog_refresh

    target = output_file or BUNDLED_CATALOG
    base = load_catalog(target) if target.exists() else load_catalog()
    region = region or base.region
    names = catalog_refresh.parse_type_names(types) if types else sorted(base.instance_types)
    clients = catalog_refresh.make_clients(region)

    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    total = catalog_refresh.refresh_steps(names, spot)
    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=Console(stderr=True),
        transient=True,
    ) as progress:
        task = progress.add_task("Refreshing catalog", total=total)

        def on_step(label: str) -> None:
            progress.update(task, description=label)
            progress.advance(task)

        result = catalog_refresh.refresh_catalog(
            clients, region=region, types=names, base=base, include_spot=spot, spot_days=spot_days, on_step=on_step
        )
    if not dry_run:
        save_catalog(result.catalog, target)
    # what the spot figure now is, per type: a history median, or (no history) the kept estimate
    spot_now = {row[0]: row[2] for row in _region_rows(result.catalog, region)[0]}
    spot_json = _region_rows(result.catalog, region)[1]

    if output == "json":
        print_json(
            {
                "output_file": str(target),
                "written": not dry_run,
                "as_of": result.catalog.as_of.isoformat(),
                "region": result.catalog.region,
                "changes": [
                    dataclasses.asdict(c) | {"spot_now": (spot_json.get(c.name) or {}).get("spot")}
                    for c in result.changes
                ],
                "notes": result.catalog.notes,
            }
        )
        return
    rows = [
        (
            c.name,
            c.status,
            f"{_money(c.on_demand_before)} -> {_money(c.on_demand_after)}",
            f"{_money(c.spot_before)} -> {spot_now.get(c.name, '-')}",
            ", ".join(c.changed_fields) or "-",
        )
        for c in result.changes
    ]
    print_table(
        f"Catalog refresh - {region}, as of {result.catalog.as_of.isoformat()}",
        ["Type", "Status", "On-demand $/h", "Spot $/h", "Changed fields"],
        rows,
    )
    verb = "would write" if dry_run else "wrote"
    click.echo(f"{verb} {target}")
