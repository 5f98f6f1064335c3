"""Which library uploads a step's files to S3 (chosen on benchmarks/bench_s3_writers.py):
AWS's s3torchconnector when installed, boto3's managed transfer otherwise or when asked."""

from __future__ import annotations

import importlib.util

import pytest

from gpucloud.checkpoint.store import latest_committed
from gpucloud.checkpoint.tiers import S3Tier, s3_uploader
from gpucloud.errors import UserError

URI = "s3://ckpt-bucket/runs"
HAS_S3TORCH = importlib.util.find_spec("s3torchconnector") is not None
needs_s3torch = pytest.mark.skipif(not HAS_S3TORCH, reason="the s3 extra (s3torchconnector) is not installed")


def _refuse(*_args, **_kwargs):
    raise AssertionError("the other uploader was used")


@needs_s3torch
def test_auto_picks_s3torchconnector_when_installed() -> None:
    assert s3_uploader({}) == "s3torchconnector"
    assert s3_uploader({"GPUCLOUD_S3_UPLOADER": "boto3"}) == "boto3"


def test_an_unknown_uploader_is_a_one_line_user_error() -> None:
    with pytest.raises(UserError) as info:
        s3_uploader({"GPUCLOUD_S3_UPLOADER": "curl"})
    message = str(info.value)
    assert "\n" not in message and "'curl'" in message and "auto, s3torchconnector, boto3" in message


@needs_s3torch
def test_a_save_uploaded_by_s3torchconnector_commits_and_resumes(moto_s3, monkeypatch, tmp_path, tiny_job):
    monkeypatch.setenv("GPUCLOUD_S3_UPLOADER", "s3torchconnector")
    monkeypatch.setenv("GPUCLOUD_S3_PART_SIZE_MB", "5")  # the ~19 MB rank file goes up in parts
    monkeypatch.setattr(S3Tier, "_upload_with_boto3", _refuse)
    job = tiny_job(URI, width=200_000, every_steps=2, writer_threads=2)
    job.run(4)
    assert latest_committed(URI, "job") == 4
    again = tiny_job(URI, local_dir=str(tmp_path / "other-node"), width=200_000)
    assert again.session.restore() == 4  # downloaded and verified against the manifest's checksums
    ref, got = job.weights(), again.weights()
    assert all((ref[k] == got[k]).all() for k in ref)


def test_boto3_still_uploads_when_asked(moto_s3, monkeypatch, tiny_job):
    monkeypatch.setenv("GPUCLOUD_S3_UPLOADER", "boto3")
    monkeypatch.setattr(S3Tier, "_upload_with_s3torchconnector", _refuse)
    job = tiny_job(URI, every_steps=2)
    job.run(2)
    assert latest_committed(URI, "job") == 2
