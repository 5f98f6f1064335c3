"""RateLimitedLog: the one mechanism that keeps a repeating problem to one line per interval."""

from __future__ import annotations

import logging

import pytest

from gpucloud.signals.ratelimit import RateLimitedLog

from .helpers import FakeClock


def test_one_line_per_key_per_interval_then_a_count_of_the_rest(caplog):
    clock = FakeClock(1000.0)
    logs = RateLimitedLog(logging.getLogger("gpucloud.signals.test"), interval=60, clock=clock)
    with caplog.at_level(logging.WARNING, logger="gpucloud.signals.test"):
        assert logs.warning("token", "token answered %s", 503)
        for _ in range(124):
            clock.advance(0.05)
            assert not logs.warning("token", "token answered %s", 503)
        assert logs.warning("other", "another problem")  # keys are limited separately
        clock.advance(60)
        assert logs.warning("token", "token answered %s", 500)
    lines = [r.getMessage() for r in caplog.records]
    assert lines == [
        "token answered 503",
        "another problem",
        "token answered 500 (and 124 more like this in the last 60s)",
    ]


def test_forget_lets_the_next_occurrence_through(caplog):
    logs = RateLimitedLog(logging.getLogger("gpucloud.signals.test"), clock=FakeClock(0.0))
    with caplog.at_level(logging.WARNING, logger="gpucloud.signals.test"):
        logs.warning("k", "down")
        logs.forget("k")
        logs.warning("k", "down again")
    assert [r.getMessage() for r in caplog.records] == ["down", "down again"]


def test_many_distinct_keys_share_one_budget(caplog):
    logs = RateLimitedLog(logging.getLogger("gpucloud.signals.test"), clock=FakeClock(0.0))
    with caplog.at_level(logging.WARNING, logger="gpucloud.signals.test"):
        for index in range(5000):
            logs.warning(f"key-{index}", "problem %d", index)
    assert len(caplog.records) <= 1025


def test_interval_must_be_positive():
    with pytest.raises(ValueError, match="interval"):
        RateLimitedLog(logging.getLogger("x"), interval=0)


def test_the_line_names_the_caller_not_the_limiter(caplog):
    logs = RateLimitedLog(logging.getLogger("gpucloud.signals.test"), clock=FakeClock(0.0))
    with caplog.at_level(logging.WARNING, logger="gpucloud.signals.test"):
        logs.warning("a", "x")
        logs.log(logging.ERROR, "b", "y")
    assert [r.filename for r in caplog.records] == ["test_ratelimit.py", "test_ratelimit.py"]
