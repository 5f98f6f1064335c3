"""Keep it found: whatever a script passes to step_done(), and whatever URI it
passes to load(), the answer is a committed LATEST that never goes backwards, or one-line UserError."""

from __future__ import annotations

import tempfile

import torch
from hypothesis import given
from hypothesis import strategies as st

from fuzzing import fuzz_settings
from gpucloud.checkpoint import TrainingSession
from gpucloud.checkpoint.loading import split_job_uri
from gpucloud.checkpoint.store import CheckpointStore
from gpucloud.errors import UserError

_calls = st.lists(
    st.one_of(st.integers(min_value=-3, max_value=12), st.booleans(), st.floats(allow_nan=True), st.none()),
    min_size=1,
    max_size=8,
)


@fuzz_settings(25)
@given(calls=_calls, restore_first=st.booleans())
def test_fuzz_step_done_never_moves_latest_backwards(calls, restore_first):
    with tempfile.TemporaryDirectory() as root:
        model = torch.nn.Linear(2, 1)
        sess = TrainingSession(
            model, torch.optim.SGD(model.parameters(), lr=0.1), checkpoint_uri=root, job_id="j", every_steps=1
        )
        store = CheckpointStore(root, "j")
        if restore_first:
            sess.restore()
        newest = None
        for value in calls:
            try:
                sess.step_done(value)
            except UserError as exc:
                assert "\n" not in str(exc)
            sess.wait()
            latest = store.latest_durable()
            assert latest is None or newest is None or latest >= newest
            newest = latest if latest is not None else newest
        if not restore_first:
            assert store.latest_durable() is None, "nothing is committed before restore()"
        sess.finish()


_uri_parts = st.text(alphabet="abc/._-:s3LATESTstep-0123 \\", max_size=40)


@fuzz_settings(300)
@given(uri=_uri_parts, job_id=st.one_of(st.none(), st.text(max_size=20)))
def test_fuzz_load_uri_is_split_or_refused_in_one_line(uri, job_id):
    try:
        root, job = split_job_uri(uri, job_id)
    except UserError as exc:
        assert "\n" not in str(exc)
        return
    assert job and "/" not in job
    if job_id is not None:
        assert (root, job) == (uri, job_id)
