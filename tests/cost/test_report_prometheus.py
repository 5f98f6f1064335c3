"""gpucloud report reads GPU utilisation from Prometheus's HTTP API (query_range, matrix answers).

The server here answers /api/v1/query_range in the shape Prometheus documents
(https://prometheus.io/docs/prometheus/latest/querying/api/#range-vectors); running the real
Prometheus with exporters is tests/monitoring_e2e's job and would cost minutes here.
"""

from __future__ import annotations

import json
import threading
import time
import urllib.parse
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from gpucloud.cost.report_sources import MAX_POINTS, range_step, read_utilisation, utilisation_from_matrix
from gpucloud.errors import UserError

from .report_seed import interrupted_job, write_sqlite
from .test_report import run

STEP = 60


def matrix(*series: tuple[dict[str, str], list[float]], start: float = 1000.0) -> dict:
    return {
        "status": "success",
        "data": {
            "resultType": "matrix",
            "result": [
                {"metric": labels, "values": [[start + i * STEP, str(v)] for i, v in enumerate(values)]}
                for labels, values in series
            ],
        },
    }


class FakePrometheus:
    def __init__(self, answer: dict | bytes, status: int = 200) -> None:
        self.answer, self.status, self.queries = answer, status, []


@pytest.fixture
def prometheus() -> Iterator[tuple[str, FakePrometheus]]:
    state = FakePrometheus(matrix())

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            url = urllib.parse.urlparse(self.path)
            if url.path != "/api/v1/query_range":
                self.send_error(404)
                return
            state.queries.append(dict(urllib.parse.parse_qsl(url.query)))
            body = state.answer if isinstance(state.answer, bytes) else json.dumps(state.answer).encode()
            self.send_response(state.status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", state
    finally:
        server.shutdown()
        server.server_close()


def test_per_job_mean_idle_hours_and_the_mean_over_time():
    gpu0 = {"job_id": "j1", "instance_id": "i-a", "gpu": "0"}
    gpu1 = {"job_id": "j1", "instance_id": "i-a", "gpu": "1"}
    other = {"job_id": "j2", "instance_id": "i-b", "gpu": "0"}
    body = matrix((gpu0, [90.0, 5.0, 95.0]), (gpu1, [0.0, 100.0, "NaN"]), (other, [50.0, 50.0, 50.0]))  # type: ignore[list-item]
    got = utilisation_from_matrix(body, source="p", step_s=STEP)
    mean, idle = got.per_job["j1"]
    assert mean == pytest.approx((90 + 5 + 95 + 0 + 100) / 5)  # NaN is no sample
    assert idle == pytest.approx(2 * STEP / 3600)  # 5 and 0 are below 10%
    assert got.per_job["j2"] == (50.0, 0.0)
    assert [v for _, v in got.series] == [pytest.approx(140 / 3), pytest.approx(155 / 3), pytest.approx(72.5)]


def test_an_error_answer_is_a_one_line_user_error():
    with pytest.raises(UserError, match="answered the utilisation query with an error: bad_data parse error"):
        utilisation_from_matrix({"status": "error", "error": "bad_data parse error"}, source="p", step_s=STEP)


def test_the_step_keeps_a_month_under_prometheus_s_points_limit():
    assert range_step(0, 3600) == 60
    assert (30 * 86400) / range_step(0, 30 * 86400) <= MAX_POINTS


def test_the_query_joins_gpu_utilisation_on_the_running_attempt(prometheus):
    url, state = prometheus
    state.answer = matrix(({"job_id": "j1", "instance_id": "i-a"}, [40.0]))
    got = read_utilisation(url, since=1000.0, until=4600.0)
    [query] = state.queries
    assert "avg_over_time(DCGM_FI_DEV_GPU_UTIL[60s])" in query["query"]
    assert "on (instance_id) group_left (job_id)" in query["query"]
    assert "gpucloud_attempt_running" in query["query"]
    assert (float(query["start"]), float(query["end"]), query["step"]) == (1000.0, 4600.0, "60")
    assert got.per_job == {"j1": (40.0, 0.0)}


def test_report_with_prometheus_fills_utilisation(prometheus, tmp_path: Path, capsys):
    url, state = prometheus
    now = time.time()
    uri = write_sqlite(
        tmp_path / "q.db", [interrupted_job("j1", start=now - 7400), interrupted_job("j2", start=now - 7400)]
    )
    state.answer = matrix(({"job_id": "j1", "instance_id": "i-a", "gpu": "0"}, [80.0, 2.0]), start=now - 7000)
    code, out, err = run(capsys, "report", "--queue", uri, "--since", "3h", "-o", "json", "--prometheus", url)
    assert code == 0, err
    jobs = {j["job_id"]: j for j in json.loads(out)["jobs"]}
    assert jobs["j1"]["gpu_utilisation_pct"] == 41.0
    assert jobs["j1"]["idle_gpu_hours"] > 0
    assert jobs["j2"]["gpu_utilisation_pct"] is None  # no samples: unknown, not 0


def test_a_prometheus_that_refuses_is_a_one_line_error(prometheus, tmp_path: Path, capsys):
    url, state = prometheus
    state.status = 503
    uri = write_sqlite(tmp_path / "q.db", [])
    code, _, err = run(capsys, "report", "--queue", uri, "--prometheus", url)
    assert code == 2
    assert err.strip() == f"gpucloud: error: Prometheus at {url} refused the utilisation query: HTTP 503"
