"""``gpucloud doctor``: check this node against the catalog and the pinned image versions."""

from __future__ import annotations

from pathlib import Path

import click

from gpucloud.output import output_option, print_json, print_table

_STATUS_STYLE = {"pass": "[green]pass[/]", "warn": "[yellow]warn[/]", "fail": "[red]FAIL[/]", "skip": "[dim]skip[/]"}


def _none_or_path(value: str) -> str | None:
    return None if value.strip().lower() in ("", "none", "-") else value


@click.command("doctor")
@click.option(
    "--instance-type",
    default=None,
    metavar="TYPE",
    help="Instance type to expect (GPU and EFA counts come from the catalog).  [default: read from IMDS]",
)
@click.option(
    "--matrix",
    "matrix_file",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Version matrix to compare driver/CUDA/NCCL/EFA against.  [default: images/versions.yaml "
    "if present, else version checks are skipped]",
)
@click.option(
    "--fsx-mount",
    default="/fsx",
    show_default=True,
    metavar="PATH|none",
    help="Where FSx for Lustre should be mounted; 'none' when the stack has no FSx.",
)
@click.option(
    "--scratch-mount",
    default="/scratch",
    show_default=True,
    metavar="PATH|none",
    help="Where the instance-store NVMe volume should be mounted (/opt/dlami/nvme also counts).",
)
@click.option("--agent-unit", default="gpucloud-agent", show_default=True, help="systemd unit of the node agent.")
@click.option(
    "--imds-endpoint",
    default=None,
    metavar="URL",
    help="IMDS base URL.  [default: $AWS_EC2_METADATA_SERVICE_ENDPOINT or http://169.254.169.254]",
)
@click.option(
    "--recorded",
    "recorded_dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Check outputs recorded earlier (a --record directory) instead of this machine.",
)
@click.option(
    "--record",
    "record_dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Also save the raw outputs to this directory (attach it to a support ticket).",
)
@output_option()
def doctor(
    instance_type: str | None,
    matrix_file: Path | None,
    fsx_mount: str,
    scratch_mount: str,
    agent_unit: str,
    imds_endpoint: str | None,
    recorded_dir: Path | None,
    record_dir: Path | None,
    output: str,
) -> None:
    """Check this node: GPUs, drivers, EFA, NCCL environment, mounts, IMDS and the agent.

    Every check says pass, warn, fail or skip (does not apply here), with the fix. Exits 1 when a
    check fails. Run it on a node after boot, or against a recorded capture:

    \b
      gpucloud doctor                                    # on the node, type read from IMDS
      gpucloud doctor --record /tmp/node-42              # same, and keep the raw outputs
      gpucloud doctor --recorded /tmp/node-42 --instance-type p5.48xlarge --output json
    """
    from gpucloud.catalog import get_instance_type
    from gpucloud.doctor.capture import IMDS
    from gpucloud.doctor.checks import UNITS_CHECKED, Expectations, overall, run_checks
    from gpucloud.doctor.collect import collect_live, load_recorded, save_recorded
    from gpucloud.doctor.parsers import ParseError, parse_imds
    from gpucloud.errors import UserError
    from gpucloud.image.matrix import DEFAULT_MATRIX_PATH, VersionMatrix, load_matrix

    if instance_type is not None:
        get_instance_type(instance_type)  # an unknown type is a user mistake: fail before collecting
    matrix: VersionMatrix | None
    if matrix_file is not None:
        matrix = load_matrix(matrix_file)
    else:
        matrix = load_matrix(DEFAULT_MATRIX_PATH) if DEFAULT_MATRIX_PATH.is_file() else None

    if recorded_dir is not None:
        node = load_recorded(recorded_dir)
    else:
        units = [agent_unit, *UNITS_CHECKED]
        if output == "table":
            from rich.console import Console

            with Console(stderr=True).status("collecting nvidia-smi, fi_info, mounts, IMDS ..."):
                node = collect_live(units, imds_endpoint)
        else:
            node = collect_live(units, imds_endpoint)
    if record_dir is not None:
        saved = save_recorded(node, record_dir)
        click.echo(f"recorded {saved} outputs to {record_dir}", err=True)

    if instance_type is None and node.get(IMDS) is not None:
        try:
            instance_type = parse_imds(node.get(IMDS) or "").instance_type
        except ParseError:
            instance_type = None
    it = None
    if instance_type is not None:
        try:
            it = get_instance_type(instance_type)
        except UserError:  # a type IMDS reports but the catalog lacks: checks that need it say skip
            it = None

    want = Expectations(it, matrix, _none_or_path(fsx_mount), _none_or_path(scratch_mount), agent_unit)
    results = run_checks(node, want)
    verdict = overall(results)
    if output == "json":
        print_json({"instance_type": instance_type, "overall": verdict, "checks": [r.to_dict() for r in results]})
    else:
        print_table(
            f"gpucloud doctor: {instance_type or 'unknown instance type'}",
            ["Check", "Status", "Observed", "Expected", "Fix"],
            [(r.check, _STATUS_STYLE[r.status], r.observed, r.expected, r.fix) for r in results],
        )
        counts = {s: sum(r.status == s for r in results) for s in ("pass", "warn", "fail", "skip")}
        click.echo(f"{len(results)} checks: " + ", ".join(f"{n} {s}" for s, n in counts.items()))
    if verdict == "fail":
        raise click.exceptions.Exit(1)
