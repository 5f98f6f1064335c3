"""The two storage tiers behind one small interface.

* ``LocalTier``: a directory on a file system. Used for the node-local fast tier (NVMe) and for a
  shared durable tier (FSx for Lustre, NFS). Commit is a rename; LATEST is replaced atomically.
* ``S3Tier``: ``s3://bucket/prefix`` through boto3's managed transfer (multipart, many
  concurrent parts). There is no rename on S3: every file of a step is uploaded first, then the
  manifest, then LATEST as one small put, so a reader that goes through LATEST never sees a
  partial step. boto3 honours ``AWS_ENDPOINT_URL`` / ``AWS_ENDPOINT_URL_S3`` (moto in tests).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Protocol

from botocore.exceptions import ClientError, EndpointConnectionError, NoCredentialsError

from gpucloud.checkpoint import layout
from gpucloud.checkpoint.manifest import Manifest, ManifestError, fsync_dir, write_text_atomic
from gpucloud.errors import UserError

_COPY_CHUNK = 16 * 1024 * 1024


class Tier(Protocol):
    """What the store needs from a place that holds committed checkpoints."""

    def describe(self, job_id: str) -> str: ...
    def read_latest(self, job_id: str) -> str | None: ...
    def write_latest(self, job_id: str, step: int) -> None: ...
    def committed_steps(self, job_id: str) -> list[int]: ...
    def read_manifest(self, job_id: str, step: int) -> Manifest: ...
    def delete_step(self, job_id: str, step: int) -> None: ...


class LocalTier:
    def __init__(self, root: Path) -> None:
        self.root = Path(root)

    def job_dir(self, job_id: str) -> Path:
        return self.root / job_id

    def step_path(self, job_id: str, step: int) -> Path:
        return self.job_dir(job_id) / layout.step_dir(step)

    def staging_path(self, job_id: str, step: int, token: str) -> Path:
        return self.job_dir(job_id) / f"{layout.TMP_PREFIX}{layout.step_dir(step)}-{token}"

    def describe(self, job_id: str) -> str:
        return str(self.job_dir(job_id))

    def read_latest(self, job_id: str) -> str | None:
        try:
            return (self.job_dir(job_id) / layout.LATEST).read_text()
        except FileNotFoundError:
            return None

    def write_latest(self, job_id: str, step: int) -> None:
        write_text_atomic(self.job_dir(job_id) / layout.LATEST, layout.step_dir(step) + "\n")

    def committed_steps(self, job_id: str) -> list[int]:
        try:
            names = os.listdir(self.job_dir(job_id))
        except FileNotFoundError:
            return []
        steps = (layout.parse_step_dir(n) for n in names)
        return sorted(s for s in steps if s is not None)

    def read_manifest(self, job_id: str, step: int) -> Manifest:
        directory = self.step_path(job_id, step)
        try:
            text = (directory / layout.MANIFEST).read_bytes()
        except FileNotFoundError:
            raise ManifestError(f"{directory}: manifest.json is missing") from None
        return Manifest.parse(text, str(directory))

    def import_files(self, src_dir: Path, names: list[str], staging: Path) -> None:
        """Copy ``names`` from ``src_dir`` into ``staging`` and make them durable (fsync)."""
        staging.mkdir(parents=True, exist_ok=True)
        for name in names:
            _copy_durably(src_dir / name, staging / name)
        fsync_dir(staging)

    def commit_staging(self, job_id: str, step: int, staging: Path, manifest: Manifest) -> Path:
        """Write the manifest into ``staging`` and rename it to ``step-<n>`` (the commit)."""
        write_text_atomic(staging / layout.MANIFEST, manifest.to_json())
        final = self.step_path(job_id, step)
        if final.exists():
            # The same step saved again (e.g. a rebalance save followed by an emergency save of
            # the same step). Move the old copy aside first: rename cannot replace a directory.
            trash = final.with_name(f"{layout.TMP_PREFIX}replaced-{final.name}-{os.getpid()}")
            os.replace(final, trash)
            os.replace(staging, final)
            shutil.rmtree(trash, ignore_errors=True)
        else:
            os.replace(staging, final)
        fsync_dir(final.parent)
        return final

    def delete_step(self, job_id: str, step: int) -> None:
        shutil.rmtree(self.step_path(job_id, step), ignore_errors=True)

    def stale_staging(self, job_id: str) -> list[Path]:
        try:
            return [p for p in self.job_dir(job_id).iterdir() if p.name.startswith(layout.TMP_PREFIX)]
        except FileNotFoundError:
            return []


def _access_error(exc: ClientError, where: str) -> UserError:
    code = exc.response.get("Error", {}).get("Code", "error")
    hints = {
        "NoSuchBucket": "the bucket does not exist (check the checkpoint URI and region)",
        "AccessDenied": "access denied (the instance role needs s3:GetObject/PutObject/ListBucket/DeleteObject on it)",
        "403": "access denied (the instance role needs s3:GetObject/PutObject/ListBucket/DeleteObject on it)",
    }
    return UserError(f"cannot read {where}: {hints.get(code, code)}")


def _copy_durably(src: Path, dst: Path) -> None:
    with open(src, "rb", buffering=0) as fin, open(dst, "wb", buffering=0) as fout:
        while True:
            chunk = fin.read(_COPY_CHUNK)
            if not chunk:
                break
            fout.write(chunk)
        os.fsync(fout.fileno())


class S3Tier:
    """Checkpoints under ``s3://bucket/prefix/<job-id>/``."""

    def __init__(
        self,
        location: layout.S3Location,
        *,
        client=None,
        multipart_threshold: int = 64 * 1024 * 1024,
        multipart_chunksize: int = 64 * 1024 * 1024,
        max_concurrency: int = 32,
    ) -> None:
        import boto3
        from boto3.s3.transfer import TransferConfig
        from botocore.config import Config

        self.location = location
        # The connection pool must be at least as large as the transfer concurrency, or parts
        # queue for connections and the "high concurrency" is only nominal.
        self.client = client or boto3.client(
            "s3", config=Config(max_pool_connections=max_concurrency + 4, retries={"mode": "adaptive"})
        )
        self.transfer_config = TransferConfig(
            multipart_threshold=multipart_threshold,
            multipart_chunksize=multipart_chunksize,
            max_concurrency=max_concurrency,
            use_threads=True,
        )

    def _key(self, job_id: str, *parts: str) -> str:
        return self.location.key(job_id, *parts)

    def describe(self, job_id: str) -> str:
        return f"s3://{self.location.bucket}/{self._key(job_id)}"

    def read_latest(self, job_id: str) -> str | None:
        key = self._key(job_id, layout.LATEST)
        try:
            obj = self.client.get_object(Bucket=self.location.bucket, Key=key)
        except self.client.exceptions.NoSuchKey:
            return None
        except ClientError as exc:
            raise _access_error(exc, f"s3://{self.location.bucket}/{key}") from None
        except (NoCredentialsError, EndpointConnectionError) as exc:
            raise UserError(f"cannot read s3://{self.location.bucket}/{key}: {exc}") from None
        return obj["Body"].read().decode("utf-8", errors="replace")

    def write_latest(self, job_id: str, step: int) -> None:
        # A single PUT is atomic on S3: readers see the old or the new body, never a mix.
        self.client.put_object(
            Bucket=self.location.bucket,
            Key=self._key(job_id, layout.LATEST),
            Body=(layout.step_dir(step) + "\n").encode(),
            ContentType="text/plain",
        )

    def committed_steps(self, job_id: str) -> list[int]:
        """Steps whose manifest exists (the manifest is put only after every file is in)."""
        prefix = self._key(job_id) + "/"
        steps: set[int] = set()
        paginator = self.client.get_paginator("list_objects_v2")
        for page in paginator.paginate(Bucket=self.location.bucket, Prefix=prefix):
            for obj in page.get("Contents", []):
                rel = obj["Key"][len(prefix) :]
                parts = rel.split("/")
                if len(parts) == 2 and parts[1] == layout.MANIFEST:
                    step = layout.parse_step_dir(parts[0])
                    if step is not None:
                        steps.add(step)
        return sorted(steps)

    def read_manifest(self, job_id: str, step: int) -> Manifest:
        key = self._key(job_id, layout.step_dir(step), layout.MANIFEST)
        try:
            obj = self.client.get_object(Bucket=self.location.bucket, Key=key)
        except self.client.exceptions.NoSuchKey:
            raise ManifestError(f"s3://{self.location.bucket}/{key} is missing") from None
        return Manifest.parse(obj["Body"].read(), f"s3://{self.location.bucket}/{key}")

    def upload_files(self, src_dir: Path, names: list[str], job_id: str, step: int) -> None:
        """Upload files concurrently (one transfer manager, shared part concurrency)."""
        from boto3.s3.transfer import create_transfer_manager

        with create_transfer_manager(self.client, self.transfer_config) as manager:
            futures = [
                manager.upload(
                    str(src_dir / name), self.location.bucket, self._key(job_id, layout.step_dir(step), name)
                )
                for name in names
            ]
            for future in futures:
                future.result()

    def commit(self, job_id: str, step: int, manifest: Manifest) -> None:
        self.client.put_object(
            Bucket=self.location.bucket,
            Key=self._key(job_id, layout.step_dir(step), layout.MANIFEST),
            Body=manifest.to_json().encode(),
            ContentType="application/json",
        )

    def download_step(self, job_id: str, step: int, manifest: Manifest, dst: Path) -> None:
        """Download the files ``manifest`` lists (and the manifest) into ``dst``."""
        from boto3.s3.transfer import create_transfer_manager

        dst.mkdir(parents=True, exist_ok=True)
        with create_transfer_manager(self.client, self.transfer_config) as manager:
            futures = [
                manager.download(
                    self.location.bucket, self._key(job_id, layout.step_dir(step), entry.name), str(dst / entry.name)
                )
                for entry in manifest.files
            ]
            for future in futures:
                try:
                    future.result()
                except Exception as exc:  # noqa: BLE001 - surfaced as a verification failure
                    raise ManifestError(
                        f"{self.describe(job_id)}/{layout.step_dir(step)}: download failed: {exc}"
                    ) from None
        write_text_atomic(dst / layout.MANIFEST, manifest.to_json())

    def delete_step(self, job_id: str, step: int) -> None:
        prefix = self._key(job_id, layout.step_dir(step)) + "/"
        paginator = self.client.get_paginator("list_objects_v2")
        for page in paginator.paginate(Bucket=self.location.bucket, Prefix=prefix):
            keys = [{"Key": o["Key"]} for o in page.get("Contents", [])]
            # delete_objects takes at most 1,000 keys; one page is at most 1,000.
            if keys:
                self.client.delete_objects(Bucket=self.location.bucket, Delete={"Objects": keys, "Quiet": True})


# Tuning knobs for the S3 tier (environment, so that a job can be tuned without code changes).
PART_SIZE_ENV = "GPUCLOUD_S3_PART_SIZE_MB"
CONCURRENCY_ENV = "GPUCLOUD_S3_CONCURRENCY"
_MIN_PART_MB = 5  # S3's minimum multipart part size (all parts but the last)
_MAX_PART_MB = 5 * 1024


def s3_transfer_settings(environ: dict[str, str] | None = None) -> dict[str, int]:
    """Part size and concurrency for S3 transfers from the environment (defaults 64 MiB, 32)."""
    env = os.environ if environ is None else environ
    part_mb = _int_setting(env, PART_SIZE_ENV, 64, _MIN_PART_MB, _MAX_PART_MB)
    concurrency = _int_setting(env, CONCURRENCY_ENV, 32, 1, 512)
    part = part_mb * 1024 * 1024
    return {"multipart_threshold": part, "multipart_chunksize": part, "max_concurrency": concurrency}


def _int_setting(env, name: str, default: int, low: int, high: int) -> int:
    raw = env.get(name, "").strip()
    if not raw:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise UserError(f"{name}={raw!r} is not a whole number; allowed {low}..{high}") from None
    if not low <= value <= high:
        raise UserError(f"{name}={value} is out of range; allowed {low}..{high}")
    return value


def open_tier(location: layout.Location) -> LocalTier | S3Tier:
    if isinstance(location, layout.S3Location):
        return S3Tier(location, **s3_transfer_settings())
    return LocalTier(location.root)
