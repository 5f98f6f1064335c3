"""The step rate a running attempt reports: pure, over the session's progress samples."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fuzzing import fuzz_settings
from gpucloud.jobs.progress import StepRate, round_rate


def test_no_rate_until_two_samples_then_steps_per_second_of_the_samples():
    rate = StepRate(window_s=60)
    assert rate.progress(now=0.0) is None
    rate.add(10, at=100.0)
    assert rate.rate(now=100.5) is None
    progress = rate.progress(now=100.5)
    assert progress is not None and progress.last_step == 10 and progress.step_rate is None
    rate.add(15, at=102.0)
    assert rate.rate(now=102.5) == pytest.approx(2.5)
    progress = rate.progress(now=102.5)
    assert progress is not None and (progress.last_step, progress.step_rate, progress.progress_at) == (15, 2.5, 102.0)


def test_the_rate_follows_the_last_window_not_the_whole_attempt():
    rate = StepRate(window_s=10)
    for second in range(0, 31):  # 1 step/s for 30 s ...
        rate.add(second, at=float(second))
    for second in range(31, 41):  # ... then 4 steps/s for 10 s
        rate.add(30 + 4 * (second - 30), at=float(second))
    assert rate.rate(now=40.0) == pytest.approx(4.0)


def test_the_same_file_read_again_adds_nothing():
    rate = StepRate()
    rate.add(1, at=1.0)
    rate.add(3, at=2.0)
    for _ in range(5):  # the supervisor reads the progress file at every tick
        rate.add(3, at=2.0)
    assert rate.rate(now=2.0) == pytest.approx(2.0)


def test_a_step_that_goes_back_starts_the_window_again():
    rate = StepRate()
    rate.add(50, at=1.0)
    rate.add(60, at=2.0)
    rate.add(40, at=3.0)  # restored an earlier checkpoint within the attempt
    assert rate.rate(now=3.0) is None
    rate.add(42, at=4.0)
    assert rate.rate(now=4.0) == pytest.approx(2.0)


def test_steps_slower_than_the_window_still_get_a_rate():
    rate = StepRate(window_s=60)
    rate.add(1, at=0.0)
    rate.add(2, at=300.0)  # one step in five minutes
    assert rate.rate(now=310.0) == pytest.approx(1 / 300)
    assert round_rate(1 / 300) == 0.003333


def test_a_stalled_attempt_reports_zero_not_its_old_rate():
    rate = StepRate(window_s=60)
    rate.add(0, at=0.0)
    rate.add(10, at=5.0)
    assert rate.rate(now=60.0) == pytest.approx(2.0)  # within the window: still its rate
    assert rate.rate(now=70.0) == 0.0  # nothing for longer than the window: stopped advancing


@pytest.mark.parametrize("window", [0.0, -1.0, float("nan")])
def test_a_window_must_be_positive(window):
    with pytest.raises(ValueError, match="window_s"):
        StepRate(window_s=window)


@fuzz_settings()
@given(
    st.lists(
        st.tuples(st.integers(min_value=0, max_value=10**9), st.floats(min_value=0, max_value=1e6, allow_nan=False)),
        max_size=40,
    ),
    st.floats(min_value=0, max_value=2e6, allow_nan=False),
)
def test_fuzz_any_samples_give_a_finite_non_negative_rate_and_the_newest_step(samples, now):
    rate = StepRate(window_s=30)
    for step, at in samples:
        rate.add(step, at)
    value = rate.rate(now)
    assert value is None or (value >= 0 and value == value and value != float("inf"))
    if samples:  # the newest sample is the one written last, whatever order the reads came in
        last = rate.last
        assert last is not None and last.at == max(at for _, at in samples)
