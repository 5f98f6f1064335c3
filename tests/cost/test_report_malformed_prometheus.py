"""`gpucloud report --prometheus` on answers that are not what Prometheus documents: a sample whose
value is a string or infinite, a time no calendar holds, a document nested past the parser's
stack, parts of the wrong type. Never a traceback: the bad samples are left out (the good ones
still count), or the answer is one line; the report's JSON stays strict."""

from __future__ import annotations

import json
import math
import time
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fuzzing import fuzz_settings
from gpucloud.cost.report_sources import utilisation_from_matrix
from gpucloud.errors import UserError

from .report_seed import interrupted_job, write_sqlite
from .test_report import run
from .test_report_prometheus import STEP, prometheus  # noqa: F401 - the fixture

GOOD = {"metric": {"job_id": "j1", "instance_id": "i-a", "gpu": "0"}}


def _answer(samples: list, *, now: float) -> dict:
    good = [[now - 7000, "80"], [now - 6940, "2"]]
    return {
        "status": "success",
        "data": {"resultType": "matrix", "result": [{**GOOD, "values": good + samples}]},
    }


BAD_SAMPLES = {
    "a string value": lambda now: [[now - 6880, "abc"]],
    "+Inf": lambda now: [[now - 6880, "+Inf"]],
    "-Inf": lambda now: [[now - 6880, "-Inf"]],
    "a number value": lambda now: [[now - 6880, 1e400]],
    "a time of 1e308": lambda now: [[1e308, "50"]],
    "a time of -1e308": lambda now: [[-1e308, "50"]],
    "a time as text": lambda now: [["noon", "50"]],
    "a time far outside the window": lambda now: [[now + 10 * 365 * 86400, "50"]],
    "a sample of three": lambda now: [[now - 6880, "50", "x"]],
    "a sample that is a string": lambda now: ["50"],
    "a sample that is a mapping": lambda now: [{"t": 1}],
    "a nested value": lambda now: [[now - 6880, [[["50"]]]]],
    "a boolean value": lambda now: [[now - 6880, True]],
}


def _report(capsys, tmp_path: Path, url: str) -> tuple[int, str, str]:
    now = time.time()
    uri = write_sqlite(tmp_path / "q.db", [interrupted_job("j1", start=now - 7400)])
    return run(capsys, "report", "--queue", uri, "--since", "3h", "-o", "json", "--prometheus", url)


@pytest.mark.parametrize("name", sorted(BAD_SAMPLES))
def test_a_bad_sample_is_left_out_and_the_good_ones_count(prometheus, tmp_path, capsys, name):
    url, state = prometheus
    state.answer = _answer(BAD_SAMPLES[name](time.time()), now=time.time())
    state.answer = json.dumps(state.answer).replace("1e+400", "1e400").encode()
    code, out, err = _report(capsys, tmp_path, url)
    assert code == 0 and "Traceback" not in err, err
    [job] = json.loads(out)["jobs"]
    assert job["gpu_utilisation_pct"] == 41.0  # (80 + 2) / 2: the bad sample changed nothing


RAW_ANSWERS = {
    "nested 100000 deep": b'{"status": "success", "data": ' + b"[" * 100_000 + b"]" * 100_000 + b"}",
    "Infinity as a JSON value": b'{"status": "success", "data": {"resultType": "matrix", "result": '
    b'[{"metric": {"job_id": "j1"}, "values": [[1, Infinity], [2, -Infinity], [3, NaN]]}]}}',
    "a 5000-digit number": b'{"status": "success", "data": {"resultType": "matrix", "result": [' + b"1" * 5000 + b"]}}",
    "data is a list": b'{"status": "success", "data": [1, 2]}',
    "result is a mapping": b'{"status": "success", "data": {"resultType": "matrix", "result": {"a": 1}}}',
    "a series that is a string": b'{"status": "success", "data": {"resultType": "matrix", "result": ["x"]}}',
    "metric is a list": b'{"status": "success", "data": {"resultType": "matrix", "result": [{"metric": [1], "values": []}]}}',
    "values is a mapping": b'{"status": "success", "data": {"resultType": "matrix", "result": [{"metric": {"job_id": "j1"}, "values": {}}]}}',
    "not JSON": b"<html>502 Bad Gateway</html>",
    "not UTF-8": b'{"status": "\xff\xfe"}',
    "a list": b"[1, 2, 3]",
}


@pytest.mark.parametrize("name", sorted(RAW_ANSWERS))
def test_a_malformed_answer_is_a_report_or_one_line(prometheus, tmp_path, capsys, name):
    url, state = prometheus
    state.answer = RAW_ANSWERS[name]
    code, out, err = _report(capsys, tmp_path, url)
    assert "Traceback" not in err, err
    if code == 0:
        [job] = json.loads(out)["jobs"]
        assert job["gpu_utilisation_pct"] is None  # nothing readable for it: unknown
    else:
        lines = [line for line in err.splitlines() if line.strip()]
        assert code == 2 and len(lines) == 1 and "Prometheus at" in lines[0], err


JSONISH = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.dictionaries(st.sampled_from(["job_id", "metric", "values", "x"]), inner, max_size=3)
    ),
    max_leaves=12,
)
SAMPLE = st.one_of(st.lists(JSONISH, max_size=3), JSONISH)


@fuzz_settings()
@given(
    series=st.lists(
        st.one_of(
            st.fixed_dictionaries(
                {
                    "metric": st.one_of(st.just({"job_id": "j"}), JSONISH),
                    "values": st.lists(SAMPLE, max_size=5) | JSONISH,
                }
            ),
            JSONISH,
        ),
        max_size=4,
    )
)
def test_fuzzed_matrices_never_crash_nor_yield_a_non_finite_number(series) -> None:
    body = {"status": "success", "data": {"resultType": "matrix", "result": series}}
    try:
        got = utilisation_from_matrix(body, source="p", step_s=STEP, since=0.0, until=1e10)
    except UserError as err:
        assert "\n" not in str(err)
        return
    numbers = [v for pair in got.per_job.values() for v in pair] + [v for pair in got.series for v in pair]
    assert all(math.isfinite(v) for v in numbers)
    json.dumps({"per_job": got.per_job, "series": got.series}, allow_nan=False)
