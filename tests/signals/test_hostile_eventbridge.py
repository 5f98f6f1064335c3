"""Hostile events-queue bodies: ``parse_message`` fails only with its own
one-line ``UnreadableEvent``, and times are RFC 3339 only, as on the IMDS side."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fuzzing import fuzz_settings
from gpucloud.signals.eventbridge import ReservationExpiring, Skipped, UnreadableEvent, parse_message
from gpucloud.signals.events import Notice

from . import eventbridge_samples as s

NOW = s.EVENT_EPOCH + 7.0
DEEP = "[" * 100_000 + "]" * 100_000
DEEP_OBJECT = '{"a":' * 5_000 + "1" + "}" * 5_000
BIG_INT = "1" * 5_000
HOSTILE_TIMES = [
    "9999-12-31T23:59:59-23:59",  # the year 10000 once in UTC
    "0001-01-01T00:00:00+01:00",  # the year 0 once in UTC
    "9999-12-31T23:59:59Z",  # far ahead: not a real event
    "2026-11-25",  # fromisoformat reads these; RFC 3339 does not allow them
    "2030-W01-1",
    "20261123T203000",
    "2026-11-21T08:22:00",  # no offset
]


def body_with(data: dict[str, Any], raw: str, *path: str) -> str:
    """``data`` as JSON with the value at ``path`` replaced by the raw JSON text ``raw``."""
    marker = "\u0000MARKER\u0000"
    target = data
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = marker
    return json.dumps(data).replace(json.dumps(marker), raw)


HOSTILE_BODIES = {
    **{f"spot warning time {t}": s.body(s.spot_warning(time=t)) for t in HOSTILE_TIMES},
    **{f"rebalance time {t}": s.body(s.rebalance(time=t)) for t in HOSTILE_TIMES},
    "lifecycle Time year 10000": s.body(s.direct_lifecycle() | {"Time": HOSTILE_TIMES[0]}),
    "SNS-wrapped year 10000": s.body(s.sns_wrapped(s.direct_lifecycle() | {"Time": HOSTILE_TIMES[0]})),
    "deep body": DEEP,
    "deep detail": body_with(s.spot_warning(), DEEP, "detail"),
    "deep object detail": body_with(s.spot_warning(), DEEP_OBJECT, "detail"),
    "5000-digit instance id": body_with(s.spot_warning(), BIG_INT, "detail", "instance-id"),
    "5000-digit time": body_with(s.spot_warning(), BIG_INT, "time"),
    "SNS Message deep": s.body({"Type": "Notification", "Message": DEEP}),
    "SNS Message 5000 digits": s.body({"Type": "Notification", "Message": BIG_INT}),
    "not UTF-8 surrogate": '{"detail-type": "\\ud800"}',
}


@pytest.mark.parametrize("case", sorted(HOSTILE_BODIES))
def test_hostile_bodies_are_unreadable_events_with_one_line(case):
    with pytest.raises(UnreadableEvent) as info:
        parse_message(HOSTILE_BODIES[case], now=NOW)
    text = str(info.value)
    assert "\n" not in text and len(text) < 1200


@pytest.mark.parametrize("text", ["2026-11-25", "2030-W01-1", "20261123T203000"])
def test_spot_warning_time_must_be_rfc3339(text):
    now = 1795478400.0  # 2026-11-25T00:00:00Z: where fromisoformat's reading of these is current
    with pytest.raises(UnreadableEvent, match="RFC 3339"):
        parse_message(s.body(s.spot_warning(time=text)), now=now)


def test_event_time_far_ahead_is_not_an_event():
    with pytest.raises(UnreadableEvent, match="more than 3600s ahead"):
        parse_message(s.body(s.spot_warning(time="9999-12-31T23:59:59Z")), now=NOW)
    ahead = s.body(s.spot_warning(time="2026-11-21T08:52:00Z"))  # 30 min ahead of the reader's clock
    assert isinstance(parse_message(ahead, now=NOW), Notice)


# -- the fuzzer -------------------------------------------------------------------------------
SAMPLES = [
    s.spot_warning(),
    s.spot_warning(action="hibernate"),
    s.rebalance(),
    s.terminate_action(),
    s.direct_lifecycle(),
    s.hook_test_notification(),
    s.state_change(),
    s.sns_wrapped(s.direct_lifecycle()),
    s.capacity_block_expiring(),
    s.capacity_block_expiring(documented=True),
]
RAW_VALUES = [DEEP, DEEP_OBJECT, BIG_INT, "-" + BIG_INT, "1e999999", "NaN", "Infinity", "null", "[]", "{}"]
json_leaf = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.floats(allow_nan=False),
    st.text(max_size=30),
    st.sampled_from(HOSTILE_TIMES),
    st.sampled_from(["terminate", "stop", "hibernate", s.INSTANCE, s.TOKEN, "aws.ec2", "aws.autoscaling"]),
)
json_value = st.recursive(
    json_leaf,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=8,
)


@st.composite
def event_time(draw: st.DrawFn) -> str:
    """Times as a hostile or careless sender writes them: any date, any offset, several ISO forms."""
    moment = draw(st.datetimes())
    minutes = draw(st.integers(-(23 * 60 + 59), 23 * 60 + 59))
    sign, minutes = ("-" if minutes < 0 else "+"), abs(minutes)
    zone = draw(st.sampled_from(["Z", f"{sign}{minutes // 60:02d}:{minutes % 60:02d}", ""]))
    form = draw(st.sampled_from(["%Y-%m-%dT%H:%M:%S", "%Y-%m-%d", "%Y%m%dT%H%M%S", "%G-W%V-%u", "%Y-%m-%d %H:%M:%S"]))
    return draw(st.sampled_from(HOSTILE_TIMES)) if draw(st.booleans()) else moment.strftime(form) + zone


def _paths(data: Any, prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    found = []
    if isinstance(data, dict):
        for key, value in data.items():
            found.append((*prefix, key))
            found.extend(_paths(value, (*prefix, key)))
    return found


@st.composite
def hostile_body(draw: st.DrawFn) -> str:
    sample = json.loads(json.dumps(draw(st.sampled_from(SAMPLES))))
    how = draw(st.sampled_from(["time", "value", "raw", "splice", "text"]))
    if how == "time":
        key = "Time" if "Time" in sample else "time"
        if key in sample:
            sample[key] = draw(event_time())
        elif "Message" in sample:
            inner = json.loads(sample["Message"])
            inner["Time"] = draw(event_time())
            sample["Message"] = json.dumps(inner)
        return json.dumps(sample)
    if how == "text":
        return draw(st.text(max_size=200))
    if how == "splice":  # cut the serialized body and insert junk: broken JSON, odd escapes
        text = json.dumps(sample)
        at = draw(st.integers(0, len(text)))
        return text[:at] + draw(st.text(max_size=20)) + text[at + draw(st.integers(0, 10)) :]
    path = draw(st.sampled_from(_paths(sample)))
    if how == "raw":
        return body_with(sample, draw(st.sampled_from(RAW_VALUES)), *path)
    target = sample
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = draw(json_value)
    return json.dumps(sample)


@fuzz_settings(300)
@given(body=hostile_body())
def test_fuzz_eventbridge_bodies_fail_only_as_unreadable_events(body):
    try:
        result = parse_message(body, now=NOW)
    except UnreadableEvent as err:
        assert "\n" not in str(err)
        return
    assert isinstance(result, (Notice, Skipped, ReservationExpiring))
    if isinstance(result, (Notice, ReservationExpiring)) and result.deadline is not None:
        assert math.isfinite(result.deadline) and result.deadline <= NOW + 3600 + 7200
