"""Damaged checkpoints: restore falls back to the previous committed step, or says clearly why not."""

import logging
from pathlib import Path

import pytest
import torch

from gpucloud.checkpoint.latest import LatestRecord
from gpucloud.checkpoint.store import CheckpointStore, latest_committed
from gpucloud.errors import UserError


@pytest.fixture
def three_steps(tmp_path, tiny_job):
    """A job with committed steps 3, 6, 9 (LATEST names 9) and the weights after 10 steps."""
    uri = str(tmp_path / "ck")
    job = tiny_job(uri, every_steps=3, keep_last=5)
    job.run(9)
    return uri, tmp_path / "ck" / "job"


def _largest_data_file(step_dir: Path) -> Path:
    return max(step_dir.glob("*.distcp"), key=lambda p: p.stat().st_size)


def _restore(tiny_job, uri, **kw) -> int:
    return tiny_job(uri, **kw).session.restore()


def test_flipped_byte_in_newest_falls_back_to_previous(three_steps, tiny_job, caplog):
    uri, job_dir = three_steps
    victim = _largest_data_file(job_dir / "step-9")
    data = bytearray(victim.read_bytes())
    data[len(data) // 2] ^= 0xFF
    victim.write_bytes(bytes(data))
    with caplog.at_level(logging.WARNING, logger="gpucloud.checkpoint"):
        assert _restore(tiny_job, uri) == 6
    assert f"skipping step-9: {job_dir / 'step-9'}: {victim.name} checksum" in caplog.text
    assert (job_dir / "step-9").exists(), "the damaged checkpoint is kept for inspection"


def test_fallback_resume_matches_uninterrupted_run(three_steps, tiny_job, tmp_path):
    uri, job_dir = three_steps
    victim = _largest_data_file(job_dir / "step-9")
    victim.write_bytes(victim.read_bytes()[:-7])  # truncated
    resumed = tiny_job(uri, every_steps=3)
    assert resumed.run(10) == 6
    reference = tiny_job(str(tmp_path / "ref"))
    reference.run(10)
    ref, got = reference.weights(), resumed.weights()
    assert all(torch.equal(ref[k], got[k]) for k in ref)


def test_missing_manifest_falls_back(three_steps, tiny_job, caplog):
    uri, job_dir = three_steps
    (job_dir / "step-9" / "manifest.json").unlink()
    with caplog.at_level(logging.WARNING, logger="gpucloud.checkpoint"):
        assert _restore(tiny_job, uri) == 6
    assert "manifest.json is missing" in caplog.text


def test_corrupt_manifest_falls_back(three_steps, tiny_job, caplog):
    uri, job_dir = three_steps
    (job_dir / "step-9" / "manifest.json").write_text('{"format": "gpucloud-checkpoint/1", "step": "nine"')
    with caplog.at_level(logging.WARNING, logger="gpucloud.checkpoint"):
        assert _restore(tiny_job, uri) == 6
    assert "manifest.json checksum" in caplog.text and "does not match LATEST's" in caplog.text


def test_corrupt_manifest_without_a_recorded_checksum_falls_back(three_steps, tiny_job, caplog):
    """A LATEST that records no checksum for the step (one pointed at it by hand) still checks the manifest."""
    uri, job_dir = three_steps
    (job_dir / "LATEST").write_text(LatestRecord(step=9).render())
    (job_dir / "step-9" / "manifest.json").write_text('{"format": "gpucloud-checkpoint/1", "step": "nine"}')
    with caplog.at_level(logging.WARNING, logger="gpucloud.checkpoint"):
        assert _restore(tiny_job, uri) == 6
    assert "invalid manifest" in caplog.text


def test_latest_naming_a_missing_step_falls_back(three_steps, tiny_job):
    uri, job_dir = three_steps
    (job_dir / "LATEST").write_text(LatestRecord(step=12).render())
    assert _restore(tiny_job, uri) == 9
    assert latest_committed(uri, "job") == 9


def test_steps_newer_than_latest_are_never_loaded(three_steps, tiny_job):
    uri, job_dir = three_steps
    (job_dir / "LATEST").write_text(LatestRecord(step=6).render())  # step-9 renamed but LATEST never moved
    assert _restore(tiny_job, uri) == 6
    assert latest_committed(uri, "job") == 6


@pytest.mark.parametrize("garbage", ["", "step-x\n", "\x00\x01\x02", "9", "step-9\n"])
def test_garbage_in_latest_is_a_clear_error_and_deletes_nothing(three_steps, tiny_job, garbage):
    uri, job_dir = three_steps
    (job_dir / "LATEST").write_text(garbage)
    before = sorted(p.name for p in job_dir.iterdir())
    with pytest.raises(
        UserError, match=r"LATEST is corrupt \(contains .*\); expected .step-<n>. on its first line"
    ) as info:
        _restore(tiny_job, uri)
    assert "\n" not in str(info.value)
    assert sorted(p.name for p in job_dir.iterdir()) == before


def test_nothing_verifies_is_a_clear_error(three_steps, tiny_job):
    uri, job_dir = three_steps
    for step in (3, 6, 9):
        (job_dir / f"step-{step}" / ".metadata").write_bytes(b"")
    with pytest.raises(UserError, match="no checkpoint of job job .* verifies \\(tried step-9, step-6, step-3\\)"):
        _restore(tiny_job, uri)


def test_corrupt_local_copy_is_read_from_the_durable_tier(tmp_path, tiny_job, caplog):
    uri, local = str(tmp_path / "ck"), str(tmp_path / "nvme")
    tiny_job(uri, local_dir=local, every_steps=2).run(4)
    victim = _largest_data_file(tmp_path / "nvme" / "job" / "step-4")
    victim.write_bytes(b"\x00" * victim.stat().st_size)
    store = CheckpointStore(uri, "job", local_dir=local)
    with caplog.at_level(logging.WARNING, logger="gpucloud.checkpoint"):
        resolved = store.resolve()
    assert (resolved.step, resolved.tier) == (4, "durable")
    assert "local copy not usable" in caplog.text


def test_stale_staging_from_a_killed_writer_is_ignored(three_steps, tiny_job):
    uri, job_dir = three_steps
    stale = job_dir / ".tmp-step-12-a0"
    stale.mkdir()
    (stale / "__0_0.distcp").write_bytes(b"partial")
    job = tiny_job(uri, every_steps=1)
    assert job.run(10) == 9
    assert not stale.exists(), "the next commit's retention removes a dead writer's staging"
