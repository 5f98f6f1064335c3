"""The HTML report: one self-contained page whose charts Chromium draws, and from which no request leaves.

Rendered in Debian's headless ``chromium`` (scripts/setup.sh --test installs it; skipped with the
reason when it is absent, except in CI). Requests are read from Chromium's own network log
(``--log-net-log``): a request the page makes carries the page's origin as its initiator, while
Chromium's background requests (component updates, time sync) carry none ("not an origin").
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gpucloud.cost.report import Utilisation, build
from gpucloud.cost.report_html import render_html
from gpucloud.errors import UserError

from .report_seed import interrupted_job, write_sqlite
from .test_report import DAY, T0, no_price, one_line_error, run

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
needs_chromium = pytest.mark.skipif(
    CHROMIUM is None and os.environ.get("CI") != "true",
    reason="Debian's chromium is not installed (scripts/setup.sh --test installs it)",
)
# Chromium's flags for a quiet, offline, throw-away browser; every name resolves to nothing.
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--host-resolver-rules=MAP * ~NOTFOUND",
]
URL_IN_ATTRIBUTE = re.compile(r"""(?:src|href)\s*=\s*["']?\s*(?:https?:)?//|url\(\s*["']?\s*(?:https?:)?//""", re.I)


def a_report(*, with_utilisation: bool = True):
    histories = [interrupted_job(f"j{i}", start=T0 - i * DAY / 2) for i in range(4)]
    utilisation = (
        Utilisation(
            source="http://prom",
            per_job={"j0": (35.0, 1.0)},
            series=[(T0 + i * 600, 30.0 + (i % 5) * 10) for i in range(12)],
        )
        if with_utilisation
        else None
    )
    return build(histories, [], since=T0 - 2 * DAY, until=T0 + DAY, cost_of=no_price, utilisation=utilisation)


def chromium(page: Path, work: Path, *extra: str) -> tuple[subprocess.CompletedProcess[str], list[dict]]:
    """Load ``page`` once; Chromium's result and the page's own requests from its network log."""
    assert CHROMIUM is not None
    net_log = work / "net.json"
    result = subprocess.run(
        [CHROMIUM, *FLAGS, f"--user-data-dir={work / 'profile'}", f"--log-net-log={net_log}", *extra, page.as_uri()],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=work,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    return result, page_requests(json.loads(net_log.read_text()))


def page_requests(net_log: dict) -> list[dict]:
    start_job = net_log["constants"]["logEventTypes"]["URL_REQUEST_START_JOB"]
    return [
        event["params"]
        for event in net_log["events"]
        if event["type"] == start_job and event.get("params", {}).get("initiator", "not an origin") != "not an origin"
    ]


@needs_chromium
def test_the_charts_are_drawn_and_no_request_leaves_the_page(tmp_path: Path):
    page = tmp_path / "report.html"
    page.write_text(render_html(a_report()), encoding="utf-8")
    result, requests = chromium(page, tmp_path, "--dump-dom")
    dom = result.stdout
    assert requests == []
    charts = re.findall(r'<figure class="chart" data-chart="\d">(.*?)</figure>', dom, re.S)
    assert len(charts) == 3
    cost_per_day, utilisation, money = charts
    for chart in charts:
        assert "<svg" in chart and chart.count("<path") > 10  # axes, ticks and glyphs at least
    # The plotted elements: bars (one patch per day / per share) and the utilisation line.
    assert len(re.findall(r'<g id="patch_\d+"', cost_per_day)) >= 1 + 3  # the axes' background, a bar per day
    assert len(re.findall(r'<g id="patch_\d+"', money)) >= 1 + 4
    assert re.search(r'<g id="line2d_\d+">\s*<path d="M [^"]+L [^"]+" clip-path=', utilisation)
    assert not URL_IN_ATTRIBUTE.search(page.read_text())


@needs_chromium
def test_the_screenshot_is_not_blank(tmp_path: Path):
    import matplotlib.image

    page = tmp_path / "report.html"
    page.write_text(render_html(a_report()), encoding="utf-8")
    chromium(page, tmp_path, "--screenshot", "--window-size=1400,1000", "--hide-scrollbars")
    pixels = matplotlib.image.imread(tmp_path / "screenshot.png")
    colours = {tuple(p) for p in pixels[::7, ::7].reshape(-1, pixels.shape[-1]).tolist()}
    assert pixels.shape[:2] == (1000, 1400)
    assert len(colours) > 20  # a blank page is one colour; the charts bring the bars' and line's


@needs_chromium
def test_the_request_check_catches_a_page_that_fetches(tmp_path: Path):
    """The check above can fail: a page with a remote image (and no CSP) is caught by both tests."""
    page = tmp_path / "leaky.html"
    page.write_text('<html><body><img src="http://example.invalid/chart.png"></body></html>', encoding="utf-8")
    _, requests = chromium(page, tmp_path, "--dump-dom")
    assert [r["url"] for r in requests] == ["http://example.invalid/chart.png"]
    assert URL_IN_ATTRIBUTE.search(page.read_text())


def test_unknown_utilisation_is_said_on_the_page_not_drawn_as_zero():
    page = render_html(a_report(with_utilisation=False))
    assert "unknown: no GPU samples (monitoring off, or no Prometheus given)" in page  # the chart's text
    assert "GPU util" in page and ">unknown<" in page  # and the table's
    assert "utilisation and idle GPU-hours are unknown" in page


def test_html_without_matplotlib_is_a_one_line_error_naming_the_extra(tmp_path: Path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib raises ImportError
    uri = write_sqlite(tmp_path / "q.db", [])
    code, _, err = run(capsys, "report", "--queue", uri, "--output", "html", "--out", str(tmp_path / "r.html"))
    assert code == 2
    assert "install the report extra (pip install 'gpucloud[report]')" in one_line_error(err)
    assert not (tmp_path / "r.html").exists()
    with pytest.raises(UserError):
        render_html(a_report())
    code, out, _ = run(capsys, "report", "--queue", uri, "--output", "json")
    assert code == 0 and json.loads(out)["jobs"] == []  # json and table need no matplotlib


def test_html_to_standard_output_and_to_a_file(tmp_path: Path, capsys):
    now = time.time()
    uri = write_sqlite(tmp_path / "q.db", [interrupted_job("j1", start=now - 7400)])
    code, out, err = run(capsys, "report", "--queue", uri, "--since", "3h", "--output", "html")
    assert code == 0, err
    assert out.startswith("<!DOCTYPE html>") and out.count("<svg") == 3
    code, _, err = run(
        capsys, "report", "--queue", uri, "--since", "3h", "-o", "html", "--out", str(tmp_path / "r.html")
    )
    assert code == 0 and (tmp_path / "r.html").read_text().count("<svg") == 3
