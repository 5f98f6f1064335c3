"""``gpucloud estimate``: expected goodput and cost per useful GPU-hour, per node group of a stack.

Thin: the flags are checked and the model run by ``gpucloud.cost.estimate``; this module prints.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import click

from gpucloud.commands.options import catalog_file_option, chosen_stack, stack_options
from gpucloud.output import output_option, print_json

if TYPE_CHECKING:
    from gpucloud.cost.estimate import GroupEstimate


@click.command("estimate")
@stack_options()
@click.option(
    "--model-gib",
    "model_gib",
    type=float,
    required=True,
    metavar="G",
    help="Checkpoint size in GiB: the whole job's state (weights, optimizer, ...), summed over ranks.",
)
@click.option(
    "--step-seconds", "step_seconds", type=float, required=True, metavar="S", help="Seconds one training step takes."
)
@click.option(
    "--interruptions-per-hour",
    "interruptions_per_hour",
    type=float,
    metavar="R",
    help="Interruptions of the job per hour that come with a notice (spot reclaims). "
    "Default: 1/6 for spot groups [assumption], 0 for on-demand and capacity groups.",
)
@click.option(
    "--restart-seconds",
    "restart_seconds",
    type=float,
    metavar="SECONDS",
    help="Seconds from an interruption to training again (replacement, bootstrap, restore). "
    "Default: 600 s [estimate] plus the restore at the checkpoint tier's rate.",
)
@catalog_file_option()
@output_option()
def estimate(
    stack: str | None,
    stack_file: Path | None,
    model_gib: float,
    step_seconds: float,
    interruptions_per_hour: float | None,
    restart_seconds: float | None,
    catalog_file: Path | None,
    output: str,
) -> None:
    """Expected goodput and cost per useful GPU-hour of each node group, for two strategies:

    \b
      periodic  periodic checkpoints only, at the Young/Daly interval: an interruption
                loses half an interval on average, plus the restart
      notice    gpucloud's notice-driven save: an interruption with a notice loses at most
                one step, plus the emergency save and the restart; periodic saves stay, rarer,
                against failures without a notice

    Goodput is useful step time over paid time; cost per useful GPU-hour is the group's hourly
    price (as `gpucloud plan` prices it, at maxNodes) over GPUs x goodput. The save time is the
    emergency-save model of `plan` (the fastest durable tier, all maxNodes nodes writing); a save
    that does not fit in the spot notice gives the notice no advantage, and the output says so.
    A table shows both strategies at several interruption rates. Offline: no AWS account needed.

    \b
    Examples:
      gpucloud estimate --stack p5-capacity-block --model-gib 500 --step-seconds 2
      gpucloud estimate --stack p4d-spot --model-gib 500 --step-seconds 2 --interruptions-per-hour 0.2
      gpucloud estimate --stack dev --model-gib 16 --step-seconds 0.5 -o json

    The model, its sources and its assumptions: docs/cost.md, "Goodput estimate".
    """
    from gpucloud.catalog import load_catalog
    from gpucloud.cost.estimate import estimate_stack, validate_inputs
    from gpucloud.spec import load_stack_file

    validate_inputs(model_gib, step_seconds, interruptions_per_hour, restart_seconds)  # before any file is read
    name, path = chosen_stack(stack, stack_file)
    catalog = load_catalog(catalog_file)
    spec = load_stack_file(path, catalog)
    groups = estimate_stack(
        spec,
        catalog,
        model_gib=model_gib,
        step_seconds=step_seconds,
        interruptions_per_hour=interruptions_per_hour,
        restart_seconds=restart_seconds,
    )
    source = {
        "path": str(catalog_file) if catalog_file is not None else None,
        "as_of": catalog.as_of.isoformat(),
        "region": catalog.region,
    }
    if output == "json":
        print_json(
            {
                "stack": name,
                "model_gib": model_gib,
                "step_seconds": step_seconds,
                "catalog": source,
                "groups": [g.to_json() for g in groups],
            }
        )
        return
    origin = source["path"] or "the bundled catalog"
    click.echo(
        f"Goodput estimate for stack {name}: a {model_gib:g} GiB checkpoint, {step_seconds:g} s steps; "
        f"prices from {origin} ({source['region']}, as of {source['as_of']})"
    )
    for g in groups:
        _print_group(g)


def _money(value: float | None) -> str:
    return "-" if value is None else f"${value:,.2f}"


def _share(value: float) -> str:
    return f"{value * 100:.1f}%"


def _duration(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.1f} min"


def _print_group(g: GroupEstimate) -> None:
    from gpucloud.output import print_table

    price = "price unknown (not in the catalog)" if g.usd_per_hour is None else f"{_money(g.usd_per_hour)}/h"
    if g.usd_per_hour is not None and g.capacity_type == "spot":
        price += " (spot at the catalog's estimate)"
    click.echo("")
    click.echo(f"Node group {g.node_group}: {g.nodes} x {g.instance_type} ({g.gpus} GPUs, {g.capacity_type}), {price}")
    fits = "fits" if g.save.fits else "does NOT fit"
    click.echo(
        f"  save: {g.save.seconds:.0f} s through {g.save.tier} ({fits} the {g.save.budget_seconds:g} s notice budget); "
        f"restart: {g.restart_seconds:.0f} s ({g.restart_source})"
    )
    click.echo(
        f"  interruptions: {g.rates.noticed_per_hour:.3g}/h with a notice ({g.rate_source}); "
        f"{g.rates.unnoticed_per_hour:.2g}/h without (hardware failures [estimate])"
    )
    click.echo("  periodic: checkpoints at the Young/Daly interval only; notice: gpucloud's notice-driven save")
    rows = []
    for s in g.strategies():
        lost = _duration(s.noticed_loss_seconds)
        if s.strategy == "notice" and not s.fallback:
            lost += f" (no notice: {_duration(s.unnoticed_loss_seconds)})"
        cost = s.usd_per_useful_gpu_hour(g.usd_per_hour, g.gpus)
        rows.append([s.strategy, _duration(s.interval_seconds), lost, _share(s.goodput), _money(cost)])
    print_table(None, ["strategy", "save every", "lost per interruption", "goodput", "$/useful GPU-h"], rows)
    for s in g.strategies():
        if s.note:
            click.echo(f"  note ({s.strategy}): {s.note}")
    sens = []
    for row in g.sensitivity:
        marker = " *" if row.interruptions_per_hour == g.rates.noticed_per_hour else ""
        sens.append(
            [
                f"{row.interruptions_per_hour:.3g}{marker}",
                _share(row.periodic.goodput),
                _money(row.periodic.usd_per_useful_gpu_hour(g.usd_per_hour, g.gpus)),
                _share(row.notice.goodput),
                _money(row.notice.usd_per_useful_gpu_hour(g.usd_per_hour, g.gpus)),
            ]
        )
    print_table(
        f"{g.node_group}: sensitivity to the interruption rate (* this estimate's)",
        ["per hour", "periodic goodput", "periodic $/GPU-h", "notice goodput", "notice $/GPU-h"],
        sens,
    )
