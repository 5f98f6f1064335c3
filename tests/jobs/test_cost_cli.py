"""`gpucloud job show` and `gpucloud jobs` report dollars: the table at 80
columns and --output json, with the price source used."""

from __future__ import annotations

import datetime
import json

import pytest

from gpucloud.catalog.pricing import hourly_price
from gpucloud.queue.sqlite import SqliteQueue
from helpers.job_histories import SPOT_NODE_A, record_history, spot_then_on_demand

from .test_cli import run


def _at(epoch: float) -> datetime.datetime:
    return datetime.datetime.fromtimestamp(epoch, tz=datetime.timezone.utc)


@pytest.fixture
def recorded(tmp_path):
    db = tmp_path / "q.db"
    queue = SqliteQueue(db)
    job_id = record_history(queue, spot_then_on_demand())
    queue.close()
    return f"sqlite:///{db}", job_id


def expected_dollars() -> tuple[float, float, str]:
    """An hour on spot p4d in us-east-1a (from 0) and an hour on demand (from 4000), as the catalog says."""
    spot = hourly_price("p4d.24xlarge", "us-east-1", "spot", az="us-east-1a", at=_at(0))
    on_demand = hourly_price("p4d.24xlarge", "us-east-1", "on-demand", az="us-east-1b", at=_at(4000))
    return spot.usd_per_hour + on_demand.usd_per_hour, 2 * on_demand.usd_per_hour, spot.source


def test_job_show_json_has_the_dollars_and_the_price_source(capsys, recorded):
    db, job_id = recorded
    code, out, _ = run(capsys, "job", "show", job_id, "--queue", db, "--output", "json")
    assert code == 0
    cost = json.loads(out)["cost"]
    total, on_demand, spot_source = expected_dollars()
    assert cost["cost_usd"] == pytest.approx(total)
    assert cost["on_demand_equivalent_usd"] == pytest.approx(on_demand)
    assert cost["savings_usd"] == pytest.approx(on_demand - total)
    assert cost["cost_lost_usd"] > 0 and cost["price_sources"] == sorted({spot_source, "on-demand"})
    first = cost["attempts"][0]["nodes"][0]
    assert (first["instance_type"], first["lifecycle"], first["availability_zone"]) == (
        "p4d.24xlarge",
        "spot",
        SPOT_NODE_A["availability_zone"],
    )
    assert first["price_source"] == spot_source and first["price_as_of"]


def test_job_show_table_fits_80_columns_with_the_cost(capsys, recorded, monkeypatch):
    monkeypatch.setenv("COLUMNS", "80")
    db, job_id = recorded
    code, out, _ = run(capsys, "job", "show", job_id, "--queue", db)
    assert code == 0
    assert max(len(line) for line in out.splitlines()) <= 80
    total, on_demand, _ = expected_dollars()
    assert "cost (USD)" in out
    assert (
        f"cost: {total:,.2f} USD" in out
        and "node=i-a p4d.24xlarge spot us-east-1a" in out
        and f"on-demand equivalent: {on_demand:,.2f}" in out
    )


def test_jobs_lists_the_cost_in_the_table_and_json(capsys, recorded, monkeypatch):
    monkeypatch.setenv("COLUMNS", "80")
    db, _ = recorded
    total, on_demand, spot_source = expected_dollars()
    code, out, _ = run(capsys, "jobs", "--queue", db)
    assert code == 0 and f"{total:,.2f}" in out and max(len(line) for line in out.splitlines()) <= 80
    code, out, _ = run(capsys, "jobs", "--queue", db, "--output", "json")
    [row] = json.loads(out)
    assert row["cost_usd"] == pytest.approx(total, abs=1e-4)
    assert row["on_demand_equivalent_usd"] == pytest.approx(on_demand, abs=1e-4)
    assert row["price_sources"] == sorted({spot_source, "on-demand"}) and row["cost_unknown"] == []


def test_an_unpriced_job_shows_a_question_mark_and_says_why(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")
    queue = SqliteQueue(tmp_path / "q.db")
    job_id = record_history(queue, spot_then_on_demand(with_nodes=False))
    queue.close()
    code, out, _ = run(capsys, "job", "show", job_id, "--queue", f"sqlite:///{tmp_path / 'q.db'}")
    assert code == 0 and "cost: ? USD" in out
    assert "cost unknown: attempt 1: no instance type recorded" in out
    code, out, _ = run(capsys, "jobs", "--queue", f"sqlite:///{tmp_path / 'q.db'}", "--output", "json")
    assert json.loads(out)[0]["cost_usd"] is None and json.loads(out)[0]["cost_unknown"]
