"""The real monitoring tools as processes on 127.0.0.1: node_exporter and a Prometheus server, plus
timed scrapes with their series counted. Used by the end-to-end test and ``benchmarks/bench_scrape.py``.

Debian's packages (``scripts/setup.sh --test`` installs them): ``/usr/bin/prometheus``,
``/usr/bin/prometheus-node-exporter``. Where one is missing the tests skip, unless ``CI=true``.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from typing import Self

from prometheus_client.parser import text_string_to_metric_families

from helpers.waiting import wait_for

PROMETHEUS = "prometheus"
NODE_EXPORTER = "prometheus-node-exporter"  # Debian's name for node_exporter
# node_exporter's flags for the EFA counters: only the infiniband collector (its own Go runtime
# metrics stay on, as on a node).
NODE_EXPORTER_INFINIBAND = ("--collector.disable-defaults", "--collector.infiniband")


def tool(name: str) -> str | None:
    """The tool's path, or None (Debian installs node_exporter as prometheus-node-exporter)."""
    found = shutil.which(name)
    if found is None and name == NODE_EXPORTER:
        found = shutil.which("node_exporter")
    return found


def missing_tools_reason(*names: str) -> str | None:
    """Why a test that needs ``names`` cannot run here, or None."""
    missing = [n for n in names if tool(n) is None]
    if not missing:
        return None
    return f"{', '.join(missing)} not installed (scripts/setup.sh --test installs Debian's packages)"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def http_get(url: str, timeout: float = 10) -> bytes | None:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return response.read()
    except (urllib.error.URLError, ConnectionError, TimeoutError):
        return None


class _Process:
    """A tool started with ``argv``; stopped (terminate, then kill) on exit."""

    def __init__(self, argv: Sequence[str], log: Path) -> None:
        self.argv = list(argv)
        self.log = log
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        self.log.parent.mkdir(parents=True, exist_ok=True)
        with self.log.open("wb") as out:
            self.proc = subprocess.Popen(self.argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.terminate()
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=20)

    def wait_serving(self, url: str, timeout: float, what: str) -> None:
        def ready() -> bool:
            if self.proc is not None and self.proc.poll() is not None:
                raise AssertionError(f"{what} exited {self.proc.returncode}: {self.log.read_text()[-2000:]}")
            return http_get(url, timeout=2) is not None

        wait_for(ready, timeout, f"{what} to serve {url}", every=0.1)

    # A subclass names the URL that answers once it serves, and what it is (for the error).
    ready_url: str
    what: str

    def __enter__(self) -> Self:
        self.start()
        try:
            self.wait_serving(self.ready_url, 60, self.what)
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


class NodeExporter(_Process):
    """node_exporter on 127.0.0.1:<port> reading ``sysfs`` (a fixture tree) for its collectors."""

    def __init__(self, sysfs: Path, log: Path, *, flags: Sequence[str] = NODE_EXPORTER_INFINIBAND) -> None:
        self.port = free_port()
        binary = tool(NODE_EXPORTER)
        assert binary, missing_tools_reason(NODE_EXPORTER)
        super().__init__([binary, f"--path.sysfs={sysfs}", f"--web.listen-address=127.0.0.1:{self.port}", *flags], log)

        self.ready_url, self.what = f"http://{self.address}/metrics", "node_exporter"

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"


class Prometheus(_Process):
    """A Prometheus server on 127.0.0.1:<port> with ``config`` (its rule files beside it) and its TSDB
    in ``data``; ``query``/``series`` use its HTTP API (https://prometheus.io/docs/prometheus/latest/querying/api/)."""

    def __init__(self, config: Path, data: Path, log: Path) -> None:
        self.port = free_port()
        binary = tool(PROMETHEUS)
        assert binary, missing_tools_reason(PROMETHEUS)
        super().__init__(
            [
                binary,
                f"--config.file={config}",
                f"--storage.tsdb.path={data}",
                f"--web.listen-address=127.0.0.1:{self.port}",
                "--web.enable-lifecycle",
                "--log.level=warn",
            ],
            log,
        )

        self.ready_url, self.what = f"{self.url}/-/ready", "prometheus"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def api(self, path: str, **params: str) -> Any:
        url = f"{self.url}/api/v1/{path}?{urllib.parse.urlencode(params)}"
        try:
            with urllib.request.urlopen(url, timeout=30) as response:
                body = json.load(response)
        except urllib.error.HTTPError as err:  # a bad query: the API's error text says why
            body = json.load(err)
        if body.get("status") != "success":
            raise AssertionError(f"{path} {params}: {body.get('errorType')}: {body.get('error')}")
        return body["data"]

    def query(self, expr: str, at: float | None = None) -> list[dict[str, Any]]:
        """An instant query's result (a vector's samples; a scalar as one sample)."""
        params = {"query": expr} | ({"time": f"{at:.3f}"} if at is not None else {})
        data = self.api("query", **params)
        if data["resultType"] in ("scalar", "string"):
            return [{"metric": {}, "value": data["result"]}]
        return data["result"]

    def series_names(self, start: float) -> set[str]:
        """Every metric name with a sample since ``start``."""
        return set(self.api("label/__name__/values", start=f"{start:.3f}"))

    def targets(self) -> list[dict[str, Any]]:
        return self.api("targets")["activeTargets"]


def count_series(exposition: str) -> int:
    """Samples in one scrape of the text format (what Prometheus's ``scrape_samples_scraped`` counts)."""
    return sum(len(family.samples) for family in text_string_to_metric_families(exposition))


def timed_scrape(url: str) -> tuple[float, int]:
    """One GET of a /metrics endpoint: (seconds, series)."""
    start = time.perf_counter()
    body = http_get(url, timeout=30)
    elapsed = time.perf_counter() - start
    if body is None:
        raise AssertionError(f"nothing served at {url}")
    return elapsed, count_series(body.decode())


def ci_requires_tools() -> bool:
    """True when CI asks every tool to be present (CI=true): a missing tool fails instead of skipping."""
    return os.environ.get("CI", "").lower() == "true"
