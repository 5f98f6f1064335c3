"""The pure rules: IMDS item text -> Notice (deadlines, staleness, dedup keys, malformed input)."""

from __future__ import annotations

import json

import pytest

from gpucloud.signals import interpret
from gpucloud.signals.interpret import InterpretRules, MalformedPayload

NOW = 1_800_000_000.0


def stamp(offset: float) -> str:
    return interpret.format_rfc3339(NOW + offset)


@pytest.mark.parametrize("action", ["terminate", "stop"])
def test_deadline_is_the_notice_time_not_an_assumed_120s(action):
    notice = interpret.instance_action_notice(json.dumps({"action": action, "time": stamp(37)}), NOW)
    assert notice.kind == "spot-interruption" and notice.action == action
    assert notice.deadline == NOW + 37
    assert notice.is_stop and notice.received_at == NOW


def test_hibernate_deadline_is_now():
    notice = interpret.instance_action_notice(json.dumps({"action": "hibernate", "time": stamp(0)}), NOW + 3)
    assert notice.deadline == NOW + 3


def test_recent_past_notice_is_urgent_but_a_long_past_one_is_stale():
    urgent = interpret.instance_action_notice(json.dumps({"action": "terminate", "time": stamp(-60)}), NOW)
    assert urgent is not None and urgent.seconds_left(NOW) == -60
    assert interpret.instance_action_notice(json.dumps({"action": "terminate", "time": stamp(-301)}), NOW) is None
    assert interpret.termination_time_notice(stamp(-600), NOW) is None
    tight = InterpretRules(stale_after=30)
    assert interpret.termination_time_notice(stamp(-60), NOW, tight) is None


def test_termination_time_and_instance_action_share_one_dedup_key():
    from_action = interpret.instance_action_notice(f'{{ "time": "{stamp(120)}", "action": "terminate" }}', NOW)
    from_legacy = interpret.termination_time_notice(stamp(120) + "\n", NOW + 1)
    assert from_action.event_id == from_legacy.event_id
    other = interpret.instance_action_notice(json.dumps({"action": "stop", "time": stamp(120)}), NOW)
    assert other.event_id != from_action.event_id


@pytest.mark.parametrize(
    "body, message",
    [
        ('{"action": "terminate", "time": "20', "not JSON"),
        ("[]", "expected an object"),
        ('{"time": "2026-01-01T00:00:00Z"}', "no string 'action'"),
        ('{"action": "explode", "time": "2026-01-01T00:00:00Z"}', "not one of terminate, stop, hibernate"),
        ('{"action": "terminate", "time": "tomorrow"}', "not an RFC 3339 date-time"),
        ('{"action": "terminate", "time": 1700000000}', "no string 'time'"),
    ],
)
def test_malformed_instance_action_raises_a_clear_error(body, message):
    with pytest.raises(MalformedPayload, match=message):
        interpret.instance_action_notice(body, NOW)


def test_rebalance_has_no_deadline_and_is_not_a_stop():
    notice = interpret.rebalance_notice(json.dumps({"noticeTime": stamp(-5)}), NOW)
    assert notice.kind == "rebalance" and notice.deadline is None and not notice.is_stop
    with pytest.raises(MalformedPayload, match="noticeTime"):
        interpret.rebalance_notice("{}", NOW)


def test_lifecycle_only_terminated_is_a_notice_with_the_configured_deadline():
    assert interpret.lifecycle_notice("InService", NOW) is None
    assert interpret.lifecycle_notice("Warmed:Terminated", NOW) is None
    notice = interpret.lifecycle_notice("Terminated\n", NOW, InterpretRules(asg_deadline=45))
    assert notice.kind == "asg-terminate" and notice.deadline == NOW + 45
    with pytest.raises(MalformedPayload, match="not one of InService"):
        interpret.lifecycle_notice("<html>oops</html>", NOW)


def event(code="instance-stop", state="active", not_before=3600.0, not_after=None, event_id="instance-event-1"):
    doc = {
        "Code": code,
        "State": state,
        "EventId": event_id,
        "Description": "x",
        "NotBefore": interpret.format_event_time(NOW + not_before),
    }
    if not_after is not None:
        doc["NotAfter"] = interpret.format_event_time(NOW + not_after)
    return doc


def test_scheduled_event_time_layout_round_trips():
    assert interpret.format_event_time(1548061243) == "21 Jan 2019 09:00:43 GMT"
    assert interpret.parse_event_time("21 Jan 2019 09:00:43 GMT") == 1548061243
    with pytest.raises(MalformedPayload, match="2 Jan 2006 15:04:05 GMT"):
        interpret.parse_event_time("2019-01-21T09:00:43Z")


def test_scheduled_events_active_stop_codes_only():
    docs = [
        event("instance-stop", event_id="a"),
        event("system-reboot", event_id="b", not_before=60),
        event("system-maintenance", event_id="c"),
        event("instance-retirement", state="canceled", event_id="d"),
        event("instance-reboot", state="completed", event_id="e"),
        event("instance-reboot", not_before=-7200, not_after=-3600, event_id="f"),  # window over
    ]
    notices, problems = interpret.scheduled_notices(json.dumps(docs), NOW)
    assert problems == []
    assert [(n.action, n.deadline) for n in notices] == [("instance-stop", NOW + 3600), ("system-reboot", NOW + 60)]
    assert all(n.kind == "scheduled-maintenance" for n in notices)


def test_scheduled_events_empty_and_bad_items():
    assert interpret.scheduled_notices("[]", NOW) == ([], [])
    notices, problems = interpret.scheduled_notices(
        json.dumps([event(), {"Code": "instance-stop"}, 7, event("bogus-code")]), NOW
    )
    assert len(notices) == 1
    assert len(problems) == 3 and "#1" in problems[0] and "#2" in problems[1] and "bogus-code" in problems[2]
    with pytest.raises(MalformedPayload, match="expected an array"):
        interpret.scheduled_notices('{"Code": "instance-stop"}', NOW)


def test_rules_reject_nonsense():
    with pytest.raises(ValueError, match="stale_after"):
        InterpretRules(stale_after=0)
    with pytest.raises(ValueError, match="asg_deadline"):
        InterpretRules(asg_deadline=-1)
