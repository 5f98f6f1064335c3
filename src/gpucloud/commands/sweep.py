"""``gpucloud sweep``: find (and with ``--delete``, delete) what gpucloud stacks left in a region.

Thin: ``gpucloud.teardown`` lists, decides and deletes; this module checks the flags and prints.
"""

from __future__ import annotations

import datetime as dt

import click

from gpucloud.errors import UserError
from gpucloud.output import output_option, print_json, print_table

REGION_FORMAT = "e.g. us-east-1"


@click.command("sweep")
@click.option(
    "--region", "region", required=True, metavar="R", help="The AWS region to sweep (IAM is global: it is swept too)."
)
@click.option("--stack", "stack", metavar="NAME", help="Only resources tagged gpucloud:stack=NAME.")
@click.option("--all", "all_stacks", is_flag=True, help="Resources of every gpucloud stack (any gpucloud:stack value).")
@click.option(
    "--older-than",
    "older_than",
    metavar="AGE",
    help="Only resources created more than AGE ago (6h, 30m, 2d). A resource AWS gives no creation time "
    "for (a VPC, a queue) counts as old as its stack's oldest known resource.",
)
@click.option(
    "--expired", is_flag=True, help="Only resources whose gpucloud:expires-at (gpucloud:ttlHours) has passed."
)
@click.option(
    "--delete", is_flag=True, help="Delete them, in dependency order. Without it: a dry run that deletes nothing."
)
@output_option()
def sweep(
    region: str,
    stack: str | None,
    all_stacks: bool,
    older_than: str | None,
    expired: bool,
    delete: bool,
    output: str,
) -> None:
    """Find every resource tagged gpucloud:stack in a region, across services, and delete it with --delete.

    \b
    Never touches a resource without the gpucloud:stack tag, nor one tagged gpucloud:keep (any case; any value but false/no/0/off).
    Deletes groups and instances first, buckets last (emptied of every version, delete marker and
    unfinished upload), and retries, with backoff, what AWS says is still in use.

    \b
    gpucloud sweep --region us-east-1 --stack ci-1234                 # dry run: what would go
    gpucloud sweep --region us-east-1 --all --older-than 6h --delete  # what CI runs nightly
    gpucloud sweep --region us-east-1 --all --expired --delete -o json
    """
    from gpucloud.teardown.plan import Selection, parse_duration

    if all_stacks == (stack is not None):
        raise UserError("give exactly one of --stack NAME or --all (every gpucloud stack in the region)")
    if not _looks_like_region(region):
        raise UserError(f"--region {region!r} is not an AWS region name; {REGION_FORMAT}")
    selection = Selection(
        stack=stack,
        older_than=parse_duration(older_than) if older_than is not None else None,
        expired_only=expired,
    )
    outcomes = _run(region, selection, delete)
    if output == "json":
        print_json({"region": region, "delete": delete, "resources": [o.to_json() for o in outcomes]})
    else:
        rows = [
            (
                o.decision.found.kind,
                o.decision.found.ident,
                o.decision.found.stack,
                o.action,
                o.result,
                _usd(o.usd_per_hour),
            )
            for o in outcomes
        ]
        print_table(
            f"sweep {region}" + ("" if delete else " (dry run)"),
            ["type", "id", "stack", "action", "result", "USD/h"],
            rows,
        )
    if any(o.result.startswith("failed") for o in outcomes):
        raise SystemExit(1)  # CI's final cleanup step fails loudly when something is left


def _usd(value: float | None) -> str:
    return "" if value is None else f"{value:.4f}"


def _looks_like_region(region: str) -> bool:
    import re

    return re.fullmatch(r"[a-z]{2}(-gov|-iso[a-z]?)?-[a-z]+-\d", region) is not None


def _run(region: str, selection, delete: bool):
    import boto3
    from botocore.exceptions import BotoCoreError, ClientError

    from gpucloud.teardown.sweep import sweep as run_sweep

    session = boto3.session.Session(region_name=region)
    if session.get_credentials() is None:  # botocore's chain found nothing: no request would be signed
        raise UserError(
            "no AWS credentials found, so the sweep asked AWS nothing; configure them (aws configure, AWS_PROFILE, "
            "AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, or an instance role) and run it again"
        )
    clients: dict[str, object] = {}

    def client(service: str):
        if service not in clients:
            clients[service] = session.client(service)
        return clients[service]

    try:
        return run_sweep(
            client,
            region,
            selection,
            delete=delete,
            now=dt.datetime.now(dt.timezone.utc),
            progress=lambda line: click.echo(f"sweep: {line}", err=True),
        )
    except ClientError as err:
        raise UserError(f"AWS refused the sweep's listing: {' '.join(str(err).split())}") from None
    except BotoCoreError as err:  # no answer from AWS (endpoint unreachable, credentials unusable)
        raise UserError(f"the sweep could not ask AWS for its listing: {' '.join(str(err).split())}") from None
