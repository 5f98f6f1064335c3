"""Dollars per job on every backend: the node each attempt ran on travels in the
started/exit events' data (no schema change), and jobs recorded before it are still read."""

from __future__ import annotations

import pytest

from gpucloud.cost.job_cost import job_cost
from gpucloud.lifecycle.model import AttemptEnd, AttemptState, JobSpec
from gpucloud.queue.protocol import JobQueue

NODE_A = {
    "worker": "i-a:1",
    "instance_id": "i-a",
    "instance_type": "p4d.24xlarge",
    "lifecycle": "spot",
    "availability_zone": "us-east-1a",
    "region": "us-east-1",
}
NODE_B = {
    **NODE_A,
    "worker": "i-b:1",
    "instance_id": "i-b",
    "lifecycle": "on-demand",
    "availability_zone": "us-east-1b",
}


class Price:
    def __init__(self, usd: float, source: str) -> None:
        self.usd_per_hour, self.source, self.as_of = usd, source, "2026-11-01"


def prices(instance_type, region, lifecycle, az=None, at=None):
    return Price(10.0, "spot-history") if lifecycle == "spot" else Price(20.0, "on-demand")


def record_interrupted_job(jq: JobQueue, *, with_nodes: bool = True) -> str:
    """Attempt 1 on spot node A: 0..3600 (resume at 0, step 100; notice at 3000); attempt 2 on
    on-demand node B: 4000..7600, restoring step 50 at 4100."""
    node = (lambda n: {"node": n}) if with_nodes else (lambda n: {})
    job = jq.submit(JobSpec(command=["train"], gpus_per_node=8))
    jq.claim("w", lease_seconds=60, job_id=job.id)
    jq.update_attempt(job.id, 1, started_at=0.0)
    jq.record(job.id, 1, "started", at=0.0, data=node(NODE_A))
    jq.record(job.id, 1, "resume", at=0.0, data={"step": 0})
    jq.record(job.id, 1, "notice", at=3000.0, data={"kind": "spot-interruption", "deadline": 3120.0})
    jq.record(job.id, 1, "exit", at=3600.0, data={"exit_code": 75, **node(NODE_A)})
    jq.end_attempt(job.id, 1, AttemptEnd(state=AttemptState.REQUEUED, last_step=100, committed_step=50))
    jq.claim("w", lease_seconds=60, job_id=job.id)
    jq.update_attempt(job.id, 2, started_at=4000.0, resumed_step=50)
    jq.record(job.id, 2, "started", at=4000.0, data=node(NODE_B))
    jq.record(job.id, 2, "resume", at=4100.0, data={"step": 50})
    jq.record(job.id, 2, "exit", at=7600.0, data={"exit_code": 0, **node(NODE_B)})
    jq.end_attempt(job.id, 2, AttemptEnd(state=AttemptState.FINISHED, last_step=200))
    return job.id


def test_the_nodes_travel_in_the_events_and_price_the_job(jq: JobQueue):
    job_id = record_interrupted_job(jq)
    events = jq.events(job_id)
    assert [e.data["node"] for e in events if e.kind in ("started", "exit")] == [NODE_A, NODE_A, NODE_B, NODE_B]
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
