"""Dollars per job: hand-computed costs, lost dollars, unknown prices, old jobs."""

from __future__ import annotations

import dataclasses
import datetime

import pytest

from gpucloud.cost.job_cost import catalog_prices, job_cost
from gpucloud.lifecycle.model import Attempt, AttemptState, Event, Job, JobSpec, JobState
from helpers.job_histories import SPOT_NODE_A, Span, interrupted_once

SPOT_A = SPOT_NODE_A
SPOT_B = {**SPOT_A, "worker": "i-b:1", "instance_id": "i-b", "availability_zone": "us-east-1b"}


@dataclasses.dataclass(frozen=True)
class FakePrice:
    usd_per_hour: float
    source: str
    as_of: str = "2026-11-01"


def prices(instance_type, region, lifecycle, az=None, at=None):
    """Spot history: $10/h in us-east-1a, $12/h in us-east-1b; on-demand $20/h."""
    if instance_type != "p4d.24xlarge" or region != "us-east-1":
        raise LookupError(f"no price for {instance_type} in {region}")
    if lifecycle == "on-demand":
        return FakePrice(20.0, "on-demand")
    return FakePrice({"us-east-1a": 10.0, "us-east-1b": 12.0}[az], "spot-history")


def job(state=JobState.FINISHED, attempt=2) -> Job:
    return Job(
        id="j1",
        spec=JobSpec(command=["train"], gpus_per_node=8),
        state=state,
        attempt=attempt,
        created_at=0,
        updated_at=0,
    )


def ev(attempt: int, event_kind: str, at: float, **data) -> Event:
    return Event(job_id="j1", attempt=attempt, kind=event_kind, at=at, data=data)


def interrupted_spot_job(node_a=SPOT_A, node_b=SPOT_B):
    """Attempt 1 on spot in us-east-1a: starts at 0, restored step 0 at 60, noticed at 3600, exits at
    3660 after step 1000 (last checkpoint: 900). Attempt 2 on spot in us-east-1b: starts at 4000,
    restores step 900 at 4120, finishes at 7720 (step 2000)."""
    history = interrupted_once(
        "j1",
        job().spec,
        Span(started_at=0, ended_at=3660, last_step=1000, committed_step=900),
        Span(started_at=4000, ended_at=7720, resumed_step=900, last_step=2000),
        [
            ev(1, "started", 0, **({"node": node_a} if node_a else {})),
            ev(1, "resume", 60, step=0),
            ev(1, "notice", 3600, kind="spot-interruption", deadline=3720),
            ev(1, "exit", 3660, exit_code=75, **({"node": node_a} if node_a else {})),
            ev(1, "requeue", 3660, next_attempt=2),
            ev(2, "started", 4000, **({"node": node_b} if node_b else {})),
            ev(2, "resume", 4120, step=900),
            ev(2, "exit", 7720, exit_code=0, **({"node": node_b} if node_b else {})),
        ],
    )
    return history.attempts, history.events


def test_a_spot_job_with_one_interruption_costs_what_hand_arithmetic_says():
    attempts, events = interrupted_spot_job()
    cost = job_cost(job(), attempts, events, prices, now=10_000)
    first, second = cost.attempts
    # Attempt 1: 3660 s at $10/h; attempt 2: 3720 s at $12/h. On demand: $20/h for both.
    assert first.cost_usd == pytest.approx(10 * 3660 / 3600)
    assert second.cost_usd == pytest.approx(12 * 3720 / 3600)
    assert cost.cost_usd == pytest.approx(10 * 3660 / 3600 + 12 * 3720 / 3600)  # 22.5667
    assert cost.on_demand_equivalent_usd == pytest.approx(20 * (3660 + 3720) / 3600)  # 41.0
    assert cost.savings_usd == pytest.approx(41.0 - 22.566667, abs=1e-4)
    assert cost.savings_pct == pytest.approx(100 * (41.0 - 22.566667) / 41.0, abs=1e-3)
    # Lost steps: 1000 - 900 = 100 of the 1000 done, over the training time 60..3600 at $10/h.
    assert first.lost_steps_usd == pytest.approx(10 * 3540 / 3600 * 0.1)  # 0.98333
    # Restart overhead: notice 3600 -> resume 4120 = 520 s; paid: node A 3600..3660 at $10/h and
    # node B 4000..4120 at $12/h (the 340 s in between no node of the job was paid for).
    assert first.restart_overhead_s == pytest.approx(520)
    assert first.restart_overhead_usd == pytest.approx(10 * 60 / 3600 + 12 * 120 / 3600)  # 0.56667
    assert first.cost_lost_usd == pytest.approx(0.983333 + 0.566667, abs=1e-5)  # 1.55
    assert second.cost_lost_usd == 0.0
    assert cost.cost_lost_usd == pytest.approx(1.55, abs=1e-5)
    # The price in force and its source, per node.
    assert [(n.usd_per_hour, n.price_source, n.availability_zone) for a in cost.attempts for n in a.nodes] == [
        (10.0, "spot-history", "us-east-1a"),
        (12.0, "spot-history", "us-east-1b"),
    ]
    assert cost.price_sources == ["spot-history"] and cost.unknown_reasons == []


def test_the_price_is_asked_for_the_node_and_the_time_it_started():
    asked = []

    def recording(instance_type, region, lifecycle, az=None, at=None):
        asked.append((instance_type, region, lifecycle, az, at))
        return prices(instance_type, region, lifecycle, az=az, at=at)

    attempts, events = interrupted_spot_job()
    job_cost(job(), attempts, events, recording, now=10_000)
    assert ("p4d.24xlarge", "us-east-1", "spot", "us-east-1b", 4000) in asked
    assert ("p4d.24xlarge", "us-east-1", "on-demand", "us-east-1a", 0) in asked


def test_a_lossless_notice_driven_save_loses_only_the_restart_overhead():
    attempts, events = interrupted_spot_job()
    attempts[1] = attempts[1].model_copy(update={"resumed_step": 1000})
    first = job_cost(job(), attempts, events, prices, now=10_000).attempts[0]
    assert first.lost_steps_usd == 0.0
    assert first.cost_lost_usd == pytest.approx(first.restart_overhead_usd)


def test_an_on_demand_node_saves_nothing():
    on_demand = {**SPOT_A, "lifecycle": "on-demand"}
    attempts, events = interrupted_spot_job(node_a=on_demand)
    first = job_cost(job(), attempts, events, prices, now=10_000).attempts[0]
    assert first.cost_usd == pytest.approx(first.on_demand_equivalent_usd) == pytest.approx(20 * 3660 / 3600)
    assert first.savings_usd == pytest.approx(0.0) and first.price_sources == ["on-demand"]


def test_a_running_attempt_is_priced_up_to_now_and_its_restart_still_costs():
    attempts, events = interrupted_spot_job()
    attempts[1] = attempts[1].model_copy(update={"state": AttemptState.RUNNING, "ended_at": None, "last_step": None})
    events = [e for e in events if not (e.attempt == 2 and e.kind in ("resume", "exit"))]  # not restored yet
    cost = job_cost(job(JobState.RUNNING), attempts, events, prices, now=4360)
    first, second = cost.attempts
    assert second.cost_usd == pytest.approx(12 * 360 / 3600)
    assert first.restart_overhead_s is None  # not resumed: the overhead is not over
    assert first.restart_overhead_usd == pytest.approx(10 * 60 / 3600 + 12 * 360 / 3600)
    assert first.lost_steps_usd == pytest.approx(10 * 3540 / 3600)  # nothing known to be kept yet


def test_an_unknown_instance_type_has_no_cost_and_says_why():
    attempts, events = interrupted_spot_job(node_b={**SPOT_B, "instance_type": "p9.mega"})
    cost = job_cost(job(), attempts, events, prices, now=10_000)
    assert cost.attempts[0].cost_usd == pytest.approx(10 * 3660 / 3600)  # the known attempt still is
    assert cost.attempts[1].cost_usd is None and cost.cost_usd is None and cost.savings_usd is None
    assert cost.cost_lost_usd is None  # the restart overhead ran on the unpriced node
    assert cost.unknown_reasons == [
        "attempt 2: no spot price for p9.mega in us-east-1: no price for p9.mega in us-east-1"
    ]


def test_an_unknown_region_has_no_cost_and_says_why():
    attempts, events = interrupted_spot_job(
        node_a={**SPOT_A, "region": "ap-south-2", "availability_zone": "ap-south-2a"}
    )
    cost = job_cost(job(), attempts, events, prices, now=10_000)
    assert cost.cost_usd is None
    assert "ap-south-2" in cost.unknown_reasons[0] and cost.unknown_reasons[0].startswith("attempt 1:")


def test_a_lookup_that_returns_none_or_a_bad_number_is_no_price():
    attempts, events = interrupted_spot_job()
    assert job_cost(job(), attempts, events, lambda *a, **k: None, now=1).cost_usd is None
    nan = job_cost(job(), attempts, events, lambda *a, **k: FakePrice(float("nan"), "estimate"), now=1)
    assert nan.cost_usd is None and "not a price" in nan.unknown_reasons[0]


def test_an_old_job_without_node_fields_is_readable_and_unpriced():
    attempts, events = interrupted_spot_job(node_a=None, node_b=None)
    cost = job_cost(job(), attempts, events, prices, now=10_000)
    assert cost.cost_usd is None and cost.cost_lost_usd is None
    assert [n.wall_s for a in cost.attempts for n in a.nodes] == [3660, 3720]  # the attempts' own times
    assert cost.unknown_reasons[0] == (
        "attempt 1: no instance type recorded (it ran before gpucloud recorded nodes, or off EC2)"
    )


def test_a_gang_prices_each_member_on_its_own_node_and_time():
    attempts, _ = interrupted_spot_job()
    member_b = {**SPOT_B, "worker": "i-b:1"}
    events = [
        ev(1, "started", 0, node=SPOT_A),
        ev(1, "started", 30, node=member_b),
        ev(1, "exit", 3600, node=member_b),
        # member A never recorded its exit (its agent died): it ends with the attempt
    ]
    first = job_cost(job(), attempts[:1], events, prices, now=10_000).attempts[0]
    assert [n.wall_s for n in first.nodes] == [3660, 3570]
    assert first.cost_usd == pytest.approx(10 * 3660 / 3600 + 12 * 3570 / 3600)


def test_the_catalog_lookup_prices_known_types_at_the_time_and_refuses_unknown_ones():
    lookup = catalog_prices()
    on_demand = lookup("p4d.24xlarge", "us-east-1", "on-demand", az="us-east-1a", at=1_790_000_000.0)
    spot = lookup("p4d.24xlarge", "us-east-1", "spot", az="us-east-1a", at=1_790_000_000.0)
    assert on_demand.usd_per_hour > spot.usd_per_hour > 0 and on_demand.source == "on-demand"
    assert spot.source in ("spot-history", "spot-estimate")
    with pytest.raises(Exception, match="p9.mega"):
        lookup("p9.mega", "us-east-1", "spot", az=None, at=0)


def test_the_catalog_prices_a_real_job_and_names_an_unpriced_region():
    attempts, events = interrupted_spot_job()
    cost = job_cost(job(), attempts, events, catalog_prices(), now=10_000)
    assert cost.cost_usd is not None and 0 < cost.cost_usd < cost.on_demand_equivalent_usd
    far = {**SPOT_A, "region": "ap-south-2", "availability_zone": "ap-south-2a"}
    attempts, events = interrupted_spot_job(node_a=far)
    unpriced = job_cost(job(), attempts, events, catalog_prices(), now=10_000)
    assert unpriced.cost_usd is None and "ap-south-2" in unpriced.unknown_reasons[0]


def test_a_spot_price_that_changes_mid_attempt_is_followed_through_the_history():
    """us-east-1a's spot history: $10/h from T0, $20/h from T0+1h, $5/h from T0+3h. A node that runs
    T0+30min to T0+2h30min pays 0.5 h at $10 and 1.5 h at $20 (not 2 h at its start's $10)."""
    from gpucloud.catalog import SpotPoint, load_catalog

    t0 = datetime.datetime(2026, 11, 20, tzinfo=datetime.timezone.utc)
    history = [
        SpotPoint(at=t0 + datetime.timedelta(hours=h), usd_per_hour=usd) for h, usd in ((0, 10), (1, 20), (3, 5))
    ]
    catalog = load_catalog()
    regional = catalog.prices["us-east-1"]
    entry = regional.instance_types["p4d.24xlarge"].model_copy(update={"spot_history": {"us-east-1a": history}})
    regional = regional.model_copy(update={"instance_types": {**regional.instance_types, "p4d.24xlarge": entry}})
    catalog = catalog.model_copy(update={"prices": {**catalog.prices, "us-east-1": regional}})
    start, end = t0.timestamp() + 1800, t0.timestamp() + 9000
    attempts = [
        Attempt(job_id="j1", number=1, state=AttemptState.FINISHED, created_at=start, started_at=start, ended_at=end)
    ]
    events = [ev(1, "started", start, node=SPOT_A), ev(1, "exit", end, exit_code=0, node=SPOT_A)]

    cost = job_cost(job(attempt=1), attempts, events, catalog_prices(catalog), now=end)

    (node,) = cost.attempts[0].nodes
    assert node.cost_usd == pytest.approx(0.5 * 10 + 1.5 * 20)
    assert node.usd_per_hour == pytest.approx(17.5) and node.price_source == "spot-history"
    assert [(p.from_at - t0.timestamp(), p.usd_per_hour) for p in node.price_periods] == [(1800, 10), (3600, 20)]
    assert cost.cost_usd == pytest.approx(35)
