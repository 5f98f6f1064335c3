"""The emulator's HTTP control API and its client, as another process would use them."""

from __future__ import annotations

import json
import time
import urllib.request

import pytest

from gpucloud.offline.emulator_control import EmulatorControl, EmulatorControlError
from gpucloud.signals.imds import ImdsClient, ImdsUnavailable
from gpucloud.signals.poller import ImdsPoller
from helpers.waiting import wait_for


def test_control_injects_what_the_poller_then_sees(emulator):
    control = EmulatorControl(emulator.endpoint)
    poller = ImdsPoller(ImdsClient(emulator.endpoint), on_notice=lambda n: None)
    injected = time.time()
    control.spot_interruption("stop", lead_seconds=45, with_rebalance=True)
    injected_by = time.time()
    control.set_lifecycle_state("Terminated")
    control.add_scheduled_event("instance-retirement", not_before_in=7200)
    notices = {n.kind: n for n in poller.poll_once()}
    assert set(notices) == {"spot-interruption", "rebalance", "asg-terminate", "scheduled-maintenance"}
    assert notices["spot-interruption"].action == "stop"
    # 45 s after the injection, whenever the poll ran (IMDS times are whole seconds: a second of rounding)
    deadline = notices["spot-interruption"].deadline
    assert deadline is not None and injected + 45 - 1 <= deadline <= injected_by + 45 + 1
    state = control.state()
    assert state["spot"]["value"]["action"] == "stop" and state["stats"]["tokens issued"] == 1
    control.clear()
    assert control.state()["spot"] is None
    assert ImdsClient(emulator.endpoint).get("/latest/meta-data/spot/instance-action").absent


def test_control_delayed_and_stale_scenarios(emulator):
    control = EmulatorControl(emulator.endpoint)
    state = control.spot_interruption(after=3600)
    assert state["spot"]["visible"] is False
    control.clear()
    control.stale_termination_time(900)
    poller = ImdsPoller(ImdsClient(emulator.endpoint), on_notice=lambda n: None)
    assert poller.poll_once() == [] and poller.health.stale_ignored == 1


def test_control_faults(emulator):
    control = EmulatorControl(emulator.endpoint)
    client = ImdsClient(emulator.endpoint)
    control.fail_with(502, 1)
    assert client.get("/latest/meta-data/instance-id").status == 502
    control.malformed(1)
    assert client.get("/latest/meta-data/instance-id").text.startswith('{"action": "terminate", "time": "20')
    control.fail_tokens(2)
    assert client.get("/latest/meta-data/instance-id").status == 401
    # a hang far longer than the client waits: it gives up, however loaded the machine
    control.hang(10, count=1, target="metadata")
    with pytest.raises(ImdsUnavailable):
        ImdsClient(emulator.endpoint, read_timeout=1.0, total_timeout=2.0).get("/latest/meta-data/instance-id")
    control.refuse_connections(5)
    wait_for(lambda: not emulator.accepting, timeout=5, what="the emulator to stop listening")
    with pytest.raises(ImdsUnavailable, match="refused"):
        client.get("/latest/meta-data/instance-id")
    wait_for(lambda: emulator.accepting, timeout=15, what="the emulator to listen again")
    assert client.get("/latest/meta-data/instance-id").ok


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda c: c.spot_interruption("explode"), "action: Input should be 'terminate', 'stop' or 'hibernate'"),
        (lambda c: c.spot_interruption(after=-1), "after: Input should be greater than or equal to 0"),
        (lambda c: c.spot_interruption(after=1, at=2), "either 'at'"),
        (lambda c: c.set_lifecycle_state("Gone"), "state: Input should be"),
        (lambda c: c.add_scheduled_event("instance-stop"), "exactly one of 'not_before'"),
        (
            lambda c: c.set_scheduled_event_state("instance-event-nope", "canceled"),
            "no scheduled event 'instance-event-nope'",
        ),
        (lambda c: c.fail_with(200, 1), "status: Input should be greater than or equal to 400"),
        (lambda c: c.refuse_connections(0), "needs 'seconds' > 0"),
        (lambda c: c.hang(1, target="/etc/passwd"), "is not one of any, token, metadata or a /latest/... path"),
        (lambda c: c._post("teleport"), "unknown control request 'teleport'"),
        (lambda c: c._post("rebalance", colour="red"), "colour: Extra inputs are not permitted"),
    ],
)
def test_bad_control_requests_get_one_line_errors_and_change_nothing(emulator, call, message):
    control = EmulatorControl(emulator.endpoint)
    before = control.state()
    with pytest.raises(EmulatorControlError, match=message.replace("(", "\\(").replace(")", "\\)")) as err:
        call(control)
    assert "\n" not in str(err.value)
    after = control.state()
    for key in ("spot", "rebalance", "lifecycle", "scheduled_events", "faults"):
        assert after[key] == before[key]


def test_non_json_body_is_rejected(emulator):
    request = urllib.request.Request(
        f"{emulator.endpoint}/gpucloud/emulator/rebalance", data=b"{not json", method="POST"
    )
    with pytest.raises(urllib.error.HTTPError) as err:
        urllib.request.urlopen(request, timeout=5)
    assert err.value.code == 400
    assert "body is not JSON" in json.loads(err.value.read())["error"]


def test_unreachable_emulator_is_a_clear_error(emulator):
    emulator.refuse_connections()
    with pytest.raises(EmulatorControlError, match="not reachable"):
        EmulatorControl(emulator.endpoint).state()
