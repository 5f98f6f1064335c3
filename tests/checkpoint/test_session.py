"""TrainingSession in one process (no process group): save, restore, control files, errors."""

import json
import random

import pytest
import torch

from gpucloud import control, jobenv
from gpucloud.checkpoint import TrainingSession
from gpucloud.checkpoint.store import CheckpointStore, latest_committed
from gpucloud.errors import UserError


def _equal(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_resume_is_bitwise_identical_to_uninterrupted(tmp_path, tiny_job):
    reference = tiny_job(str(tmp_path / "ref"), every_steps=4)
    reference.run(10)
    resumed_first = tiny_job(str(tmp_path / "ck"), every_steps=4)
    resumed_first.run(7)  # last committed save: step 4
    # Disturb every RNG the job uses: restore must put them back.
    torch.manual_seed(4242)
    random.seed(4242)
    second = tiny_job(str(tmp_path / "ck"), every_steps=4)
    assert second.run(10) == 4
    assert second.data.position == 10
    assert _equal(second.weights(), reference.weights())
    ref_state = reference.optimizer.state_dict()["state"]
    got_state = second.optimizer.state_dict()["state"]
    assert all(_equal(ref_state[i], got_state[i]) for i in ref_state)


def test_preempt_flag_saves_that_step_commits_and_exits_75(tmp_path, tiny_job):
    ctl = tmp_path / "ctl"
    job = tiny_job(str(tmp_path / "ck"), control_dir=str(ctl), every_steps=100)
    job.session.restore()
    with pytest.raises(SystemExit) as info:
        for step in range(20):
            job.train_step()
            if step + 1 == 5:
                control.write(ctl, control.PREEMPT, {"kind": "spot-interruption", "deadline": 0})
            job.session.step_done(step + 1)
    assert info.value.code == jobenv.EXIT_REQUEUED
    assert control.read(ctl, control.ACK)["step"] == 5
    committed = control.read(ctl, control.COMMITTED)
    assert committed["step"] == 5 and committed["uri"].endswith("job/step-5")
    assert latest_committed(str(tmp_path / "ck"), "job") == 5
    weights = job.weights()
    again = tiny_job(str(tmp_path / "ck"), control_dir=str(tmp_path / "ctl2"))
    assert again.session.restore() == 5
    assert _equal(again.weights(), weights)
    assert control.read(tmp_path / "ctl2", control.RESUMED)["step"] == 5


def test_emergency_save_while_async_save_in_flight(tmp_path, tiny_job):
    ctl = tmp_path / "ctl"
    job = tiny_job(str(tmp_path / "ck"), control_dir=str(ctl), every_steps=1)
    job.session.restore()
    with pytest.raises(SystemExit):
        for step in range(10):
            job.train_step()
            if step + 1 == 3:  # step 2's async save may still be committing
                control.write(ctl, control.PREEMPT, {"kind": "spot-interruption"})
            job.session.step_done(step + 1)
    store = CheckpointStore(str(tmp_path / "ck"), "job")
    assert store.latest_durable() == 3
    resolved = store.resolve()
    assert resolved.step == 3 and resolved.manifest.step == 3
    assert not [p for p in (tmp_path / "ck" / "job").iterdir() if p.name.startswith(".tmp-")]


def test_rebalance_save_file_checkpoints_early_and_is_consumed(tmp_path, tiny_job):
    ctl = tmp_path / "ctl"
    job = tiny_job(str(tmp_path / "ck"), control_dir=str(ctl))  # no periodic saves
    job.session.restore()
    for step in range(6):
        job.train_step()
        if step + 1 == 3:
            control.write(ctl, control.SAVE, {"kind": "rebalance"})
        job.session.step_done(step + 1)
        if step + 1 == 3:
            assert not control.exists(ctl, control.SAVE)
    job.session.finish()
    assert latest_committed(str(tmp_path / "ck"), "job") == 3
    assert control.read(ctl, control.FINISHED)["step"] == 6
    assert control.read(ctl, control.PROGRESS)["step"] >= 1


def test_fresh_start_reports_resumed_zero(tmp_path, tiny_job):
    ctl = tmp_path / "ctl"
    job = tiny_job(str(tmp_path / "ck"), control_dir=str(ctl))
    assert job.session.restore() == 0
    assert control.read(ctl, control.RESUMED) | {"written_at": 0} == {
        "step": 0,
        "source_tier": None,
        "attempt": 0,
        "written_at": 0,
    }


def test_local_tier_preferred_then_durable_on_a_new_node(tmp_path, tiny_job, monkeypatch):
    monkeypatch.setenv(jobenv.ATTEMPT, "3")
    uri = str(tmp_path / "shared")
    job = tiny_job(uri, local_dir=str(tmp_path / "nvme-a"), every_steps=2)
    job.run(4)
    manifest = json.loads((tmp_path / "shared" / "job" / "step-4" / "manifest.json").read_text())
    assert manifest["attempt"] == 3 and manifest["world_size"] == 1 and manifest["step"] == 4
    assert (tmp_path / "nvme-a" / "job" / "step-4" / "manifest.json").exists()
    assert (tmp_path / "nvme-a" / "job" / "LATEST").read_text().splitlines()[0] == "step-4"

    same_node = tiny_job(uri, local_dir=str(tmp_path / "nvme-a"), control_dir=str(tmp_path / "c1"))
    same_node.session.restore()
    assert control.read(tmp_path / "c1", control.RESUMED)["source_tier"] == "local"
    new_node = tiny_job(uri, local_dir=str(tmp_path / "nvme-b"), control_dir=str(tmp_path / "c2"))
    new_node.session.restore()
    assert control.read(tmp_path / "c2", control.RESUMED)["source_tier"] == "durable"
    assert _equal(new_node.weights(), same_node.weights())


def test_retention_keeps_last_k(tmp_path, tiny_job):
    job = tiny_job(str(tmp_path / "ck"), every_steps=1, keep_last=2, local_dir=str(tmp_path / "local"))
    job.run(6)
    for root in (tmp_path / "ck" / "job", tmp_path / "local" / "job"):
        # Dot-names are not checkpoints: the durable tier's LATEST lock lives there.
        assert sorted(p.name for p in root.iterdir() if not p.name.startswith(".")) == ["LATEST", "step-5", "step-6"]


def test_bad_arguments_are_user_errors(tmp_path, monkeypatch):
    model = torch.nn.Linear(2, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    monkeypatch.delenv(jobenv.CHECKPOINT_URI, raising=False)
    monkeypatch.delenv(jobenv.JOB_ID, raising=False)
    with pytest.raises(UserError, match="no checkpoint location"):
        TrainingSession(model, opt, job_id="j")
    with pytest.raises(UserError, match="no job id"):
        TrainingSession(model, opt, checkpoint_uri=str(tmp_path))
    with pytest.raises(UserError, match="keep_last must be a whole number >= 1"):
        TrainingSession(model, opt, checkpoint_uri=str(tmp_path), job_id="j", keep_last=0)
    with pytest.raises(UserError, match=r"extra_state\['loader'\] \(int\) has no state_dict"):
        TrainingSession(model, opt, checkpoint_uri=str(tmp_path), job_id="j", extra_state={"loader": 3})
    with pytest.raises(UserError, match=r"extra_state key 'data.pos' is not usable"):
        TrainingSession(model, opt, checkpoint_uri=str(tmp_path), job_id="j", extra_state={"data.pos": opt})
    with pytest.raises(UserError, match="every_steps must be"):
        TrainingSession(model, opt, checkpoint_uri=str(tmp_path), job_id="j", every_steps=-2)
    monkeypatch.setenv(jobenv.ATTEMPT, "two")
    with pytest.raises(UserError, match="GPUCLOUD_ATTEMPT='two' is not a whole number"):
        TrainingSession(model, opt, checkpoint_uri=str(tmp_path), job_id="j")
    monkeypatch.setenv(jobenv.ATTEMPT, "0")
    sess = TrainingSession(model, opt, checkpoint_uri=str(tmp_path), job_id="j")
    with pytest.raises(UserError, match="number of completed steps"):
        sess.step_done(-1)
    sess.finish()


def test_job_environment_supplies_defaults(tmp_path, monkeypatch):
    monkeypatch.setenv(jobenv.CHECKPOINT_URI, str(tmp_path / "ck"))
    monkeypatch.setenv(jobenv.JOB_ID, "env-job")
    monkeypatch.setenv(jobenv.CONTROL_DIR, str(tmp_path / "ctl"))
    monkeypatch.setenv(jobenv.ATTEMPT, "2")
    model = torch.nn.Linear(2, 2)
    sess = TrainingSession(model, torch.optim.SGD(model.parameters(), lr=0.1), every_steps=1)
    sess.restore()
    sess.step_done(1)
    sess.finish()
    assert latest_committed(str(tmp_path / "ck"), "env-job") == 1
    assert control.read(tmp_path / "ctl", control.RESUMED)["attempt"] == 2


def test_checkpoint_of_another_model_is_a_clear_error(tmp_path, tiny_job):
    tiny_job(str(tmp_path / "ck"), every_steps=2).run(2)
    other = tiny_job(str(tmp_path / "ck"), width=32)
    with pytest.raises(
        UserError, match=r"does not fit this model/optimizer: model\.0\.bias is shape \[32\] here but shape \[16\]"
    ) as info:
        other.session.restore()
    assert "\n" not in str(info.value)
    assert latest_committed(str(tmp_path / "ck"), "job") == 2, "the checkpoint is left as it was"


def test_auto_policy_saves_first_step_then_waits_young_daly_interval(tmp_path, tiny_job):
    job = tiny_job(str(tmp_path / "ck"), auto=True, mtbi_hours=6.0)
    job.run(5)
    history = job.session.history
    assert latest_committed(str(tmp_path / "ck"), "job") == 1
    assert history.last_step == 1 and history.stall_seconds is not None
    # sqrt(2 * C * 6 h) with any measured C > 0.05 ms is > 1 s: the next 4 quick steps did not save.
    assert job.session.save_count == 1


def test_failed_periodic_save_keeps_training_and_the_previous_checkpoint(tmp_path, tiny_job, caplog):
    import logging

    job = tiny_job(str(tmp_path / "ck"), every_steps=2)
    job.session.restore()
    # Something that is not a directory where step 4's staging directory must go: its save fails.
    (tmp_path / "ck" / "job").mkdir(parents=True)
    (tmp_path / "ck" / "job" / ".tmp-step-4-a0").write_text("in the way")
    with caplog.at_level(logging.ERROR, logger="gpucloud.checkpoint"):
        for step in range(5):
            job.train_step()
            job.session.step_done(step + 1)
        job.session.wait()
    assert "checkpoint of step 4 failed, the previous checkpoint stays current" in caplog.text
    assert latest_committed(str(tmp_path / "ck"), "job") == 2
    assert job.data.position == 5, "training went on"


def test_failed_emergency_save_raises_a_clear_error_not_exit_75(tmp_path, tiny_job):
    from gpucloud.checkpoint.session import CheckpointSaveError

    ctl = tmp_path / "ctl"
    job = tiny_job(str(tmp_path / "ck"), control_dir=str(ctl))
    job.session.restore()
    (tmp_path / "ck" / "job").mkdir(parents=True)
    (tmp_path / "ck" / "job" / ".tmp-step-1-a0").write_text("in the way")
    job.train_step()
    control.write(ctl, control.PREEMPT, {"kind": "spot-interruption"})
    with pytest.raises(CheckpointSaveError, match=r"checkpoint of step 1 failed: .*Error") as info:
        job.session.step_done(1)
    assert "\n" not in str(info.value)
    assert control.read(ctl, control.ACK)["step"] == 1
    assert not control.exists(ctl, control.COMMITTED)
    assert latest_committed(str(tmp_path / "ck"), "job") is None
