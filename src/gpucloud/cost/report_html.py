"""The report as one self-contained HTML page: summary, charts (inline SVG drawn by matplotlib), tables.

Self-contained means the page makes no request at all: no script, no stylesheet, font or image
from elsewhere; the charts are ``<svg>`` elements in the page (text drawn as glyph paths, so no
font is fetched either). ``tests/cost/test_report_html.py`` renders it in headless Chromium and
checks both.
"""

from __future__ import annotations

import datetime
import html
import io
import re
from typing import Any

from gpucloud.cost.report import Report
from gpucloud.cost.report_text import GROUP_COLUMNS, JOB_COLUMNS, group_rows, job_rows, summary
from gpucloud.errors import UserError

MAX_JOB_ROWS = 500  # the page lists the costliest jobs; --output json has them all
EXTRA_HINT = "pip install 'gpucloud[report]'"


def require_matplotlib() -> None:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise UserError(
            f"--output html draws its charts with matplotlib, which is not installed; install the report extra "
            f"({EXTRA_HINT}) or use --output table|json"
        ) from None


def render_html(report: Report) -> str:
    require_matplotlib()
    ranked = sorted(report.jobs, key=lambda j: (j.cost_usd or 0.0, j.gpu_hours), reverse=True)
    shown = report.model_copy(update={"jobs": ranked[:MAX_JOB_ROWS]})
    more = len(report.jobs) - len(shown.jobs)
    charts = [
        ("Cost per day", _cost_per_day(report)),
        ("GPU utilisation over time", _utilisation(report)),
        ("Where the money went", _money(report)),
    ]
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        # No request may leave the page: the policy says so to the browser as well.
        "<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; style-src 'unsafe-inline'\">",
        f"<title>gpucloud report {html.escape(_date(report.since))} .. {html.escape(_date(report.until))}</title>",
        f"<style>{_CSS}</style></head><body>",
        "<h1>gpucloud training-efficiency report</h1>",
        f'<pre class="summary">{html.escape(summary(report))}</pre>',
        '<div class="charts">',
        *(
            f'<figure class="chart" data-chart="{i}"><figcaption>{t}</figcaption>{svg}</figure>'
            for i, (t, svg) in enumerate(charts)
        ),
        "</div>",
        "<h2>Jobs</h2>",
        _table(JOB_COLUMNS, job_rows(shown)),
        f"<p>{more} cheaper job(s) not listed; <code>--output json</code> has every job.</p>" if more > 0 else "",
        "<h2>Node groups</h2>",
        _table(GROUP_COLUMNS, group_rows(report)),
        "<p>Definitions: docs/cost.md, &ldquo;The daily report&rdquo;.</p>",
        "</body></html>",
    ]
    return "\n".join(parts) + "\n"


_CSS = (
    "body{font-family:sans-serif;margin:1.5em;color:#222}"
    "table{border-collapse:collapse;font-size:.85em}td,th{border:1px solid #ccc;padding:.2em .5em;text-align:right}"
    "td:first-child,th:first-child{text-align:left}.charts{display:flex;flex-wrap:wrap;gap:1em}"
    "figure{margin:0}figcaption{font-weight:bold}.summary{background:#f6f6f6;padding:.6em}"
)


def _table(columns: list[str], rows: list[list[str]]) -> str:
    head = "".join(f"<th>{html.escape(c)}</th>" for c in columns)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(v)}</td>" for v in row) + "</tr>" for row in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _date(epoch: float) -> str:
    return datetime.datetime.fromtimestamp(epoch, tz=datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")


def _figure() -> tuple[Any, Any]:
    from matplotlib.figure import Figure

    # Figure, not pyplot: no global state, no GUI backend.
    figure = Figure(figsize=(6.4, 3.2), dpi=100)
    return figure, figure.add_subplot()


def _svg(figure: Any, salt: str) -> str:
    import matplotlib

    # A salt per chart: several SVGs in one page must not share the ids of their clip paths.
    with matplotlib.rc_context({"svg.hashsalt": salt, "svg.fonttype": "path"}):
        buffer = io.StringIO()
        figure.savefig(buffer, format="svg", bbox_inches="tight", metadata={"Date": None})
    text = buffer.getvalue()
    text = text[text.index("<svg") :]  # inline: no XML declaration or DOCTYPE (it names a DTD URL)
    return re.sub(r"<metadata>.*?</metadata>", "", text, flags=re.S)


def _cost_per_day(report: Report) -> str:
    figure, axes = _figure()
    priced = report.totals.cost_usd is not None
    days = [d.day for d in report.cost_per_day]
    values = [(d.cost_usd or 0.0) if priced else d.gpu_hours for d in report.cost_per_day]
    axes.bar(days, values, color="#4878a8")
    axes.set_ylabel("USD" if priced else "GPU-hours (no prices known)")
    if not days:
        axes.text(0.5, 0.5, "no job ran in this window", ha="center", va="center", transform=axes.transAxes)
    axes.tick_params(axis="x", labelrotation=45)
    return _svg(figure, "cost-per-day")


def _utilisation(report: Report) -> str:
    import matplotlib.dates as mdates

    figure, axes = _figure()
    points = report.utilisation_over_time
    if points:
        times = [datetime.datetime.fromtimestamp(p.at, tz=datetime.timezone.utc) for p in points]
        axes.plot(times, [p.pct for p in points], color="#2a9d5c")
        axes.xaxis.set_major_formatter(mdates.DateFormatter("%m-%d %H:%M"))
        axes.tick_params(axis="x", labelrotation=45)
    else:
        axes.text(
            0.5,
            0.5,
            "unknown: no GPU samples (monitoring off, or no Prometheus given)",
            ha="center",
            va="center",
            transform=axes.transAxes,
        )
    axes.set_ylim(0, 100)
    axes.set_ylabel("mean GPU utilisation, %")
    return _svg(figure, "utilisation")


def _money(report: Report) -> str:
    figure, axes = _figure()
    split = report.money
    labels = ["useful", "lost (interruptions)", "idle GPUs", "checkpoint saves"]
    values = [split.useful, split.lost, split.idle, split.checkpoint]
    axes.barh(labels, values, color=["#2a9d5c", "#d1495b", "#edae49", "#4878a8"])
    axes.invert_yaxis()
    axes.set_xlabel("USD" if split.unit == "usd" else "GPU-hours (no prices known)")
    return _svg(figure, "money")
