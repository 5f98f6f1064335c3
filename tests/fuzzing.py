"""How long the property-based fuzzers run: bounded in the suite, longer for a nightly run.

``GPUCLOUD_FUZZ_EXAMPLES`` sets the examples per fuzzer (default: a number that keeps all the
fuzzers together under a minute of the test command on a 2-core machine). Use it as::

    from fuzzing import fuzz_settings

    @fuzz_settings()
    @given(...)
    def test_...(...): ...
"""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings

DEFAULT_EXAMPLES = 60
ENV = "GPUCLOUD_FUZZ_EXAMPLES"


def examples(default: int = DEFAULT_EXAMPLES) -> int:
    raw = os.environ.get(ENV)
    if raw is None:
        return default
    if not raw.isdigit() or int(raw) < 1:
        raise ValueError(f"{ENV}={raw!r} is not a positive whole number of examples")
    return int(raw)


def fuzz_settings(default: int = DEFAULT_EXAMPLES) -> settings:
    """Settings for one fuzzer: its example count, no deadline (a loaded CI machine is slow, not
    wrong), no example database (the suite must not depend on earlier runs), derandomized unless
    a longer run was asked for, so the default suite is repeatable."""
    nightly = ENV in os.environ
    return settings(
        max_examples=examples(default),
        deadline=None,
        database=None,
        derandomize=not nightly,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
    )
