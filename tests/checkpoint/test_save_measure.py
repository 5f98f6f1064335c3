"""The session measures each committed save (bytes, start -> durable commit) and reports it to the
supervisor through the control files (the previous save's duration and bytes)."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest

from gpucloud import control
from gpucloud.checkpoint.store import CheckpointStore, default_staging_root


def test_a_periodic_save_reports_its_bytes_and_duration_in_progress(tmp_path, tiny_job):
    ctl = tmp_path / "ctl"
    job = tiny_job(str(tmp_path / "ck"), control_dir=str(ctl), every_steps=2)
    job.session.restore()
    for step in range(3):
        job.train_step()
        job.session.step_done(step + 1)
    job.session.finish()
    last = control.read(ctl, control.PROGRESS)["last_save"]
    manifest = CheckpointStore(str(tmp_path / "ck"), "job").resolve().manifest
    assert last["step"] == 2
    assert last["bytes"] == manifest.total_bytes > 0
    assert 0 < last["seconds"] < 600


def test_the_emergency_save_reports_its_own_measure_with_the_commit(tmp_path, tiny_job):
    ctl = tmp_path / "ctl"
    job = tiny_job(str(tmp_path / "ck"), control_dir=str(ctl), every_steps=100)
    job.session.restore()
    with pytest.raises(SystemExit):
        for step in range(10):
            job.train_step()
            if step + 1 == 4:
                control.write(ctl, control.PREEMPT, {"kind": "spot-interruption"})
            job.session.step_done(step + 1)
    committed = control.read(ctl, control.COMMITTED)
    assert committed["last_save"]["step"] == 4 and committed["last_save"]["bytes"] > 0


def test_an_s3_save_is_staged_on_the_nodes_nvme_scratch_not_the_root_volume(tmp_path, monkeypatch):
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    uid = os.getuid()
    node = {"GPUCLOUD_SCRATCH_PATH": str(scratch), "GPUCLOUD_NVME_SCRATCH": "1"}
    assert default_staging_root(node) == scratch / f"gpucloud-checkpoints-{uid}"
    temp = Path(tempfile.gettempdir()) / f"gpucloud-checkpoints-{uid}"
    assert default_staging_root({**node, "GPUCLOUD_NVME_SCRATCH": "0"}) == temp  # the stack made no scratch
    assert default_staging_root({"GPUCLOUD_SCRATCH_PATH": str(tmp_path / "absent")}) == temp  # not mounted
    assert default_staging_root({}) == temp  # off a cluster


def test_the_store_of_an_s3_job_stages_under_scratch(moto_s3, tmp_path, monkeypatch):
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    monkeypatch.setenv("GPUCLOUD_SCRATCH_PATH", str(scratch))
    store = CheckpointStore("s3://ckpt-bucket/runs", "job")
    assert store.local is not None and str(store.staging_path(1, "a0")).startswith(str(scratch))
