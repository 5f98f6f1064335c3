"""The parts of the framework contract that need no framework: where checkpoints go, and which
checkpoint a resume may use (only what LATEST names; anything else is a one-line UserError)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpucloud import control
from gpucloud.errors import UserError
from gpucloud.integrations import _contract


def test_checkpoint_dir_is_under_the_jobs_directory(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("GPUCLOUD_CHECKPOINT_URI", f"file://{tmp_path}")
    monkeypatch.setenv("GPUCLOUD_JOB_ID", "bert-ft")
    assert _contract.checkpoint_dir("hf-trainer") == tmp_path / "bert-ft" / "hf-trainer"


def test_checkpoint_dir_refuses_s3_in_one_line() -> None:
    with pytest.raises(UserError, match="shared file system path") as err:
        _contract.checkpoint_dir("lightning", checkpoint_uri="s3://my-bucket/ckpt", job_id="j")
    assert "\n" not in str(err.value)


def test_checkpoint_dir_without_a_job_environment_says_what_to_set(monkeypatch) -> None:
    monkeypatch.delenv("GPUCLOUD_CHECKPOINT_URI", raising=False)
    with pytest.raises(UserError, match="GPUCLOUD_CHECKPOINT_URI"):
        _contract.checkpoint_dir("lightning")


def test_a_fresh_job_has_no_committed_checkpoint(tmp_path: Path) -> None:
    assert _contract.committed_checkpoint(tmp_path) is None


def test_a_half_written_newer_checkpoint_is_never_resumed(tmp_path: Path) -> None:
    (tmp_path / "checkpoint-5").mkdir()
    (tmp_path / "checkpoint-5" / "model.safetensors").write_bytes(b"complete")
    _contract.commit(tmp_path, "checkpoint-5", 5)
    (tmp_path / "checkpoint-9").mkdir()  # a writer killed mid-save: never committed
    assert _contract.committed_checkpoint(tmp_path) == tmp_path / "checkpoint-5"
    assert json.loads((tmp_path / "LATEST").read_text())["step"] == 5


@pytest.mark.parametrize("body", [b"step-5", b'{"checkpoint": "../elsewhere"}', b"\xff\xfe", b'{"checkpoint": 5}'])
def test_a_pointer_we_did_not_write_is_one_line(tmp_path: Path, body: bytes) -> None:
    (tmp_path / "LATEST").write_bytes(body)
    with pytest.raises(UserError, match="not a pointer gpucloud wrote") as err:
        _contract.committed_checkpoint(tmp_path)
    assert "\n" not in str(err.value)


def test_a_pointer_to_a_missing_checkpoint_says_so(tmp_path: Path) -> None:
    (tmp_path / "LATEST").write_text(json.dumps({"checkpoint": "checkpoint-7", "step": 7}))
    with pytest.raises(UserError, match="names checkpoint-7, which is missing"):
        _contract.committed_checkpoint(tmp_path)


def test_a_notice_is_acknowledged_once_at_the_agreed_step(tmp_path: Path) -> None:
    contract = _contract.SpotContract(str(tmp_path))
    contract.start(0, data_position="restored")
    assert control.read(tmp_path, control.RESUMED)["step"] == 0
    assert not contract.preempt_agreed(1)
    control.write(tmp_path, control.PREEMPT, {"kind": "spot-interruption"})
    assert contract.preempt_agreed(2) and contract.preempt_agreed(3)
    assert contract.stopping_at == 2
    assert control.read(tmp_path, control.ACK)["step"] == 2


def test_a_committed_notice_save_exits_75_after_latest_names_it(tmp_path: Path) -> None:
    ckpt = tmp_path / "ckpt"
    (ckpt / "step-4.ckpt").parent.mkdir()
    (ckpt / "step-4.ckpt").write_bytes(b"state")
    contract = _contract.SpotContract(str(tmp_path / "control"))
    contract.start(0, data_position="restored")
    control.write(tmp_path / "control", control.PREEMPT, {"kind": "spot-interruption"})
    assert contract.preempt_agreed(4)
    with pytest.raises(SystemExit) as stop:
        contract.saved(ckpt, "step-4.ckpt", 4)
    assert stop.value.code == 75
    assert _contract.committed_checkpoint(ckpt) == ckpt / "step-4.ckpt"
    assert control.read(tmp_path / "control", control.COMMITTED)["step"] == 4


def test_lightning_every_n_steps_must_be_a_whole_number(tmp_path: Path) -> None:
    pytest.importorskip("lightning")
    from gpucloud.integrations.lightning import SpotCheckpoint

    with pytest.raises(UserError, match="every_n_steps must be a whole number >= 1"):
        SpotCheckpoint(tmp_path, every_n_steps=0)
