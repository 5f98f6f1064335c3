import math

import pytest

from gpucloud.checkpoint.policy import SaveHistory, SavePolicy, auto_interval, should_save, young_daly_interval
from gpucloud.checkpoint.retention import steps_to_delete
from gpucloud.errors import UserError


def test_young_daly_is_sqrt_2_c_mtbi():
    assert young_daly_interval(10.0, 6 * 3600) == pytest.approx(math.sqrt(2 * 10 * 21600))
    assert young_daly_interval(0.0, 3600) == 0.0


def test_every_steps_fires_on_multiples_only():
    policy = SavePolicy(every_steps=5)
    fired = [s for s in range(1, 21) if should_save(policy, s, 0.0, SaveHistory(last_time=0.0))]
    assert fired == [5, 10, 15, 20]


def test_every_seconds_measures_from_last_save():
    policy = SavePolicy(every_seconds=60)
    assert not should_save(policy, 3, 59.0, SaveHistory(last_step=1, last_time=0.0))
    assert should_save(policy, 3, 60.0, SaveHistory(last_step=1, last_time=0.0))


def test_auto_saves_first_boundary_then_young_daly_interval():
    policy = SavePolicy(auto=True, mtbi_seconds=3600)
    assert should_save(policy, 1, 5.0, SaveHistory(last_time=0.0))  # nothing measured yet
    measured = SaveHistory(last_step=1, last_time=0.0, stall_seconds=2.0, persist_seconds=1.0)
    interval = math.sqrt(2 * 2.0 * 3600)  # 120 s
    assert auto_interval(measured, 3600) == pytest.approx(interval)
    assert not should_save(policy, 50, interval - 1, measured)
    assert should_save(policy, 51, interval + 1, measured)


def test_auto_interval_never_shorter_than_persist_time():
    slow_persist = SaveHistory(last_step=1, last_time=0.0, stall_seconds=0.001, persist_seconds=30.0)
    assert auto_interval(slow_persist, 3600) == 30.0


def test_same_step_never_saved_twice():
    assert not should_save(SavePolicy(every_steps=1), 4, 0.0, SaveHistory(last_step=4, last_time=0.0))


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"every_steps": 0}, "every_steps must be a whole number >= 1"),
        ({"every_steps": True}, "every_steps must be a whole number >= 1"),
        ({"every_seconds": -1.0}, "every_seconds must be a finite number > 0"),
        ({"every_seconds": float("inf")}, "every_seconds must be a finite number > 0"),
        ({"mtbi_seconds": 0.0}, "mtbi_hours must be a finite number > 0"),
    ],
)
def test_bad_policy_settings_are_user_errors(kwargs, message):
    with pytest.raises(UserError, match=message):
        SavePolicy(**kwargs)


def test_retention_keeps_last_k_and_protected():
    assert steps_to_delete([10, 20, 30, 40, 50], keep_last=2) == [10, 20, 30]
    # LATEST names 20 (e.g. after a fallback) and 30 is in flight: both survive.
    assert steps_to_delete([10, 20, 30, 40, 50], keep_last=2, protected=[20, 30]) == [10]
    assert steps_to_delete([], keep_last=3) == []
    with pytest.raises(ValueError):
        steps_to_delete([1], keep_last=0)
