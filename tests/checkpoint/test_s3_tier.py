"""The S3 durable tier against moto in server mode (real HTTP, botocore-validated requests)."""

import boto3
import pytest
import torch

from gpucloud import control
from gpucloud.checkpoint.latest import LatestRecord
from gpucloud.checkpoint.store import CheckpointStore, latest_committed
from gpucloud.checkpoint.tiers import s3_transfer_settings
from gpucloud.errors import UserError

URI = "s3://ckpt-bucket/runs"


@pytest.fixture
def small_parts(monkeypatch):
    # 5 MiB parts (S3's minimum) so that a ~19 MB rank file goes up as a multipart upload.
    monkeypatch.setenv("GPUCLOUD_S3_PART_SIZE_MB", "5")
    monkeypatch.setenv("GPUCLOUD_S3_CONCURRENCY", "8")


def _keys(prefix: str) -> dict[str, dict]:
    s3 = boto3.client("s3")
    pages = s3.get_paginator("list_objects_v2").paginate(Bucket="ckpt-bucket", Prefix=prefix)
    return {o["Key"]: o for page in pages for o in page.get("Contents", [])}


def test_save_to_s3_multipart_then_resume_on_a_new_node(moto_s3, small_parts, tmp_path, tiny_job):
    # width 200k: one Linear(8, 200000) plus Adam moments, ~19 MB in the single rank file.
    job = tiny_job(URI, local_dir=str(tmp_path / "node-a"), width=200_000, every_steps=2, keep_last=2, writer_threads=1)
    job.run(6)
    keys = _keys("runs/job/")
    body = boto3.client("s3").get_object(Bucket="ckpt-bucket", Key="runs/job/LATEST")["Body"].read()
    assert body.startswith(b"step-6\n")
    steps = sorted({k.split("/")[2] for k in keys if k.count("/") == 3})
    assert steps == ["step-4", "step-6"], "retention keeps the last 2 on S3"
    data_files = [o for k, o in keys.items() if k.startswith("runs/job/step-6/") and k.endswith(".distcp")]
    assert any("-" in o["ETag"] for o in data_files), "the large file was not uploaded as multipart"
    assert latest_committed(URI, "job") == 6

    ctl = tmp_path / "ctl"
    new_node = tiny_job(URI, local_dir=str(tmp_path / "node-b"), width=200_000, control_dir=str(ctl))
    assert new_node.session.restore() == 6
    assert control.read(ctl, control.RESUMED)["source_tier"] == "durable"
    ref, got = job.weights(), new_node.weights()
    assert all(torch.equal(ref[k], got[k]) for k in ref)
    # The verified download became node-b's local copy.
    assert (tmp_path / "node-b" / "job" / "step-6" / "manifest.json").exists()


def test_corrupt_object_on_s3_falls_back_to_previous_step(moto_s3, tmp_path, tiny_job):
    tiny_job(URI, local_dir=str(tmp_path / "a"), every_steps=2).run(4)
    s3 = boto3.client("s3")
    victim = max((o for k, o in _keys("runs/job/step-4/").items() if k.endswith(".distcp")), key=lambda o: o["Size"])
    body = bytearray(s3.get_object(Bucket="ckpt-bucket", Key=victim["Key"])["Body"].read())
    body[len(body) // 2] ^= 0xFF
    s3.put_object(Bucket="ckpt-bucket", Key=victim["Key"], Body=bytes(body))
    store = CheckpointStore(URI, "job", local_dir=str(tmp_path / "fresh"))
    resolved = store.resolve()
    assert resolved.step == 2 and resolved.tier == "durable"


def test_uncommitted_upload_without_manifest_is_invisible(moto_s3, tmp_path, tiny_job):
    tiny_job(URI, local_dir=str(tmp_path / "a"), every_steps=2).run(2)
    # A writer died after uploading parts of step 4 but before its manifest and LATEST.
    boto3.client("s3").put_object(Bucket="ckpt-bucket", Key="runs/job/step-4/__0_0.distcp", Body=b"partial")
    assert latest_committed(URI, "job") == 2
    assert CheckpointStore(URI, "job", local_dir=str(tmp_path / "b")).resolve().step == 2


@pytest.mark.parametrize(
    "env, message",
    [
        ({"GPUCLOUD_S3_PART_SIZE_MB": "4"}, "GPUCLOUD_S3_PART_SIZE_MB=4 is out of range; allowed 5..5120"),
        ({"GPUCLOUD_S3_PART_SIZE_MB": "big"}, "GPUCLOUD_S3_PART_SIZE_MB='big' is not a whole number"),
        ({"GPUCLOUD_S3_CONCURRENCY": "0"}, "GPUCLOUD_S3_CONCURRENCY=0 is out of range; allowed 1..512"),
    ],
)
def test_bad_s3_tuning_is_a_user_error(env, message):
    with pytest.raises(UserError, match=message):
        s3_transfer_settings(env)


def test_missing_bucket_is_a_clear_error(moto_s3):
    with pytest.raises(UserError, match="cannot read s3://no-such-bucket/job/LATEST: the bucket does not exist"):
        latest_committed("s3://no-such-bucket", "job")


def test_an_object_the_manifest_does_not_list_makes_the_step_invalid(moto_s3, tmp_path, tiny_job):
    """S3 has no directory to list, but the step's prefix does: every object under it must be
    listed in the manifest (here the manifest leaves a shard out and LATEST records no checksum)."""
    import json

    tiny_job(URI, local_dir=str(tmp_path / "a"), every_steps=2).run(4)
    s3 = boto3.client("s3")
    key = "runs/job/step-4/manifest.json"
    manifest = json.loads(s3.get_object(Bucket="ckpt-bucket", Key=key)["Body"].read())
    left_out = manifest["files"].pop()["name"]
    s3.put_object(Bucket="ckpt-bucket", Key=key, Body=json.dumps(manifest).encode())
    s3.put_object(Bucket="ckpt-bucket", Key="runs/job/LATEST", Body=LatestRecord(step=4).render().encode())
    resolved = CheckpointStore(URI, "job", local_dir=str(tmp_path / "fresh")).resolve()
    assert resolved.step == 2, f"step-4 with {left_out} unlisted was accepted"
