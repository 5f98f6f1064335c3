"""Emulator scenarios against the poller, including every fault (real HTTP, no mocks)."""

from __future__ import annotations

import threading
import time

import pytest

from gpucloud.offline.imds_emulator import ImdsEmulator
from gpucloud.signals import interpret
from gpucloud.signals.imds import ImdsClient
from gpucloud.signals.interpret import InterpretRules
from gpucloud.signals.poller import ImdsPoller
from helpers.waiting import wait_for

from .helpers import FakeClock


@pytest.fixture
def scene(clock: FakeClock):
    """An emulator and a poller sharing one hand-moved clock."""
    with ImdsEmulator(clock=clock) as emu:
        client = ImdsClient(emu.endpoint, connect_timeout=0.5, read_timeout=0.3, clock=clock)
        seen = []
        poller = ImdsPoller(client, on_notice=seen.append, clock=clock)
        yield emu, poller, seen


def kinds(notices):
    return [(n.kind, n.action) for n in notices]


# -- scenarios -----------------------------------------------------------------------------------
@pytest.mark.parametrize("action, lead", [("terminate", 120), ("stop", 120), ("terminate", 25)])
def test_spot_notice_deadline_comes_from_the_notice(scene, clock, action, lead):
    emu, poller, seen = scene
    assert poller.poll_once() == []
    emu.spot_interruption(action, lead_seconds=lead)
    notices = poller.poll_once()
    assert kinds(notices) == [("spot-interruption", action)]
    assert notices[0].deadline == pytest.approx(clock.now + lead, abs=1.0)  # the served time has 1 s resolution
    assert seen == notices  # on_notice got the same notices


def test_hibernate_deadline_is_now(scene, clock):
    emu, poller, _ = scene
    emu.spot_interruption("hibernate")
    clock.advance(2)
    (notice,) = poller.poll_once()
    assert notice.action == "hibernate" and notice.deadline == clock.now


def test_notice_at_a_future_time_appears_only_then(scene, clock):
    emu, poller, _ = scene
    emu.spot_interruption(at=clock.now + 30, lead_seconds=120)
    assert poller.poll_once() == []
    clock.advance(29.5)
    assert poller.poll_once() == []
    clock.advance(1)
    (notice,) = poller.poll_once()
    assert notice.deadline == pytest.approx(clock.now - 0.5 + 120, abs=1.0)


def test_same_notice_is_reported_once_across_polls(scene, clock):
    emu, poller, seen = scene
    emu.spot_interruption()
    assert len(poller.poll_once()) == 1
    for _ in range(5):
        clock.advance(1)
        assert poller.poll_once() == []
    assert len(seen) == 1 and poller.health.notices == 1


def test_rebalance_before_the_notice(scene, clock):
    emu, poller, _ = scene
    emu.rebalance()
    (rebalance,) = poller.poll_once()
    assert rebalance.kind == "rebalance" and rebalance.deadline is None and not rebalance.is_stop
    clock.advance(60)
    emu.spot_interruption()
    assert kinds(poller.poll_once()) == [("spot-interruption", "terminate")]


def test_rebalance_together_with_the_notice(scene):
    emu, poller, _ = scene
    emu.spot_interruption(with_rebalance=True)
    assert sorted(kinds(poller.poll_once())) == [("rebalance", "rebalance"), ("spot-interruption", "terminate")]


def test_termination_time_alone_is_a_notice(scene, clock):
    emu, poller, _ = scene
    emu.spot_interruption("terminate", lead_seconds=90)
    # The legacy item and instance-action name the same notice: one notice, not two.
    (_,) = poller.poll_once()
    emu.fail_with(500, 1)  # instance-action fails next round: the poller falls back to termination-time
    clock.advance(1)
    assert poller.poll_once() == []


@pytest.mark.parametrize("with_instance_action", [False, True])
def test_stale_termination_time_is_ignored(scene, with_instance_action):
    emu, poller, seen = scene
    emu.stale_termination_time(600, with_instance_action=with_instance_action)
    assert poller.poll_once() == []
    assert seen == [] and poller.health.stale_ignored == 1


def test_lifecycle_terminated(scene, clock):
    emu, poller, _ = scene
    emu.set_lifecycle_state("InService")
    emu.set_lifecycle_state("Terminated", at=clock.now + 10)
    assert poller.poll_once() == []
    clock.advance(10)
    (notice,) = poller.poll_once()
    assert notice.kind == "asg-terminate" and notice.deadline == clock.now + interpret.DEFAULT_ASG_DEADLINE
    clock.advance(5)
    assert poller.poll_once() == []  # Terminated is sticky: still one notice


def test_lifecycle_deadline_is_a_parameter(clock):
    with ImdsEmulator(clock=clock) as emu:
        poller = ImdsPoller(
            ImdsClient(emu.endpoint), on_notice=lambda n: None, clock=clock, rules=InterpretRules(asg_deadline=600)
        )
        emu.set_lifecycle_state("Terminated")
        assert poller.poll_once()[0].deadline == clock.now + 600


def test_scheduled_events(scene, clock):
    emu, poller, _ = scene
    emu.add_scheduled_event("system-maintenance", clock.now + 60)  # keeps running: no notice
    event_id = emu.add_scheduled_event("instance-stop", clock.now + 3600, state="canceled")
    assert poller.poll_once() == []
    emu.set_scheduled_event_state(event_id, "active")
    (notice,) = poller.poll_once()
    assert notice.kind == "scheduled-maintenance" and notice.action == "instance-stop"
    assert notice.deadline == pytest.approx(clock.now + 3600, abs=1.0)
    assert notice.payload["EventId"] == event_id
    emu.set_scheduled_event_state(event_id, "canceled")  # canceled later: nothing new, nothing broken
    clock.advance(1)
    assert poller.poll_once() == [] and poller.health.malformed == 0


# -- faults: never a false positive, and the notice still arrives afterwards -----------------------
FAULTS = {
    "500": lambda emu: emu.fail_with(500, 50),
    "503": lambda emu: emu.fail_with(503, 50),
    "404-everything-else": lambda emu: None,
    "malformed": lambda emu: emu.malformed(50),
    "401-storm": lambda emu: emu.fail_tokens(50),
    "hang": lambda emu: emu.hang(1.0, count=50),
    "token-hang": lambda emu: emu.hang(1.0, count=50, target="token"),
    "refused": lambda emu: emu.refuse_connections(),
}


@pytest.mark.parametrize("fault", sorted(FAULTS))
def test_no_false_positive_under_fault(scene, clock, fault):
    emu, poller, seen = scene
    emu.set_lifecycle_state("InService")
    FAULTS[fault](emu)
    for _ in range(3):
        assert poller.poll_once() == []
        clock.advance(1)
    assert seen == []
    if fault != "404-everything-else":
        assert poller.health.failed_requests + poller.health.malformed > 0
    # The fault clears; a real notice is then seen on the next round.
    emu.clear()
    emu.accept_connections()
    emu.spot_interruption()
    if "hang" in fault:
        clock.advance(31)  # a token PUT timed out: the client tries IMDSv2 again after its back-off
    assert kinds(poller.poll_once()) == [("spot-interruption", "terminate")]


def test_a_failing_item_does_not_hide_another(scene):
    emu, poller, _ = scene
    emu.fail_with(500, 1)  # the first GET of the round (instance-action) fails
    emu.rebalance()
    assert kinds(poller.poll_once()) == [("rebalance", "rebalance")]


def test_a_notice_is_reported_before_a_later_item_times_out(scene):
    emu, poller, _ = scene
    reported_at = []
    poller.on_notice = lambda notice: reported_at.append(time.monotonic())
    emu.spot_interruption()
    emu.hang(2, count=1, target=interpret.SCHEDULED_EVENTS)
    started = time.monotonic()
    assert len(poller.poll_once()) == 1
    ended = time.monotonic()
    assert ended - started >= 0.3  # the scheduled-events read timed out (read timeout 0.3 s)...
    assert reported_at[0] - started < ended - started - 0.2  # ...but the notice went out first


def test_outage_is_logged_once_not_every_round(scene, clock, caplog):
    emu, poller, _ = scene
    emu.refuse_connections()
    with caplog.at_level("WARNING", logger="gpucloud.signals"):
        for _ in range(4):
            poller.poll_once()
            clock.advance(1)
    refused = [r for r in caplog.records if "connection refused" in r.getMessage()]
    assert len(refused) == 1
    assert poller.health.requests == 4  # one per round: an unreachable service ends the round early


# -- the background thread ---------------------------------------------------------------------
def test_thread_reports_a_notice_within_the_interval(emulator):
    arrived = threading.Event()
    got = []

    def on_notice(notice):
        got.append(notice)
        arrived.set()

    poller = ImdsPoller(ImdsClient(emulator.endpoint), interval=0.05, on_notice=on_notice)
    poller.start()
    try:
        wait_for(lambda: poller.health.rounds >= 2, timeout=5, what="two quiet rounds")
        emulator.spot_interruption()
        assert arrived.wait(5)
        rounds = poller.health.rounds
        wait_for(lambda: poller.health.rounds >= rounds + 3, timeout=5, what="three more rounds")
        assert len(got) == 1  # the notice is still served, but reported once
    finally:
        poller.stop()
    assert not poller.running


def test_poller_rejects_a_bad_interval(client):
    with pytest.raises(ValueError, match="poll interval"):
        ImdsPoller(client, interval=0, on_notice=lambda n: None)
