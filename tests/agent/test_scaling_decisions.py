"""Scaling decisions: worked examples, one test per refusal, and property tests over random states."""

from __future__ import annotations

import random

import pytest

from gpucloud.agent.scaling import (
    CapacityBlockWindow,
    FleetState,
    GroupBounds,
    WaitingGang,
    desired_capacity,
    idle_scale_in,
)
from gpucloud.errors import UserError

HOUR = 3600.0


def state(*gangs: tuple[int, int], busy: int = 0, idle: int = 0, launching: int = 0) -> FleetState:
    return FleetState(tuple(WaitingGang(n, u) for n, u in gangs), busy, idle, launching)


# -- desired capacity --------------------------------------------------------------------------
def test_empty_queue_scales_to_min():
    d = desired_capacity(state(idle=3), GroupBounds(0, 8))
    assert (d.desired, d.launch, d.surplus) == (0, 0, 3)


def test_unclaimed_slots_are_launched_minus_nodes_already_there():
    d = desired_capacity(state((2, 2), (1, 1), busy=2, idle=1, launching=1), GroupBounds(0, 8))
    assert d.desired == 5 and d.slots_planned == 3
    assert d.launch == 1  # one idle and one launching node take two of the three slots


def test_busy_nodes_are_never_scaled_in():
    d = desired_capacity(state(busy=4, idle=2), GroupBounds(0, 8))
    assert d.desired == 4 and d.surplus == 2


def test_partially_claimed_gang_needs_only_its_unclaimed_slots():
    d = desired_capacity(state((4, 1), busy=3), GroupBounds(0, 4))
    assert d.desired == 4 and d.launch == 1


def test_gang_that_does_not_fit_stops_the_queue_in_order():
    d = desired_capacity(state((2, 2), (4, 4), (1, 1), busy=2), GroupBounds(0, 6))
    assert d.desired == 4 and d.slots_planned == 2  # the 1-node job behind the 4-node gang waits its turn
    assert "gang #1 waits" in d.reason


def test_gang_larger_than_max_is_unschedulable_and_not_counted():
    d = desired_capacity(state((16, 16), (2, 2)), GroupBounds(0, 8))
    assert d.unschedulable == (0,) and d.desired == 2
    assert "larger than max_size 8 cannot run" in d.reason


def test_min_size_is_honoured():
    assert desired_capacity(state(), GroupBounds(2, 8)).desired == 2


# -- capacity block window ---------------------------------------------------------------------
BLOCK = CapacityBlockWindow(start=100 * HOUR, end=124 * HOUR)


@pytest.mark.parametrize(
    "now, desired",
    [
        (99 * HOUR, 0),  # before the block: nothing can launch into it
        (100 * HOUR, 3),
        (124 * HOUR - 1800 - 1, 3),
        (124 * HOUR - 1800, 0),  # 30 min before the end: EC2 starts terminating
        (125 * HOUR, 0),
    ],
)
def test_capacity_block_window(now, desired):
    assert desired_capacity(state((3, 3)), GroupBounds(0, 4), now=now, block=BLOCK).desired == desired


def test_capacity_block_with_longer_lead_closes_earlier():
    block = CapacityBlockWindow(start=0, end=10 * HOUR, stop_lead=HOUR)
    assert desired_capacity(state((1, 1)), GroupBounds(0, 4), now=9 * HOUR, block=block).desired == 0
    assert desired_capacity(state((1, 1)), GroupBounds(0, 4), now=9 * HOUR - 1, block=block).desired == 1


# -- idle scale-in -----------------------------------------------------------------------------
@pytest.mark.parametrize(
    "idle_for, desired, min_size, unclaimed, terminate",
    [
        (600, 3, 0, 0, True),
        (599, 3, 0, 0, False),  # not idle long enough
        (600, 1, 1, 0, False),  # at the minimum
        (600, 3, 0, 2, False),  # work is waiting
    ],
)
def test_idle_agent_rule(idle_for, desired, min_size, unclaimed, terminate):
    decision = idle_scale_in(idle_for, idle_seconds=600, desired=desired, min_size=min_size, unclaimed_slots=unclaimed)
    assert decision.terminate is terminate and decision.reason


# -- refusals ----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "build, message",
    [
        (lambda: GroupBounds(3, 2), "min_size 3 is above max_size 2"),
        (lambda: GroupBounds(-1, 2), "min_size -1 is not a whole number >= 0"),
        (lambda: WaitingGang(0, 0), "gang nodes 0 is not a whole number >= 1"),
        (lambda: WaitingGang(2, 3), "gang has 3 unclaimed slots but only 2 nodes"),
        (lambda: FleetState((), -1, 0, 0), "busy_nodes -1 is not a whole number >= 0"),
        (lambda: FleetState(((2, 2),), 0, 0, 0), "is not a WaitingGang(nodes, unclaimed)"),
        (lambda: CapacityBlockWindow(start=10, end=10), "capacity block end 10 is not after its start 10"),
        (lambda: CapacityBlockWindow(start=0, end=HOUR, stop_lead=600), "stop lead 600s is under 1800s"),
        (lambda: desired_capacity(state(), GroupBounds(1, 4), now=0, block=BLOCK), "needs min_size 0"),
        (lambda: desired_capacity(state(), GroupBounds(0, 4), block=BLOCK), "needs the current time"),
        (
            lambda: idle_scale_in(10, idle_seconds=0, desired=1, min_size=0, unclaimed_slots=0),
            "idle_seconds must be positive",
        ),
        (lambda: idle_scale_in(-1, idle_seconds=5, desired=1, min_size=0, unclaimed_slots=0), "idle time must be >= 0"),
    ],
)
def test_bad_inputs_are_one_line_errors(build, message):
    with pytest.raises(UserError) as info:
        build()
    assert message in str(info.value) and "\n" not in str(info.value)


# -- properties over random states -------------------------------------------------------------
def random_case(rng: random.Random) -> tuple[FleetState, GroupBounds]:
    max_size = rng.randint(0, 12)
    bounds = GroupBounds(rng.randint(0, max_size), max_size)
    gangs = []
    for _ in range(rng.randint(0, 6)):
        nodes = rng.randint(1, 14)
        gangs.append(WaitingGang(nodes, rng.randint(0, nodes)))
    return FleetState(tuple(gangs), rng.randint(0, max_size), rng.randint(0, 5), rng.randint(0, 3)), bounds


CASES = [random_case(random.Random(seed)) for seed in range(3000)]


@pytest.mark.parametrize("chunk", range(3))
def test_decision_invariants(chunk):
    for st, bounds in CASES[chunk::3]:
        d = desired_capacity(st, bounds)
        assert bounds.min_size <= d.desired <= bounds.max_size
        assert d.desired >= st.busy_nodes  # busy nodes are never scaled in
        assert d.launch >= 0 and d.surplus >= 0 and not (d.launch and d.surplus)
        assert d.surplus <= st.idle_nodes + st.launching_nodes
        assert st.present + d.launch - d.surplus == d.desired
        assert d.slots_planned <= sum(g.unclaimed for g in st.waiting)
        assert all(st.waiting[i].nodes > bounds.max_size for i in d.unschedulable)


def test_more_waiting_work_never_lowers_desired_capacity():
    rng = random.Random(7)
    for st, bounds in CASES:
        extra = WaitingGang(n := rng.randint(1, 4), rng.randint(0, n))
        grown = FleetState(st.waiting + (extra,), st.busy_nodes, st.idle_nodes, st.launching_nodes)
        assert desired_capacity(grown, bounds).desired >= desired_capacity(st, bounds).desired


def test_nodes_already_present_never_change_desired_only_launch():
    for st, bounds in CASES:
        more = FleetState(st.waiting, st.busy_nodes, st.idle_nodes + 2, st.launching_nodes + 1)
        a, b = desired_capacity(st, bounds), desired_capacity(more, bounds)
        assert a.desired == b.desired and b.launch <= a.launch


def test_closed_capacity_block_is_always_zero():
    rng = random.Random(11)
    for st, bounds in CASES[:500]:
        zero_min = GroupBounds(0, bounds.max_size)
        now = rng.choice([rng.uniform(0, BLOCK.start - 1), rng.uniform(BLOCK.cutoff, BLOCK.end + HOUR)])
        d = desired_capacity(st, zero_min, now=now, block=BLOCK)
        assert d.desired == 0 and d.launch == 0
