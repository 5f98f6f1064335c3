"""The Tier protocol over every kind of tier: what the store, the commit and a restore ask a tier
instead of its class. A file system on disk and S3 on the moto server, each through ``open_tier``
from a checkpoint URI, the way a job gets them."""

from __future__ import annotations

from pathlib import Path

import pytest
import xxhash

from gpucloud.checkpoint import layout
from gpucloud.checkpoint.manifest import FileEntry, Manifest
from gpucloud.checkpoint.store import CheckpointStore
from gpucloud.checkpoint.tiers import Tier, open_tier

JOB = "job"
FILES = {"__0_0.distcp": b"tensor bytes " * 100, ".metadata": b"dcp metadata"}

# What each kind promises. reads/writes in place: DCP reads a committed step where it lies and a
# save may write into the tier's own staging directory; otherwise both go through a local copy.
# leftovers_removed: remove_stale_staging deletes what a save killed before its commit left.
KINDS = {
    "file system": {"needs_local_copy": False, "in_place": True, "leftovers_removed": True},
    "s3": {"needs_local_copy": True, "in_place": False, "leftovers_removed": False},
}


@pytest.fixture(params=sorted(KINDS))
def kind_and_uri(request, tmp_path) -> tuple[str, str]:
    if request.param == "s3":
        request.getfixturevalue("moto_s3")
        return request.param, "s3://ckpt-bucket/runs"
    return request.param, str(tmp_path / "ck")


@pytest.fixture
def kind_and_tier(kind_and_uri) -> tuple[str, Tier]:
    kind, uri = kind_and_uri
    return kind, open_tier(layout.parse_uri(uri))


def _source(tmp_path: Path) -> Path:
    src = tmp_path / "written-by-dcp"
    src.mkdir()
    for name, data in FILES.items():
        (src / name).write_bytes(data)
    return src


def _manifest(step: int) -> Manifest:
    files = [FileEntry(name=n, size=len(d), xxh3=xxhash.xxh3_64_hexdigest(d)) for n, d in sorted(FILES.items())]
    return Manifest(job_id=JOB, step=step, world_size=1, attempt=0, files=files)


def test_where_each_kind_is_written_and_read(kind_and_tier):
    kind, tier = kind_and_tier
    expected = KINDS[kind]
    assert tier.needs_local_copy is expected["needs_local_copy"]
    assert (tier.step_directory(JOB, 5) is not None) is expected["in_place"]
    save = tier.save_directory(JOB, 5, "a0")
    assert (save is not None) is expected["in_place"]
    if save is not None:  # beside the steps under a dot-name: never listed as a step
        assert save.parent == tier.step_directory(JOB, 5).parent and save.name.startswith(layout.TMP_PREFIX)


def test_the_store_gets_a_local_copy_exactly_when_the_tier_needs_one(kind_and_uri):
    kind, uri = kind_and_uri
    store = CheckpointStore(uri, JOB)
    assert (store.local is not None) is KINDS[kind]["needs_local_copy"]
    assert store.writes_direct_to_durable is KINDS[kind]["in_place"]
    if KINDS[kind]["in_place"]:
        assert store.staging_path(5, "a0") == store.durable.save_directory(JOB, 5, "a0")
    else:
        assert store.local is not None and store.staging_path(5, "a0").is_relative_to(store.local.root)


def test_a_staged_step_is_committed_by_publish_alone_and_downloads_as_staged(kind_and_tier, tmp_path):
    _, tier = kind_and_tier
    manifest = _manifest(5)
    raw = manifest.to_json().encode()
    tier.stage_files(JOB, 5, "a0", _source(tmp_path), sorted(FILES))
    assert tier.committed_steps(JOB) == [], "staged files alone are not a committed step"
    tier.publish_step(JOB, 5, "a0", raw)
    assert tier.committed_steps(JOB) == [5]
    assert tier.read_latest(JOB) is None, "publishing a step does not touch LATEST"
    assert tier.read_manifest_bytes(JOB, 5) == raw
    assert sorted(tier.step_object_names(JOB, 5)) == sorted([*FILES, layout.MANIFEST])
    dst = tmp_path / "downloaded"
    tier.download_step(JOB, 5, manifest, raw, dst)
    assert {p.name: p.read_bytes() for p in dst.iterdir()} == {**FILES, layout.MANIFEST: raw}
    tier.delete_step(JOB, 5)
    assert tier.committed_steps(JOB) == []


def test_what_a_save_killed_before_its_commit_leaves_is_never_a_step(kind_and_tier, tmp_path):
    kind, tier = kind_and_tier
    tier.stage_files(JOB, 7, "a1", _source(tmp_path), sorted(FILES))
    left = None if KINDS[kind]["in_place"] else sorted(tier.step_object_names(JOB, 7))
    assert left is None or left == sorted(FILES)
    tier.remove_stale_staging(JOB)
    assert tier.committed_steps(JOB) == []
    if KINDS[kind]["leftovers_removed"]:
        save = tier.save_directory(JOB, 7, "a1")
        assert save is not None and not save.exists()
    else:  # the objects stay under the step's keys, with no manifest: not committed, not removed
        assert sorted(tier.step_object_names(JOB, 7)) == left
