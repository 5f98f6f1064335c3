"""``gpucloud plan``: preview a stack offline — resources, EFA layout, hourly cost.

Heavy imports (pulumi, pulumi_aws) happen inside the command so ``gpucloud --help`` stays fast.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import click

from gpucloud.commands.options import catalog_file_option, chosen_stack, stack_options
from gpucloud.errors import UserError
from gpucloud.output import output_option, print_json


@click.command("plan")
@stack_options()
@catalog_file_option()
@output_option()
def plan(stack: str | None, stack_file: Path | None, catalog_file: Path | None, output: str) -> None:
    """Preview a stack offline: what `pulumi up` would create, the EFA layout and the hourly cost
    (the cluster's, and its monitoring's next to it: gpucloud:monitoring).

    Runs the real stack program under Pulumi mocks in this process: no AWS account, credentials,
    network or Pulumi CLI needed. Lookups (availability zones, the DLAMI's SSM parameter, the AMI)
    are answered by the mocks, so IDs and ARNs in the output are placeholders.

    \b
    Examples:
      gpucloud plan --stack dev
      gpucloud plan --stack p5-capacity-block --output json | jq '.cost'
      gpucloud plan --stack-file my-stacks/Pulumi.research.yaml
      gpucloud catalog refresh --output-file fresh.json   # needs AWS credentials
      gpucloud plan --stack dev --catalog-file fresh.json   # today's prices, offline

    The stack file is validated first; every problem is reported as one line naming the file,
    the key, the bad value and what is allowed (exit code 2). The planned resources are then
    checked by the gpucloud policy pack; a mandatory violation makes the exit code 1.
    """
    from gpucloud.catalog import load_catalog
    from gpucloud.spec import load_stack_file

    name, path = chosen_stack(stack, stack_file)
    catalog = load_catalog(catalog_file)  # the same checks and one-line errors as `catalog show`
    spec = load_stack_file(path, catalog)
    warnings = _stack_warnings(spec)

    _require_deploy_extra()
    from gpucloud.cluster.tags import recorded_expires_at
    from gpucloud.infra.budget import budget_json, budget_summary
    from gpucloud.infra.preview import preview_stack
    from gpucloud.policy.runner import run_policies

    source = {
        "path": str(catalog_file) if catalog_file is not None else None,
        "as_of": catalog.as_of.isoformat(),
        "region": catalog.region,
    }
    if output == "json":
        result = preview_stack(spec, name, catalog)
        violations = run_policies(result.resources, stack=name)
        warnings += result.cost.warnings
        print_json(
            {
                **result.to_json(),
                "catalog": source,
                "policy_violations": [dataclasses.asdict(v) for v in violations],
                "warnings": warnings,
                "budget": budget_json(spec.budget),  # gpucloud:budget (docs/cost.md, "Budgets")
                "expires_at": recorded_expires_at(r.inputs for r in result.resources),  # gpucloud:ttlHours
            }
        )
        _warn_emergency_save(result.emergency_saves)
    else:
        from rich.console import Console

        with Console(stderr=True).status(f"Planning stack {name} under Pulumi mocks..."):
            result = preview_stack(spec, name, catalog)
            violations = run_policies(result.resources, stack=name)
        warnings += result.cost.warnings  # prices plan does not have: it warns and shows them unknown
        _print_human(result, source)
        _print_monitoring(result)
        if spec.budget is not None:
            click.echo(f"budget: {budget_summary(spec.budget)}")
        if (expiry := recorded_expires_at(r.inputs for r in result.resources)) is not None:
            click.echo(
                f"expires-at: {expiry} (gpucloud:ttlHours from now; each `pulumi up` moves it: docs/teardown.md)"
            )
        _print_emergency_save(result.emergency_saves)
        _warn_emergency_save(result.emergency_saves)
        for line in warnings:
            click.echo(f"warning: {line}")
        _print_violations(violations)
    if any(v.enforcement == "mandatory" for v in violations):
        # `pulumi up --policy-pack` would refuse this stack: say so with the exit code too
        raise SystemExit(1)


def _stack_warnings(spec: Any) -> list[str]:
    """What the stack may deploy but will not work as it stands (one line each; JSON ``warnings``)."""
    from gpucloud.jobs.code.agent_package import placeholder_warning

    found = placeholder_warning(spec.agent.package)
    return [found] if found else []


def _money(value: float | None) -> str:
    return "unknown" if value is None else f"${value:,.2f}"


def _print_human(result: Any, catalog: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table
    from rich.tree import Tree

    console = Console()
    tree = Tree(
        f"[bold]{result.cluster}[/] (stack {result.stack}, {result.region}): "
        f"{len(result.custom_resources)} AWS resources"
    )
    nodes: dict[str | None, Tree] = {None: tree}
    for r in result.resources:  # parents always register before their children
        parent = nodes.get(r.parent, tree)
        label = f"{r.name} [dim]{r.type}[/]" if r.custom else f"[bold cyan]{r.name}[/] [dim]{r.type}[/]"
        if r.options.protect:  # `pulumi destroy` refuses it (docs/teardown.md)
            label += " [yellow]protected[/]"
        nodes[r.urn] = parent.add(label)
    console.print(tree)

    efa = Table(title="EFA layout per node")
    for col in ("group", "type", "layout", "cards", "NICs", "EFA", "IPs", "placement"):
        efa.add_column(col)
    for g in result.efa_layouts:
        e = g.efa
        efa.add_row(
            g.node_group,
            e.instance_type,
            e.layout,
            str(e.network_cards),
            str(e.interfaces),
            str(e.efa_interfaces),
            str(e.ip_interfaces),
            "cluster" if g.placement_group else "-",
        )
    console.print(efa)

    console.print(_cost_table(result.cost))
    c = result.cost
    for g in c.groups:
        if g.note:
            console.print(f"{g.name}: {g.note}.", markup=False, soft_wrap=True)
    for line in c.infrastructure:
        if line.note:
            console.print(f"{line.item}: {line.note}.", markup=False, soft_wrap=True)
    origin = catalog["path"] or "the bundled catalog"
    as_of = c.prices_as_of.isoformat() if c.prices_as_of else "none"
    console.print(
        f"Instance prices for {c.region} from {origin} (as of {as_of}); instance facts as of {catalog['as_of']}.",
        markup=False,
        soft_wrap=True,
    )


def _cost_table(c: Any) -> Any:
    """Every hourly figure: each group's views, what else the stack pays for, and the total."""
    from rich.table import Table

    table = Table(title=f"Hourly cost (USD, {c.region})")
    for col in ("item", "capacity", "price", "min", "desired", "max"):
        table.add_column(col)

    def usd(value: float | None) -> str:  # cents an hour (NAT, EBS) stay visible
        return f"${value:,.4f}" if value is not None and 0 < value < 1 else _money(value)

    def row(label: str, capacity: str, view: str, counts: Any) -> None:
        table.add_row(label, capacity, view, *(usd(v) for v in (counts.min, counts.desired, counts.max)))

    for g in c.groups:
        views = [("on-demand", g.on_demand)]
        if g.has_spot_view:  # reserved capacity cannot run on spot: no spot row
            kind = "history" if g.spot_source == "spot-history" else "estimate"
            views.append((f"spot ({kind})", g.spot))
        paid = {"capacity-block": "block rate, paid", "capacity-reservation": "reserved, paid"}.get(g.capacity_type)
        views.append((paid or "as configured", g.as_configured))
        label, capacity = f"{g.name} ({g.instance_type})", g.capacity_type
        for view, counts in views:
            row(label, capacity, view, counts)
            label, capacity = "", ""
    for line in c.infrastructure:
        row(line.item, "", line.detail, line.usd_per_hour)
    if c.monitoring:
        row("monitoring", "", "the monitor (below)", type(c.total)(c.monitoring, c.monitoring, c.monitoring))
    row("nodes", "", "all on-demand", c.on_demand)
    row("total", "", "as configured, all items", c.total)
    return table


def _print_monitoring(result: Any) -> None:
    """What the stack's monitoring costs an hour, next to the cluster it watches."""
    from rich.console import Console

    m = result.monitoring
    if m is None:
        return

    def usd(value: float | None) -> str:  # a monitor's parts are cents an hour: show them
        return "unknown" if value is None else f"${value:,.4f}"

    cluster = result.cost.as_configured
    if m.mode == "off":
        line = "Monitoring: off (no monitor; nodes start no exporters)."
    else:
        if m.mode == "self-hosted":
            what = f"{m.instance_type} {usd(m.instance)} + gp3 TSDB {m.data_volume_gib} GiB and root {usd(m.storage)}"
        else:
            what = (
                f"estimate: AMP ingest {usd(m.amp_ingest)} ({m.samples_per_second:,.0f} samples/s) + "
                f"storage {usd(m.amp_storage)}; queries and Managed Grafana users not included"
            )
        line = f"Monitoring ({m.mode}): {usd(m.total)}/hour ({what}), for ~{m.series:,} series at max nodes"
        views = [("desired", cluster.desired)] + ([("max", cluster.max)] if cluster.max != cluster.desired else [])
        for label, total in views:
            if m.total is not None and total:
                line += f"; {100 * m.total / total:.2f}% of the cluster's {_money(total)}/hour at {label} nodes"
    Console().print(line, markup=False, soft_wrap=True)


def _print_violations(violations: list[Any]) -> None:
    from rich.console import Console

    console = Console()
    if not violations:
        console.print("Policy pack: no violations.")
        return
    console.print(f"[bold red]Policy pack: {len(violations)} violation(s)[/]")
    for v in violations:
        console.print(f"  {v.enforcement}: {v.describe()}", markup=False)


def _print_emergency_save(plans: list[Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    from gpucloud.cluster.emergency_save import NOTICE_LEAD_SECONDS, STOP_MARGIN_SECONDS, budget_seconds

    table = Table(
        title=f"Emergency save: largest checkpoint committed within the {NOTICE_LEAD_SECONDS:g} s notice "
        f"minus the {STOP_MARGIN_SECONDS:g} s stop margin ({budget_seconds():g} s), a job on every node"
    )
    for col in ("group", "nodes", "tier", "GB/s", "max GiB", "expected GiB", "seconds", "fits"):
        table.add_column(col)
    for plan in plans:
        known = plan.expected_gib is not None
        chosen = plan.chosen
        for e in plan.tiers:
            tier = e.tier + ("" if e.durable else " (not durable)") + (" *" if e is chosen else "")
            table.add_row(
                plan.node_group,
                str(plan.nodes),
                tier,
                f"{e.bytes_per_second / 1e9:.2f}",
                f"{e.max_gib:,.0f}",
                f"{plan.expected_gib:g}" if known else "-",
                f"{e.seconds:.0f}" if known else "-",
                ("yes" if e.fits else "NO") if known else "-",
            )
    Console().print(table)
    Console().print(
        "* the fastest durable tier (S3 ranks include staging on the NVMe first). A job without "
        "--checkpoint-uri uses the bucket. Set gpucloud:expectedCheckpointGiB (stack or node group) to check a size.",
        markup=False,
        soft_wrap=True,
    )


def _warn_emergency_save(plans: list[Any]) -> None:
    """One line on stderr per durable tier that the expected checkpoint does not fit through."""
    for plan in plans:
        for e in plan.misses:
            click.echo(
                f"warning: node group {plan.node_group}: a {plan.expected_gib:g} GiB emergency save through "
                f"{e.tier} takes {e.seconds:.0f} s, more than the {e.budget_seconds:g} s a spot notice leaves; "
                f"{e.tier} fits at most {e.max_gib:,.0f} GiB on {plan.nodes} node(s)",
                err=True,
            )
        if (faster := plan.faster_than_default) is not None:
            default = next(e for e in plan.tiers if e.tier == "s3")
            click.echo(
                f"warning: node group {plan.node_group}: {faster.tier} commits an emergency save faster than the "
                f"bucket a job without --checkpoint-uri uses ({faster.bytes_per_second / 1e9:.2f} vs "
                f"{default.bytes_per_second / 1e9:.2f} GB/s on {plan.nodes} node(s)); submit with "
                f"--checkpoint-uri {plan.fsx_path} (off the cluster, declare the mount shared: "
                f"GPUCLOUD_SHARED_PATHS={plan.fsx_path.rsplit('/', 1)[0] or '/'})",
                err=True,
            )


def _require_deploy_extra() -> None:
    """``plan`` evaluates the stack under Pulumi's mocks: it needs the ``deploy`` extra, which nodes
    (and a bare ``pip install gpucloud``) leave out."""
    try:
        import pulumi  # noqa: F401
        import pulumi_aws  # noqa: F401
        import pulumi_policy  # noqa: F401
    except ModuleNotFoundError as missing:
        raise UserError(
            f"gpucloud plan needs the deploy extra ({missing.name} is not installed): "
            "pip install 'gpucloud[deploy]', or run scripts/setup.sh"
        ) from None
