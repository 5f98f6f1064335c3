"""Training API guards: one-line UserErrors that lose nothing, finish(save=True),
and gpucloud.checkpoint.load outside any job."""

from __future__ import annotations

import pytest
import torch

from gpucloud import jobenv
from gpucloud.checkpoint import TrainingSession, load
from gpucloud.checkpoint.store import CheckpointStore
from gpucloud.errors import UserError


def _latest_bytes(root, job="job") -> bytes:
    return (root / job / "LATEST").read_bytes()


def _one_line(info) -> str:
    text = str(info.value)
    assert "\n" not in text
    return text


def test_step_done_before_restore_is_refused_and_commits_nothing(tmp_path, tiny_job):
    ck = tmp_path / "ck"
    tiny_job(str(ck), every_steps=2).run(4)
    before = _latest_bytes(ck)
    job = tiny_job(str(ck), every_steps=1)  # would save at every step
    job.train_step()
    with pytest.raises(
        UserError, match=r"step_done\(1\) before restore\(\): call `start = sess.restore\(\)` first"
    ) as info:
        job.session.step_done(1)
    _one_line(info)
    with pytest.raises(UserError, match=r"save_now\(\) before restore\(\)"):
        job.session.save_now()
    with pytest.raises(UserError, match=r"save_now\(\) before restore\(\)"):
        job.session.finish(save=True)
    assert _latest_bytes(ck) == before, "LATEST still names step 4, not a step-1 of untrained weights"
    assert job.session.restore() == 4


def test_a_step_that_goes_backwards_is_refused_and_loses_nothing(tmp_path, tiny_job):
    ck = tmp_path / "ck"
    job = tiny_job(str(ck), every_steps=1)
    job.session.restore()
    for step in range(3):
        job.train_step()
        job.session.step_done(step + 1)
    job.session.wait()
    before = _latest_bytes(ck)
    with pytest.raises(UserError, match=r"step_done\(2\) after step 3: steps never go backwards") as info:
        job.session.step_done(2)
    _one_line(info)
    job.session.wait()
    assert _latest_bytes(ck) == before
    assert CheckpointStore(str(ck), "job").latest_durable() == 3
    job.session.step_done(3)  # the same step again is harmless
    job.train_step()
    job.session.step_done(4)  # and the session goes on
    job.session.finish()
    assert CheckpointStore(str(ck), "job").latest_durable() == 4


def test_step_done_after_finish_is_refused(tmp_path, tiny_job):
    job = tiny_job(str(tmp_path / "ck"))
    job.run(2)
    with pytest.raises(UserError, match=r"step_done\(3\) after finish\(\)"):
        job.session.step_done(3)


def test_a_model_of_another_width_names_the_tensor_and_both_shapes(tmp_path, tiny_job):
    ck = tmp_path / "ck"
    tiny_job(str(ck), every_steps=2).run(2)
    before = _latest_bytes(ck)
    other = tiny_job(str(ck), width=32)
    with pytest.raises(
        UserError,
        match=r"does not fit this model/optimizer: model\.0\.bias is shape \[32\] here but shape \[16\] in the checkpoint; model\.0\.weight is shape \[32, 8\] here but shape \[16, 8\] in the checkpoint; .* and \d+ more$",
    ) as info:
        other.session.restore()
    _one_line(info)
    assert _latest_bytes(ck) == before


def _session(uri, model, optimizer, **kw) -> TrainingSession:
    return TrainingSession(model, optimizer, checkpoint_uri=str(uri), job_id="job", **kw)


def _train(model, optimizer, steps: int) -> None:
    for i in range(steps):
        x = torch.randn(4, 8, generator=torch.Generator().manual_seed(i))
        loss = model(x).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()


def test_a_model_missing_a_layer_is_refused_not_silently_partly_loaded(tmp_path):
    # DCP ignores checkpoint keys the live state does not ask for: without the guard, a model with
    # a layer removed would "resume" and train on with that layer dropped.
    torch.manual_seed(0)
    big = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 8), torch.nn.Linear(8, 1))
    sess = _session(tmp_path, big, None)
    sess.restore()
    sess.save_now(1)
    sess.finish()
    before = _latest_bytes(tmp_path)
    small = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 8))
    with pytest.raises(
        UserError,
        match=r"the checkpoint has model\.2\.bias, which this model lacks; the checkpoint has model\.2\.weight",
    ) as info:
        _session(tmp_path, small, None).restore()
    _one_line(info)
    deeper = torch.nn.Sequential(*big, torch.nn.Linear(1, 1))
    with pytest.raises(UserError, match=r"model\.3\.bias is not in the checkpoint"):
        _session(tmp_path, deeper, None).restore()
    assert _latest_bytes(tmp_path) == before


def test_an_optimizer_of_another_kind_is_named_as_such(tmp_path):
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 1)
    adam = torch.optim.AdamW(model.parameters(), lr=1e-2)
    _train(model, adam, 2)
    sess = _session(tmp_path, model, adam)
    sess.restore()
    sess.save_now(2)
    sess.finish()
    before = _latest_bytes(tmp_path)
    sgd = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    with pytest.raises(
        UserError, match=r"optim\..* \(was it saved with another optimizer or other optimizer settings\?\)"
    ) as info:
        _session(tmp_path, model, sgd).restore()
    _one_line(info)
    assert _latest_bytes(tmp_path) == before


def test_finish_save_true_commits_the_final_step(tmp_path, tiny_job):
    ck = tmp_path / "ck"
    job = tiny_job(str(ck), every_steps=4)
    job.run(6)  # finish() without save: step 4 is the last committed one
    assert CheckpointStore(str(ck), "job").latest_durable() == 4
    job = tiny_job(str(ck), every_steps=4)
    job.session.restore()
    for step in range(4, 7):
        job.train_step()
        job.session.step_done(step + 1)
    job.session.finish(save=True)
    assert CheckpointStore(str(ck), "job").latest_durable() == 7
    fresh = tiny_job(str(ck))
    assert fresh.session.restore() == 7
    assert all(torch.equal(a, b) for a, b in zip(fresh.weights().values(), job.weights().values(), strict=True))


def _evaluation_model(width: int = 16) -> torch.nn.Module:
    return torch.nn.Sequential(
        torch.nn.Linear(8, width), torch.nn.Dropout(0.2), torch.nn.BatchNorm1d(width), torch.nn.Linear(width, 1)
    )


def test_load_reads_the_committed_checkpoint_outside_any_job(tmp_path, tiny_job, monkeypatch):
    ck = tmp_path / "ck"
    job = tiny_job(str(ck), job_id="run-1", every_steps=3)
    job.run(5)  # committed: step 3 (finish() without save)
    for name in (jobenv.CHECKPOINT_URI, jobenv.JOB_ID, jobenv.ATTEMPT, jobenv.CONTROL_DIR):
        monkeypatch.delenv(name, raising=False)
    before = _latest_bytes(ck, "run-1")
    expected = tiny_job(str(tmp_path / "other"), job_id="x")
    expected.session.restore()
    for _ in range(3):
        expected.train_step()
    expected.session.finish()

    model = _evaluation_model()
    assert load(str(ck / "run-1"), model) == 3  # the job's directory: the job id is its last part
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), expected.weights().values(), strict=True))
    again = _evaluation_model()
    assert load(f"file://{ck}/", again, job_id="run-1") == 3  # the root and the job id
    assert all(torch.equal(a, b) for a, b in zip(again.state_dict().values(), model.state_dict().values(), strict=True))
    assert _latest_bytes(ck, "run-1") == before, "load() never claims the job (a running attempt keeps its fence)"


def test_load_skips_a_damaged_step_like_restore_does(tmp_path, tiny_job):
    ck = tmp_path / "ck"
    tiny_job(str(ck), every_steps=2).run(4)  # steps 2 and 4 committed
    shard = next((ck / "job" / "step-4").glob("*.distcp"))
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF
    shard.write_bytes(bytes(data))
    assert load(str(ck / "job"), _evaluation_model()) == 2


def test_load_errors_are_one_line(tmp_path, tiny_job):
    ck = tmp_path / "ck"
    tiny_job(str(ck), every_steps=2).run(2)
    with pytest.raises(UserError, match=r"no committed checkpoint of job nope under .* \(no LATEST there\)"):
        load(str(ck / "nope"), _evaluation_model())
    with pytest.raises(UserError, match=r"names 'step-2' inside a job's directory; give the job's directory itself"):
        load(str(ck / "job" / "step-2"), _evaluation_model())
    with pytest.raises(UserError, match=r"names no job"):
        load("s3://some-bucket", _evaluation_model())
    with pytest.raises(UserError, match=r"model\.0\.weight is shape \[4, 8\] here but shape \[16, 8\]"):
        load(str(ck / "job"), _evaluation_model(width=4))
    with pytest.raises(UserError, match=r"has no state for extra_state \['sched'\]; it has \['data'\]"):
        load(
            str(ck / "job"),
            _evaluation_model(),
            extra_state={
                "sched": torch.optim.lr_scheduler.StepLR(torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=1), 1)
            },
        )


def test_load_with_optimizer_and_extra_state_puts_them_back(tmp_path, tiny_job):
    from helpers.tiny_job import Counter

    ck = tmp_path / "ck"
    job = tiny_job(str(ck), every_steps=3)
    job.run(3)
    model = _evaluation_model()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    data = Counter()
    assert load(str(ck / "job"), model, optimizer, extra_state={"data": data}) == 3
    assert data.position == 3
    ref = job.optimizer.state_dict()["state"]
    got = optimizer.state_dict()["state"]
    assert all(torch.equal(ref[i]["exp_avg"], got[i]["exp_avg"]) for i in ref)


def test_load_from_s3_downloads_verifies_and_loads(moto_s3, tmp_path, tiny_job):
    job = tiny_job("s3://ckpt-bucket/runs", local_dir=str(tmp_path / "node-a"), every_steps=2)
    job.run(4)
    model = _evaluation_model()
    # The job's directory on S3; the download lands in local_dir and is verified there.
    assert load("s3://ckpt-bucket/runs/job", model, local_dir=str(tmp_path / "laptop")) == 4
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), job.weights().values(), strict=True))
    assert (tmp_path / "laptop" / "job" / "step-4" / "manifest.json").exists()
