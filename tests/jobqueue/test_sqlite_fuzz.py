"""Fuzzer for job rows of the SQLite queue damaged outside gpucloud (another program, a flipped
bit): whatever one row holds, listing and claiming never fail and the other job is still there,
and each bad row costs at most one short log line. ``GPUCLOUD_FUZZ_EXAMPLES`` runs it longer."""

from __future__ import annotations

import json
import logging
import sqlite3

from hypothesis import given
from hypothesis import strategies as st

from fuzzing import fuzz_settings
from gpucloud.lifecycle.model import JobSpec
from gpucloud.queue.sqlite import SqliteQueue

_odd_values = st.one_of(
    st.integers(),
    st.integers(min_value=10**20, max_value=10**40),
    st.floats(allow_nan=False),
    st.booleans(),
    st.none(),
    st.text(max_size=20),
    st.sampled_from(["", " ", "\n", "1e400"]),
    st.lists(st.integers(), max_size=3),
    st.dictionaries(st.text(max_size=5), st.integers(), max_size=3),
)


def _raw(value: object) -> str:
    return json.dumps(value)


def _job_row_strategy() -> st.SearchStrategy[dict[str, object]]:
    columns = {
        "spec": st.one_of(
            st.text(max_size=40), _mutated_spec(), st.integers(min_value=1000, max_value=60_000).map(lambda n: "[" * n)
        ),
        "state": st.one_of(st.sampled_from(["queued", "running", "finished", "failed", "Queued", ""])),
        "attempt": st.one_of(st.integers(min_value=-2, max_value=3), st.text(max_size=5), st.floats(allow_nan=False)),
        "lease_until": st.one_of(st.none(), st.floats(), st.text(max_size=8), st.integers(min_value=-1, max_value=1)),
        "worker": st.one_of(st.none(), st.text(max_size=8), st.integers(min_value=-(2**63), max_value=2**63 - 1)),
        "created_at": st.one_of(st.floats(allow_nan=False), st.text(max_size=5)),
    }
    return st.fixed_dictionaries({}, optional=columns)


def _mutated_spec() -> st.SearchStrategy[str]:
    good = {"command": ["true"], "nodes": 1}
    return st.tuples(st.sampled_from(["command", "nodes", "env", "workdir", "max_attempts"]), _odd_values).map(
        lambda kv: _raw({**good, kv[0]: kv[1]})
    )


@fuzz_settings(40)
@given(damage=_job_row_strategy())
def test_fuzz_one_damaged_job_row_never_hides_the_rest_of_the_queue(tmp_path_factory, damage, caplog) -> None:
    caplog.clear()  # one fixture for every example
    path = tmp_path_factory.mktemp("fuzz") / "queue.db"
    q = SqliteQueue(path)
    bad, good = q.submit(JobSpec(command=["true"]), job_id="bad"), q.submit(JobSpec(command=["true"]), job_id="good")
    q.close()
    raw = sqlite3.connect(path)
    raw.execute("PRAGMA ignore_check_constraints = ON")  # damage as another program (or a bit flip) would
    for column, value in damage.items():
        raw.execute(f"UPDATE jobs SET {column} = ? WHERE id = ?", (value, bad.id))
    raw.commit()
    raw.close()
    q = SqliteQueue(path)
    try:
        with caplog.at_level(logging.WARNING, logger="gpucloud.queue.sqlite"):
            listed = {job.id for job in q.list_jobs()}
            assert good.id in listed
            claimed = q.claim("w", lease_seconds=60)
        # The good job is claimed unless the damage left the bad one claimable first.
        assert claimed is not None and claimed.id in (good.id, bad.id)
        lines = [r.getMessage() for r in caplog.records if r.name == "gpucloud.queue.sqlite"]
        assert len(lines) <= 1 and all("\n" not in line and len(line) < 600 for line in lines)
    finally:
        q.close()
