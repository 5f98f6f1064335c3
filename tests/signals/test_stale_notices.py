"""One age rule for every source (interpret.is_stale): a notice whose deadline, or (without one)
whose issue time, is more than 300 s past is ignored, whether IMDS serves it or it waited in the
events queue. A table of every source at the ages an attack used, and a fuzzer over ages."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fuzzing import fuzz_settings
from gpucloud.signals import interpret
from gpucloud.signals.eventbridge import QueueRules, Skipped, parse_message
from signals import eventbridge_samples as s

T = s.EVENT_EPOCH
LIFECYCLE_TIMEOUT = QueueRules().lifecycle_timeout
# source -> (parse(now) -> notice or None, the notice's moment: its deadline, or its issue time)
SOURCES = {
    "IMDS spot/instance-action": (
        lambda now: interpret.instance_action_notice(json.dumps({"action": "terminate", "time": s.EVENT_TIME}), now),
        T,
    ),
    "IMDS spot/termination-time": (lambda now: interpret.termination_time_notice(s.EVENT_TIME, now), T),
    "IMDS rebalance": (lambda now: interpret.rebalance_notice(json.dumps({"noticeTime": s.EVENT_TIME}), now), T),
    "EventBridge spot warning": (lambda now: parse_message(s.body(s.spot_warning()), now=now), T + 120),
    "EventBridge spot warning, hibernate": (
        lambda now: parse_message(s.body(s.spot_warning(action="hibernate")), now=now),
        T,
    ),
    "EventBridge rebalance": (lambda now: parse_message(s.body(s.rebalance()), now=now), T),
    "EventBridge terminate lifecycle action": (
        lambda now: parse_message(s.body(s.terminate_action()), now=now),
        T + LIFECYCLE_TIMEOUT,
    ),
    "lifecycle hook straight to SQS": (
        lambda now: parse_message(s.body(s.direct_lifecycle()), now=now),
        T + 0.517 + LIFECYCLE_TIMEOUT,
    ),
    "SNS-wrapped spot warning": (lambda now: parse_message(s.body(s.sns_wrapped(s.spot_warning())), now=now), T + 120),
    "capacity block expiring": (lambda now: parse_message(s.body(s.capacity_block_expiring()), now=now), T + 600),
}
YEAR = 365 * 86400.0
STALE_AGES = {"years": 3 * YEAR, "a day": 86400.0, "an hour": 3600.0, "301 s past the moment": None}


def _acted_on(result: object) -> bool:
    return result is not None and not isinstance(result, Skipped)


@pytest.mark.parametrize("age", sorted(STALE_AGES))
@pytest.mark.parametrize("source", sorted(SOURCES))
def test_a_stale_notice_from_any_source_is_ignored(source: str, age: str) -> None:
    parse, moment = SOURCES[source]
    now = moment + 301.0 if STALE_AGES[age] is None else T + STALE_AGES[age]
    result = parse(now)
    assert not _acted_on(result), f"{source} {age} old became {result}"
    if isinstance(result, Skipped):
        assert "stale" in result.reason and "\n" not in result.reason


@pytest.mark.parametrize("source", sorted(SOURCES))
def test_a_fresh_notice_from_any_source_is_acted_on(source: str) -> None:
    parse, moment = SOURCES[source]
    for now in (T + 7.0, moment + 299.0):
        assert _acted_on(parse(now)), f"{source} read at {now - T:.0f}s"


@fuzz_settings()
@given(source=st.sampled_from(sorted(SOURCES)), age=st.floats(min_value=0.0, max_value=20 * YEAR))
def test_every_source_follows_the_one_rule(source: str, age: float) -> None:
    parse, moment = SOURCES[source]
    now = T + age
    if abs(now - (moment + interpret.DEFAULT_STALE_AFTER)) < 0.01:
        return  # at the boundary itself, float rounding decides
    assert _acted_on(parse(now)) == (not interpret.is_stale(moment, now))
