"""A step is valid only if every file in it, and every file DCP's metadata references, is listed
in its manifest and verifies; the manifest itself is checked against LATEST.

The reproduction: step-20's manifest lists no files, or leaves one shard out, and that shard has
one flipped byte. Before, restore loaded step 20 (corrupt weights at some offsets, "does not fit
this model/optimizer" at others); now it falls back to step 15, bitwise identical to what was saved.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
import torch

from gpucloud.checkpoint.latest import LatestRecord
from gpucloud.checkpoint.store import CheckpointStore

OFFSETS = 62


def fingerprint(job) -> dict[str, torch.Tensor]:
    """Everything a restore puts back: weights, buffers, optimizer state, RNG, data position."""
    out = {f"model.{k}": v.detach().clone() for k, v in job.model.state_dict().items()}
    for pid, per_param in job.optimizer.state_dict()["state"].items():
        for k, v in per_param.items():
            out[f"optim.{pid}.{k}"] = torch.as_tensor(v).clone()
    out["rng.torch"] = torch.get_rng_state().clone()
    out["rng.python"] = torch.tensor(random.getstate()[1])
    out["data.position"] = torch.tensor(job.data.position)
    return out


def identical(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.fixture(scope="module")
def job_15_20(tmp_path_factory):
    """Committed steps 15 and 20 of a job whose shards are mostly tensor bytes (width 64), the
    state saved at step 15, and the largest shard of step 20."""
    from helpers.tiny_job import TinyJob

    base = tmp_path_factory.mktemp("job")
    uri = str(base / "ck")
    TinyJob(uri, every_steps=5, keep_last=5, width=64).run(20)
    reference = TinyJob(str(base / "ref"), width=64)
    reference.run(15)
    shard = max((base / "ck" / "job" / "step-20").glob("*.distcp"), key=lambda p: p.stat().st_size)
    return uri, base / "ck" / "job", fingerprint(reference), shard


def _unlist(manifest_path: Path, variant: str, shard: Path) -> None:
    manifest = json.loads(manifest_path.read_text())
    if variant == "no files listed":
        manifest["files"] = []
    else:
        manifest["files"] = [f for f in manifest["files"] if f["name"] != shard.name]
    manifest_path.write_text(json.dumps(manifest))


@pytest.mark.parametrize("latest", ["as committed", "no manifest checksum"])
@pytest.mark.parametrize("variant", ["no files listed", "shard left out"])
def test_unlisted_flipped_shard_falls_back_at_every_offset(job_15_20, variant, latest):
    uri, job_dir, _, shard = job_15_20
    manifest_path, latest_path = job_dir / "step-20" / "manifest.json", job_dir / "LATEST"
    pristine = {p: p.read_bytes() for p in (shard, manifest_path, latest_path)}
    size = len(pristine[shard])
    resolved_steps = []
    try:
        _unlist(manifest_path, variant, shard)
        if latest != "as committed":  # no manifest checksum to catch the edit: completeness must
            latest_path.write_text(LatestRecord(step=20).render())
        for offset in (round(i * (size - 1) / (OFFSETS - 1)) for i in range(OFFSETS)):
            data = bytearray(pristine[shard])
            data[offset] ^= 0xFF
            shard.write_bytes(bytes(data))
            resolved_steps.append(CheckpointStore(uri, "job").resolve().step)
    finally:
        for path, data in pristine.items():
            path.write_bytes(data)
    assert resolved_steps == [15] * OFFSETS


def test_the_fallback_is_bitwise_what_step_15_saved(job_15_20, tmp_path):
    from helpers.tiny_job import TinyJob

    uri, job_dir, saved_15, shard = job_15_20
    manifest_path = job_dir / "step-20" / "manifest.json"
    pristine = {p: p.read_bytes() for p in (shard, manifest_path)}
    try:
        _unlist(manifest_path, "shard left out", shard)
        data = bytearray(pristine[shard])
        data[len(data) // 2] ^= 0xFF
        shard.write_bytes(bytes(data))
        job = TinyJob(uri, width=64)
        assert job.session.restore() == 15
        assert identical(fingerprint(job), saved_15)
    finally:
        for path, data in pristine.items():
            path.write_bytes(data)


def test_a_shard_deleted_and_unlisted_is_caught_by_the_dcp_metadata(job_15_20):
    """Directory and manifest agree, but DCP's .metadata still needs the shard."""
    uri, job_dir, _, shard = job_15_20
    manifest_path, latest_path = job_dir / "step-20" / "manifest.json", job_dir / "LATEST"
    pristine = {p: p.read_bytes() for p in (shard, manifest_path, latest_path)}
    try:
        _unlist(manifest_path, "shard left out", shard)
        latest_path.write_text(LatestRecord(step=20).render())
        shard.unlink()
        store = CheckpointStore(uri, "job")
        assert store.resolve().step == 15
    finally:
        for path, data in pristine.items():
            path.write_bytes(data)


def test_a_manifest_edited_under_a_checksummed_latest_is_refused(job_15_20, caplog):
    uri, job_dir, _, _ = job_15_20
    manifest_path = job_dir / "step-20" / "manifest.json"
    pristine = manifest_path.read_bytes()
    try:
        manifest = json.loads(pristine)
        manifest["created_at"] += 1  # harmless-looking, still not the manifest that was committed
        manifest_path.write_text(json.dumps(manifest))
        with caplog.at_level("WARNING"):
            assert CheckpointStore(uri, "job").resolve().step == 15
        assert "does not match LATEST's" in caplog.text
    finally:
        manifest_path.write_bytes(pristine)


def test_a_manifest_of_another_step_is_refused(job_15_20, caplog):
    uri, job_dir, _, _ = job_15_20
    latest_path = job_dir / "LATEST"
    pristine = latest_path.read_bytes()
    try:
        latest_path.write_text(LatestRecord(step=20).render())
        manifest = job_dir / "step-20" / "manifest.json"
        saved = manifest.read_bytes()
        manifest.write_bytes((job_dir / "step-15" / "manifest.json").read_bytes())
        try:
            with caplog.at_level("WARNING"):
                assert CheckpointStore(uri, "job").resolve().step == 15
        finally:
            manifest.write_bytes(saved)
        assert "manifest is for job 'job' step 15, not job 'job' step-20" in caplog.text
    finally:
        latest_path.write_bytes(pristine)
