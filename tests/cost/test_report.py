"""gpucloud report: the figures per job, per node group and in total, from hand-made queues."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from cli_run import one_line_error
from cli_run import run_cli as run
from gpucloud.cost.job_cost import catalog_prices, job_cost
from gpucloud.cost.report import JobCostTotals, JobHistory, Utilisation, build
from gpucloud.cost.report_sources import parse_since, read_histories
from gpucloud.lifecycle.model import NodeState
from gpucloud.queue.sqlite import SqliteQueue

from .report_seed import interrupted_job, node, write_sqlite

DAY = 86400.0
T0 = 100 * DAY + 3600.0  # 01:00 UTC on some day: the jobs below stay within it
PAID = 16.0  # GPU-hours: two 1-hour attempts on 8 GPUs
LOST = 1.4667  # (3600 s × 20/120 lost steps + 60 s restart) × 8 GPUs
CHECKPOINT = 0.16  # two 36 s saves × 8 GPUs


def no_price(history, nodes):
    return None


def nodes_now(now: float):
    return [
        node("agent-a", group="p5-spot", lifecycle="spot", state=NodeState.IDLE, updated_at=now, instance="i-a"),
        node("agent-b", group="p5-od", lifecycle="on-demand", state=NodeState.RUNNING, updated_at=now, instance="i-b"),
        node("agent-c", group="p5-spot", lifecycle="spot", state=NodeState.STOPPED, updated_at=now, instance="i-c"),
    ]


def test_a_job_s_figures_come_from_its_timeline_and_utilisation_is_unknown_without_prometheus():
    history = interrupted_job("j1", start=T0)
    report = build([history], [], since=T0 - 60, until=T0 + DAY / 2, cost_of=no_price)
    [line] = report.jobs
    assert line.gpu_hours == PAID
    assert line.lost_gpu_hours == LOST
    assert line.checkpoint_gpu_hours == CHECKPOINT
    assert line.checkpoint_overhead == pytest.approx(CHECKPOINT / PAID, abs=1e-4)
    assert line.goodput == pytest.approx((PAID - LOST - CHECKPOINT) / PAID, abs=1e-4)
    assert (line.interruptions, line.steps_lost) == (1, 20)
    # Unknown, never 0.
    assert line.gpu_utilisation_pct is None and line.idle_gpu_hours is None
    assert line.cost_usd is None
    assert report.totals.idle_gpu_hours is None and report.totals.cost_usd is None
    assert report.totals.waste_rate == pytest.approx((LOST + CHECKPOINT) / PAID, abs=1e-4)
    assert any("utilisation and idle GPU-hours are unknown" in n for n in report.notes)
    assert [(d.cost_usd, d.gpu_hours) for d in report.cost_per_day] == [(None, PAID)]  # unknown, not $0
    assert report.money.unit == "gpu-hours"
    assert report.money.useful + report.money.lost + report.money.checkpoint == pytest.approx(PAID, abs=1e-3)


def test_utilisation_and_idle_hours_count_in_the_waste_rate():
    history = interrupted_job("j1", start=T0)
    utilisation = Utilisation(source="http://prom", per_job={"j1": (42.0, 2.0)}, series=[(T0, 40.0), (T0 + 60, 44.0)])
    report = build([history], [], since=T0 - 60, until=T0 + DAY / 2, cost_of=no_price, utilisation=utilisation)
    [line] = report.jobs
    assert (line.gpu_utilisation_pct, line.idle_gpu_hours) == (42.0, 2.0)
    assert report.totals.waste_rate == pytest.approx((LOST + 2.0 + CHECKPOINT) / PAID, abs=1e-4)
    assert [p.pct for p in report.utilisation_over_time] == [40.0, 44.0]
    assert report.utilisation_source == "http://prom"


def test_a_job_without_samples_is_unknown_even_when_prometheus_answers():
    histories = [interrupted_job("j1", start=T0), interrupted_job("j2", start=T0)]
    utilisation = Utilisation(source="http://prom", per_job={"j1": (80.0, 0.0)}, series=[])
    report = build(histories, [], since=T0 - 60, until=T0 + DAY / 2, cost_of=no_price, utilisation=utilisation)
    by_id = {line.job_id: line for line in report.jobs}
    assert by_id["j1"].idle_gpu_hours == 0.0
    assert by_id["j2"].gpu_utilisation_pct is None and by_id["j2"].idle_gpu_hours is None
    assert any("1 job(s) have no GPU samples" in n for n in report.notes)


def test_the_cost_comes_from_the_cost_function_and_is_split_by_day():
    history = interrupted_job("j1", start=T0 - 3600 - 1800)  # 23:30: the first half hour is the day before
    calls = []

    def priced(h, nodes):
        calls.append(h.job.id)
        return JobCostTotals(cost_usd=100.0, cost_lost_usd=9.0, price_source="estimate")

    report = build([history], [], since=T0 - DAY, until=T0 + DAY / 2, cost_of=priced)
    assert calls == ["j1"]
    [line] = report.jobs
    assert (line.cost_usd, line.cost_lost_usd, line.price_source) == (100.0, 9.0, "estimate")
    days = {d.day: d.cost_usd for d in report.cost_per_day}
    assert sorted(days.values()) == [pytest.approx(25.0), pytest.approx(75.0)]  # 0.5 h of 2 h paid before midnight
    assert report.totals.cost_usd == 100.0
    assert report.money.unit == "usd"
    assert sum(report.money.model_dump(exclude={"unit"}).values()) == pytest.approx(100.0, abs=1e-3)


def test_node_groups_spot_and_on_demand_hours_interruptions_per_hour_and_idle_nodes():
    history = interrupted_job("j1", start=T0, worker="agent-a", next_worker="agent-b")
    now = T0 + DAY / 2
    report = build([history], nodes_now(now), since=T0 - 60, until=now, cost_of=no_price)
    groups = {g.group: g for g in report.groups}
    assert groups["p5-spot"].spot_node_hours == 1.0 and groups["p5-od"].on_demand_node_hours == 1.0
    # The job's group is where its last attempt ran (agent-b, on-demand); its interruption counts there.
    assert report.jobs[0].group == "p5-od"
    assert groups["p5-od"].interruptions_per_hour == 1.0
    assert (groups["p5-spot"].nodes, groups["p5-spot"].idle_nodes) == (1, 1)  # agent-c stopped: not counted
    assert (groups["p5-od"].nodes, groups["p5-od"].idle_nodes) == (1, 0)


def test_only_jobs_active_in_the_window_are_reported():
    old = interrupted_job("old", start=T0 - 3 * DAY)
    new = interrupted_job("new", start=T0)
    report = build([old, new], [], since=T0 - 60, until=T0 + DAY, cost_of=no_price)
    assert [line.job_id for line in report.jobs] == ["new"]


def test_an_empty_window_reports_nothing_and_says_so():
    report = build([], [], since=T0, until=T0 + DAY, cost_of=no_price)
    assert report.jobs == [] and report.totals.waste_rate is None and report.totals.goodput is None
    assert report.notes[0] == "no job ran in this window: the queue has nothing to report"


def test_the_embedded_queue_s_bulk_read_equals_the_per_job_reads(tmp_path: Path):
    histories = [interrupted_job(f"j{i}", start=T0 + i) for i in range(3)]
    histories.append(interrupted_job("gone", start=T0 - 5 * DAY))
    uri = write_sqlite(tmp_path / "q.db", histories)
    queue = SqliteQueue(tmp_path / "q.db", uri=uri)
    try:
        bulk = list(read_histories(queue, T0 - DAY))
        in_chunks_of_two = [JobHistory(*h) for h in queue.histories_since(T0 - DAY, chunk=2)]

        class PerJob:  # the other backends' path: list, then attempts and events per job
            list_jobs, attempts, events = queue.list_jobs, queue.attempts, queue.events

        per_job = list(read_histories(PerJob(), T0 - DAY))
    finally:
        queue.close()
    assert [h.job.id for h in bulk] == ["j0", "j1", "j2"]  # "gone" ended days before; oldest first
    assert bulk == per_job == in_chunks_of_two
    assert bulk[0].attempts == histories[0].attempts and bulk[0].events == histories[0].events


# ------------------------------------------------------------------------------------- the CLI


def test_report_json_over_a_sqlite_queue(tmp_path: Path, capsys):
    now = time.time()
    uri = write_sqlite(tmp_path / "q.db", [interrupted_job("j1", start=now - 7400)], nodes_now(now))
    code, out, err = run(capsys, "report", "--queue", uri, "--since", "3h", "--output", "json")
    assert code == 0, err
    data = json.loads(out)
    assert set(data) == {
        "since", "until", "utilisation_source", "jobs", "groups", "totals", "cost_per_day",
        "utilisation_over_time", "money", "notes",
    }  # fmt: skip
    assert data["since"].endswith("Z") and data["utilisation_source"] is None
    [job] = data["jobs"]
    assert job["job_id"] == "j1" and job["gpu_hours"] == PAID and job["steps_lost"] == 20
    assert job["gpu_utilisation_pct"] is None and job["idle_gpu_hours"] is None
    assert {g["group"] for g in data["groups"]} == {"p5-spot", "p5-od"}
    assert data["totals"]["jobs"] == 1


def test_report_prices_jobs_with_job_cost_and_counts_the_recorded_life_cycle(tmp_path: Path, capsys):
    now = time.time()
    node_info = {"instance_type": "p5.48xlarge", "region": "us-east-1", "availability_zone": "us-east-1a"}
    priced = interrupted_job("j1", start=now - 7400, node_info={**node_info, "lifecycle": "on-demand"})
    unpriced = interrupted_job("j2", start=now - 7400)  # ran before nodes were recorded
    uri = write_sqlite(tmp_path / "q.db", [priced, unpriced])  # no node records: the events tell
    code, out, err = run(capsys, "report", "--queue", uri, "--since", "3h", "--output", "json")
    assert code == 0, err
    data = json.loads(out)
    jobs = {j["job_id"]: j for j in data["jobs"]}
    expected = job_cost(priced.job, priced.attempts, priced.events, catalog_prices(), now=now)
    assert expected.cost_usd is not None and expected.cost_usd > 0
    assert jobs["j1"]["cost_usd"] == pytest.approx(expected.cost_usd, abs=1e-3)
    assert jobs["j1"]["price_source"] == ", ".join(expected.price_sources)
    assert jobs["j2"]["cost_usd"] is None
    assert data["totals"]["cost_usd"] == pytest.approx(expected.cost_usd, abs=0.01)
    assert data["totals"]["jobs_without_cost"] == 1
    [group] = data["groups"]
    assert (group["on_demand_node_hours"], group["unknown_lifecycle_node_hours"]) == (2.0, 2.0)


def test_report_table_marks_unknown_utilisation_and_writes_to_a_file(tmp_path: Path, capsys):
    now = time.time()
    uri = write_sqlite(tmp_path / "q.db", [interrupted_job("j1", start=now - 7400)])
    code, out, err = run(capsys, "report", "--queue", uri, "--since", "3h")
    assert code == 0, err
    assert "jobs: 1   GPU-hours: 16.00" in out and "unknown" in out
    target = tmp_path / "report.txt"
    code, out, err = run(capsys, "report", "--queue", uri, "--since", "3h", "--out", str(target))
    assert code == 0 and out == "" and "report written to" in err
    assert "waste rate:" in target.read_text()


def test_an_empty_queue_reports_that_nothing_ran(tmp_path: Path, capsys, monkeypatch):
    monkeypatch.setenv("GPUCLOUD_HOME", str(tmp_path))
    monkeypatch.delenv("GPUCLOUD_QUEUE", raising=False)
    code, out, _ = run(capsys, "report", "--since", "1h")
    assert code == 0 and "no job ran in this window" in out


@pytest.mark.parametrize(
    "argv, expected",
    [
        (["--since", "3x"], "--since '3x' is not a duration back from now (30m, 24h, 7d, 2w) or an ISO 8601 time"),
        (["--since", "0h"], "--since '0h' is an empty window"),
        (["--since", "2999-01-01T00:00:00Z"], "is in the future"),
        (["--output", "pdf"], "'pdf' is not one of 'table', 'json', 'html'"),
        (["--prometheus", "localhost:9090"], "--prometheus 'localhost:9090' is not an http(s):// URL"),
        (["--out", "s3://bucket-only"], "--out 's3://bucket-only' names no object"),
    ],
)
def test_bad_flags_are_one_line_errors(tmp_path: Path, capsys, argv, expected):
    uri = write_sqlite(tmp_path / "q.db", [])
    code, _, err = run(capsys, "report", "--queue", uri, *argv)
    assert code == 2
    assert expected in one_line_error(err)


def test_an_unwritable_out_file_is_a_one_line_error(tmp_path: Path, capsys):
    uri = write_sqlite(tmp_path / "q.db", [])
    code, _, err = run(capsys, "report", "--queue", uri, "--out", str(tmp_path / "no" / "such" / "dir.txt"))
    assert code == 2 and "cannot write it" in one_line_error(err)


def test_since_reads_durations_and_iso_times():
    now = 1_800_000_000.0
    assert parse_since("24h", now=now) == now - DAY
    assert parse_since("30m", now=now) == now - 1800
    assert parse_since("2w", now=now) == now - 14 * DAY
    assert parse_since("2027-01-15T00:00:00Z", now=now) == now - 8 * 3600  # now is 2027-01-15T08:00:00Z
    assert parse_since("2027-01-15T00:00:00", now=now) == now - 8 * 3600  # no zone: UTC
    assert parse_since("2027-01-15T01:00:00+01:00", now=now) == now - 8 * 3600


def test_the_report_runs_without_the_deploy_extra(tmp_path: Path):
    """The monitor installs gpucloud[report] from the nodes' wheelhouse: no Pulumi there."""
    import subprocess
    import sys

    from tests.infra.test_deploy_extra import BLOCK_PULUMI

    now = time.time()
    uri = write_sqlite(tmp_path / "q.db", [interrupted_job("j1", start=now - 7400)])
    argv = ["report", "--queue", uri, "--since", "3h", "--output", "json"]
    done = subprocess.run([sys.executable, "-c", BLOCK_PULUMI, *argv], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout)["totals"]["jobs"] == 1
