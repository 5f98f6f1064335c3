"""Dollars per job on every backend: the node each attempt ran on travels in the
started/exit events' data (no schema change), and jobs recorded before it are still read."""

from __future__ import annotations

import pytest

from gpucloud.cost.job_cost import job_cost
from gpucloud.queue.protocol import JobQueue
from helpers.job_histories import ON_DEMAND_NODE_B, SPOT_NODE_A, record_history, spot_then_on_demand


class Price:
    def __init__(self, usd: float, source: str) -> None:
        self.usd_per_hour, self.source, self.as_of = usd, source, "2026-11-01"


def prices(instance_type, region, lifecycle, az=None, at=None):
    return Price(10.0, "spot-history") if lifecycle == "spot" else Price(20.0, "on-demand")


def record_interrupted_job(jq: JobQueue, *, with_nodes: bool = True) -> str:
    """The spot-then-on-demand history (``helpers.job_histories``), recorded through ``jq``'s own calls."""
    return record_history(jq, spot_then_on_demand(with_nodes=with_nodes))


def test_the_nodes_travel_in_the_events_and_price_the_job(jq: JobQueue):
    job_id = record_interrupted_job(jq)
    events = jq.events(job_id)
    assert [e.data["node"] for e in events if e.kind in ("started", "exit")] == [
        SPOT_NODE_A,
        SPOT_NODE_A,
        ON_DEMAND_NODE_B,
        ON_DEMAND_NODE_B,
    ]
    cost = job_cost(jq.get(job_id), jq.attempts(job_id), events, prices, now=10_000)
    assert cost.cost_usd == pytest.approx(10.0 + 20.0)  # an hour of each
    assert cost.on_demand_equivalent_usd == pytest.approx(40.0) and cost.savings_pct == pytest.approx(25.0)
    # lost: 50 of 100 steps over 0..3000 at $10/h; restart: A 3000..3600 + B 4000..4100 at $20/h
    assert cost.cost_lost_usd == pytest.approx(10 * 3000 / 3600 * 0.5 + 10 * 600 / 3600 + 20 * 100 / 3600)
    assert cost.price_sources == ["on-demand", "spot-history"]


def test_a_job_recorded_before_nodes_were_is_read_and_unpriced(jq: JobQueue):
    job_id = record_interrupted_job(jq, with_nodes=False)
    cost = job_cost(jq.get(job_id), jq.attempts(job_id), jq.events(job_id), prices, now=10_000)
    assert cost.cost_usd is None and len(cost.attempts) == 2
    assert "no instance type recorded" in cost.unknown_reasons[0]
