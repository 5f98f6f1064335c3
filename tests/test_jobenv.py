"""The job environment's attempt number: spot-train sets it; the training side validates it."""

from __future__ import annotations

import pytest

from gpucloud import jobenv
from gpucloud.errors import UserError


def test_the_attempt_number_is_none_outside_spot_train(monkeypatch) -> None:
    monkeypatch.delenv(jobenv.ATTEMPT, raising=False)
    assert jobenv.attempt() is None
    monkeypatch.setenv(jobenv.ATTEMPT, " 3 ")
    assert jobenv.attempt() == 3


@pytest.mark.parametrize(
    ("raw", "said"),
    [
        ("two", "is not a whole number"),
        ("-1", "must be >= 0"),
        ("9" * 40, "is not a whole number"),
        ("٣", "not a whole"),
    ],
)
def test_a_malformed_attempt_number_is_one_line(monkeypatch, raw: str, said: str) -> None:
    monkeypatch.setenv(jobenv.ATTEMPT, raw)
    with pytest.raises(UserError, match=said) as caught:
        jobenv.attempt()
    assert "\n" not in str(caught.value) and jobenv.ATTEMPT in str(caught.value)
