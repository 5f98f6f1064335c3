"""``gpucloud report``: the training-efficiency report (GPU-hours, cost, utilisation, waste) over a window."""

from __future__ import annotations

import sys
import time

import click

from gpucloud.commands.options import queue_option
from gpucloud.errors import UserError


@click.command(
    "report",
    epilog="""\b
Examples:
  gpucloud report                                   # the last 24 hours, as tables
  gpucloud report --since 7d --output json          # a week, for scripts
  gpucloud report --since 2026-11-23T00:00:00Z --output html --out report.html
  gpucloud report --prometheus http://localhost:9090 --output html --out report.html
\b
Per job: GPU-hours, cost, GPU utilisation and idle GPU-hours (from Prometheus; "unknown"
without it, never 0), interruptions, steps lost, checkpoint share of time, goodput (useful step
time over paid GPU time). Per node group: spot and on-demand node-hours, interruptions per hour,
idle nodes. Totals and the waste rate: (lost + idle + checkpoint) GPU-hours over paid.
Definitions: docs/cost.md, "The daily report".
""",
)
@queue_option()
@click.option(
    "--since",
    default="24h",
    show_default=True,
    metavar="WHEN",
    help="Start of the window: a duration back from now (30m, 24h, 7d, 2w) or an ISO 8601 time (UTC if no zone).",
)
@click.option(
    "--output",
    "-o",
    type=click.Choice(["table", "json", "html"]),
    default="table",
    show_default=True,
    help="Tables for people, JSON for scripts, or a self-contained HTML page with charts (needs the `report` extra).",
)
@click.option(
    "--out",
    "out_path",
    metavar="FILE",
    help="Write the report to FILE (or s3://BUCKET/KEY) instead of standard output.",
)
@click.option(
    "--prometheus",
    "prometheus_url",
    metavar="URL",
    envvar="GPUCLOUD_PROMETHEUS_URL",
    help="Prometheus to read GPU utilisation from (default: $GPUCLOUD_PROMETHEUS_URL; none: utilisation unknown).",
)
def report(queue_uri, since, output, out_path, prometheus_url) -> None:
    """The training-efficiency report over a window: what each job cost, and how much was wasted."""
    from gpucloud.cost import report as model
    from gpucloud.cost.report_sources import job_cost_function, parse_since, read_histories, read_utilisation
    from gpucloud.queue.connect import open_queue

    now = time.time()
    start = parse_since(since, now=now)
    if output == "html":
        from gpucloud.cost.report_html import require_matplotlib

        require_matplotlib()  # before any reading: a missing extra is said at once
    utilisation = read_utilisation(prometheus_url, since=start, until=now) if prometheus_url else None
    queue = open_queue(queue_uri)
    try:  # the jobs are read as the report is built, a chunk at a time
        built = model.build(
            read_histories(queue, start),
            queue.nodes(),
            since=start,
            until=now,
            cost_of=job_cost_function(now=now),
            utilisation=utilisation,
        )
    finally:
        queue.close()
    text = _render(built, output, to_file=out_path is not None)
    if text is None:
        return
    if out_path is None:
        sys.stdout.write(text)
        return
    _write(out_path, text, output)
    click.echo(f"report written to {out_path}", err=True)


def _render(built, output: str, *, to_file: bool) -> str | None:
    from gpucloud.cost import report_text

    if output == "json":
        import json

        from gpucloud.output import iso_time, iso_times

        data = iso_times(built.model_dump(mode="json"))
        data["since"], data["until"] = iso_time(built.since), iso_time(built.until)
        return json.dumps(data, indent=2, allow_nan=False) + "\n"
    if output == "html":
        from gpucloud.cost.report_html import render_html

        return render_html(built)
    if to_file:
        from gpucloud.cost.report_text import GROUP_COLUMNS, JOB_COLUMNS, group_rows, job_rows

        lines = [report_text.summary(built), "", "\t".join(JOB_COLUMNS)]
        lines += ["\t".join(row) for row in job_rows(built)]
        lines += ["", "\t".join(GROUP_COLUMNS), *("\t".join(row) for row in group_rows(built))]
        return "\n".join(lines) + "\n"
    from gpucloud.output import print_table

    click.echo(report_text.summary(built))
    if built.jobs:
        print_table("jobs", report_text.JOB_COLUMNS, report_text.job_rows(built))
    if built.groups:
        print_table("node groups", report_text.GROUP_COLUMNS, report_text.group_rows(built))
    return None


def _write(path: str, text: str, output: str) -> None:
    if path.startswith("s3://"):
        _put_s3(path, text, output)
        return
    try:
        with open(path, "w", encoding="utf-8") as handle:
            handle.write(text)
    except OSError as err:
        raise UserError(f"--out {path!r}: cannot write it ({err.strerror or err})") from None


def _put_s3(uri: str, text: str, output: str) -> None:
    bucket, _, key = uri[len("s3://") :].partition("/")
    if not bucket or not key or key.endswith("/"):
        raise UserError(f"--out {uri!r} names no object; use s3://BUCKET/KEY, e.g. s3://my-bucket/reports/today.html")
    import boto3
    import botocore.exceptions

    content_type = {"html": "text/html; charset=utf-8", "json": "application/json"}.get(output, "text/plain")
    try:
        boto3.client("s3").put_object(Bucket=bucket, Key=key, Body=text.encode(), ContentType=content_type)
    except (botocore.exceptions.BotoCoreError, botocore.exceptions.ClientError) as err:
        raise UserError(f"--out {uri}: cannot write it: {err}") from None
