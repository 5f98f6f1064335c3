"""The two storage tiers behind one small interface.

* ``LocalTier``: a directory on a file system. Used for the node-local fast tier (NVMe) and for a
  shared durable tier (FSx for Lustre, NFS). Commit is a rename; LATEST is replaced atomically.
* ``S3Tier``: ``s3://bucket/prefix`` through boto3's managed transfer (multipart, many
  concurrent parts). There is no rename on S3: every file of a step is uploaded first, then the
  manifest, then LATEST as one small put, so a reader that goes through LATEST never sees a
  partial step. boto3 honours ``AWS_ENDPOINT_URL`` / ``AWS_ENDPOINT_URL_S3`` (moto in tests).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import logging
import os
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Protocol

from botocore.exceptions import ClientError, EndpointConnectionError, NoCredentialsError

from gpucloud.checkpoint import latest, layout
from gpucloud.checkpoint.manifest import (
    MAX_MANIFEST_BYTES,
    Manifest,
    ManifestError,
    check_size,
    fsync_dir,
    os_reason,
    read_manifest_bytes,
    write_bytes_atomic,
)
from gpucloud.errors import UserError
from gpucloud.regular_files import NotRegularFile, open_regular

log = logging.getLogger(__name__)

_COPY_CHUNK = 16 * 1024 * 1024
_LOCK_NAME = ".latest.lock"
# How often a conditional LATEST write is retried when another writer got in between (each retry
# re-reads LATEST and re-checks the fence, so a newer attempt still wins).
_CAS_TRIES = 5

# change(current LATEST bytes or None) -> the new LATEST text, or None to leave it as it is. It
# raises to refuse (the fence); it runs again with fresh bytes when a conditional write lost a race.
LatestChange = Callable[[bytes | None], str | None]


class Tier(Protocol):
    """What the store, the commit and a restore need from a place that holds committed
    checkpoints. Callers ask these members, never the tier's class."""

    @property
    def needs_local_copy(self) -> bool:
        """True when a step cannot be written or read where it lies (S3: objects, not files): a
        save is written to a local directory and staged into the tier, a restore downloads the
        step into one. False: a save may write into the tier and a restore reads it in place."""
        ...

    def describe(self, job_id: str) -> str: ...
    def read_latest(self, job_id: str) -> bytes | None: ...
    def update_latest(
        self, job_id: str, change: LatestChange, before_write: Callable[[], object] | None = None
    ) -> bool: ...
    def committed_steps(self, job_id: str) -> list[int]: ...
    def read_manifest_bytes(self, job_id: str, step: int) -> bytes: ...

    def step_directory(self, job_id: str, step: int) -> Path | None:
        """Where a committed step can be read in place; None when it has to be downloaded first (``download_step``)."""
        ...

    def save_directory(self, job_id: str, step: int, token: str) -> Path | None:
        """Where a save may write a step's files straight into the tier, for ``publish_step`` to
        commit there; None when they are written elsewhere and staged (``stage_files``)."""
        ...

    def stage_files(self, job_id: str, step: int, token: str, src_dir: Path, names: list[str]) -> None:
        """Make this rank's ``names`` in ``src_dir`` durable in the tier, not yet visible as a step."""
        ...

    def publish_step(self, job_id: str, step: int, token: str, manifest_bytes: bytes) -> None:
        """Make the staged step visible (its manifest is what makes it committed); LATEST is not touched."""
        ...

    def step_object_names(self, job_id: str, step: int) -> list[str]:
        """Every name under the step, relative to it (what its manifest must list)."""
        ...

    def download_step(self, job_id: str, step: int, manifest: Manifest, manifest_bytes: bytes, dst: Path) -> None:
        """Copy the files ``manifest`` lists (and the manifest's exact bytes) into ``dst``."""
        ...

    def delete_step(self, job_id: str, step: int) -> None: ...

    def remove_stale_staging(self, job_id: str) -> None:
        """Remove what saves killed before their commit left behind."""
        ...


class LocalTier:
    """A directory on a file system: the node-local fast tier, or a shared durable one."""

    needs_local_copy = False  # DCP writes and reads the step directories themselves

    def __init__(self, root: Path) -> None:
        self.root = Path(root)

    def job_dir(self, job_id: str) -> Path:
        return self.root / job_id

    def step_path(self, job_id: str, step: int) -> Path:
        return self.job_dir(job_id) / layout.step_dir(step)

    def staging_path(self, job_id: str, step: int, token: str) -> Path:
        return self.job_dir(job_id) / f"{layout.TMP_PREFIX}{layout.step_dir(step)}-{token}"

    def step_directory(self, job_id: str, step: int) -> Path:
        return self.step_path(job_id, step)

    def save_directory(self, job_id: str, step: int, token: str) -> Path:
        return self.staging_path(job_id, step, token)

    def describe(self, job_id: str) -> str:
        return str(self.job_dir(job_id))

    def read_latest(self, job_id: str) -> bytes | None:
        """LATEST's bytes (bounded), None when there is none; UserError when it cannot be read:
        without LATEST nobody can tell which step is committed, and that is for a person to fix."""
        path = self.job_dir(job_id) / layout.LATEST
        try:  # a regular file only: a FIFO in its place would block every restore forever
            with open_regular(path) as fh:
                return fh.read(latest.MAX_BYTES + 1)
        except FileNotFoundError:
            return None
        except NotRegularFile as exc:
            raise UserError(f"{path} is {exc.strerror}; it must be a file naming the committed step") from None
        except NotADirectoryError:
            raise self._job_dir_not_a_directory(job_id) from None
        except OSError as exc:
            raise UserError(f"cannot read {path}: {os_reason(exc)}") from None

    def _job_dir_not_a_directory(self, job_id: str) -> UserError:
        return UserError(
            f"{self.job_dir(job_id)} is a file; the checkpoints of job {job_id} must be a directory "
            "(move the file away or use another checkpoint URI)"
        )

    def write_latest(self, job_id: str, text: str) -> None:
        """Replace LATEST unconditionally (the node-local cache; the durable tier uses update_latest)."""
        write_bytes_atomic(self.job_dir(job_id) / layout.LATEST, text.encode())

    def update_latest(
        self, job_id: str, change: LatestChange, before_write: Callable[[], object] | None = None
    ) -> bool:
        """Read LATEST, decide, run ``before_write`` (the step's rename), replace LATEST: all under
        an exclusive lock on the job directory, so an attempt fenced out between the read and the
        write cannot happen. Returns whether LATEST was replaced."""
        with self._locked(job_id):
            text = change(self.read_latest(job_id))
            if text is None:
                return False
            if before_write is not None:
                before_write()
            self.write_latest(job_id, text)
            return True

    @contextlib.contextmanager
    def _locked(self, job_id: str) -> Iterator[None]:
        job_dir = self.job_dir(job_id)
        try:
            job_dir.mkdir(parents=True, exist_ok=True)
            fd = os.open(job_dir / _LOCK_NAME, os.O_RDWR | os.O_CREAT, 0o644)
        except (FileExistsError, NotADirectoryError):
            raise self._job_dir_not_a_directory(job_id) from None
        except OSError as exc:
            raise UserError(f"cannot write in {job_dir}: {os_reason(exc)}") from None
        try:
            try:
                # flock works across hosts on FSx for Lustre mounted with "flock" and on NFSv4.
                fcntl.flock(fd, fcntl.LOCK_EX)
            except OSError as exc:
                if exc.errno not in (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS):
                    raise
                log.warning("%s: file locks unsupported (%s); the commit fence is not atomic here", job_dir, exc)
            yield
        finally:
            os.close(fd)

    def committed_steps(self, job_id: str) -> list[int]:
        try:
            names = os.listdir(self.job_dir(job_id))
        except FileNotFoundError:
            return []
        except NotADirectoryError:
            raise self._job_dir_not_a_directory(job_id) from None
        except OSError as exc:
            raise UserError(f"cannot list {self.job_dir(job_id)}: {os_reason(exc)}") from None
        steps = (layout.parse_step_dir(n) for n in names)
        return sorted(s for s in steps if s is not None)

    def read_manifest_bytes(self, job_id: str, step: int) -> bytes:
        directory = self.step_path(job_id, step)
        return check_size(read_manifest_bytes(directory), str(directory))

    def stage_files(self, job_id: str, step: int, token: str, src_dir: Path, names: list[str]) -> None:
        """Copy ``names`` into the save's staging directory and make them durable (fsync)."""
        _copy_files_durably(src_dir, names, self.staging_path(job_id, step, token))

    def publish_step(self, job_id: str, step: int, token: str, manifest_bytes: bytes) -> None:
        self.commit_staging(job_id, step, self.staging_path(job_id, step, token), manifest_bytes)

    def commit_staging(self, job_id: str, step: int, staging: Path, manifest_bytes: bytes) -> Path:
        """Write the manifest into ``staging`` and rename it to ``step-<n>`` (the commit)."""
        write_bytes_atomic(staging / layout.MANIFEST, manifest_bytes)
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

    def step_object_names(self, job_id: str, step: int) -> list[str]:
        directory = self.step_path(job_id, step)
        try:
            return os.listdir(directory)
        except OSError as exc:
            raise ManifestError(f"{directory}: cannot be listed ({os_reason(exc)})") from None

    def download_step(self, job_id: str, step: int, manifest: Manifest, manifest_bytes: bytes, dst: Path) -> None:
        _copy_files_durably(self.step_path(job_id, step), [entry.name for entry in manifest.files], dst)
        write_bytes_atomic(dst / layout.MANIFEST, manifest_bytes)

    def delete_step(self, job_id: str, step: int) -> None:
        shutil.rmtree(self.step_path(job_id, step), ignore_errors=True)

    def remove_stale_staging(self, job_id: str) -> None:
        """Remove the dot-directories of saves (and downloads) killed before their rename."""
        try:
            stale = [p for p in self.job_dir(job_id).iterdir() if p.name.startswith(layout.TMP_PREFIX)]
        except FileNotFoundError:
            return
        for path in stale:
            shutil.rmtree(path, ignore_errors=True)


def _access_error(exc: ClientError, where: str) -> UserError:
    code = exc.response.get("Error", {}).get("Code", "error")
    hints = {
        "NoSuchBucket": "the bucket does not exist (check the checkpoint URI and region)",
        "AccessDenied": "access denied (the instance role needs s3:GetObject/PutObject/ListBucket/DeleteObject on it)",
        "403": "access denied (the instance role needs s3:GetObject/PutObject/ListBucket/DeleteObject on it)",
    }
    return UserError(f"cannot read {where}: {hints.get(code, code)}")


def _copy_files_durably(src_dir: Path, names: list[str], dst_dir: Path) -> None:
    """Copy ``names`` from ``src_dir`` into ``dst_dir`` and make them durable (fsync)."""
    dst_dir.mkdir(parents=True, exist_ok=True)
    for name in names:
        _copy_durably(src_dir / name, dst_dir / name)
    fsync_dir(dst_dir)


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

    needs_local_copy = True  # DCP writes and reads files: a save is staged locally, a restore downloads

    def __init__(
        self,
        location: layout.S3Location,
        *,
        client=None,
        multipart_threshold: int = 64 * 1024 * 1024,
        multipart_chunksize: int = 64 * 1024 * 1024,
        max_concurrency: int = 32,
        uploader: str = "boto3",
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
        self.uploader = uploader  # "boto3" | "s3torchconnector": what writes the step's data files
        self._s3torch: Any = None  # s3torchconnector.S3Checkpoint, made on first use

    def _key(self, job_id: str, *parts: str) -> str:
        return self.location.key(job_id, *parts)

    def describe(self, job_id: str) -> str:
        return f"s3://{self.location.bucket}/{self._key(job_id)}"

    def step_directory(self, job_id: str, step: int) -> None:
        return None  # objects, not a directory DCP can read: download_step first

    def save_directory(self, job_id: str, step: int, token: str) -> None:
        return None  # DCP cannot write objects: the save is written locally, then stage_files

    def stage_files(self, job_id: str, step: int, token: str, src_dir: Path, names: list[str]) -> None:
        """Upload the files to their final keys: there is no rename on S3, and a step without its
        manifest is not committed, so the keys of an unfinished step are its staging area."""
        self.upload_files(src_dir, names, job_id, step)

    def publish_step(self, job_id: str, step: int, token: str, manifest_bytes: bytes) -> None:
        self.put_manifest(job_id, step, manifest_bytes)

    def remove_stale_staging(self, job_id: str) -> None:
        """Nothing is removed: a killed upload leaves objects under a step with no manifest, which
        is never listed as committed (the keys are the step's own, not a separate staging area)."""

    def read_latest(self, job_id: str) -> bytes | None:
        return self._read_latest_versioned(job_id)[0]

    def _read_latest_versioned(self, job_id: str) -> tuple[bytes | None, str | None]:
        """LATEST's bytes (bounded) and ETag; (None, None) when there is none."""
        key = self._key(job_id, layout.LATEST)
        try:
            obj = self.client.get_object(Bucket=self.location.bucket, Key=key)
        except self.client.exceptions.NoSuchKey:
            return None, None
        except ClientError as exc:
            raise _access_error(exc, f"s3://{self.location.bucket}/{key}") from None
        except (NoCredentialsError, EndpointConnectionError) as exc:
            raise UserError(f"cannot read s3://{self.location.bucket}/{key}: {exc}") from None
        return obj["Body"].read(latest.MAX_BYTES + 1), obj.get("ETag")

    def update_latest(
        self, job_id: str, change: LatestChange, before_write: Callable[[], object] | None = None
    ) -> bool:
        """Read LATEST with its ETag, decide, run ``before_write`` (the manifest put), then put
        LATEST only if it is still the object that was read: If-Match on its ETag, or
        If-None-Match: * when there was none (S3 conditional writes,
        https://docs.aws.amazon.com/AmazonS3/latest/userguide/conditional-writes.html). When another
        writer got in between, S3 answers 412 (or 409 for a concurrent conditional write) and the
        decision is taken again on the new LATEST, so a newer attempt's claim always wins."""
        key = self._key(job_id, layout.LATEST)
        for _ in range(_CAS_TRIES):
            raw, etag = self._read_latest_versioned(job_id)
            text = change(raw)
            if text is None:
                return False
            if before_write is not None:
                before_write()
                before_write = None
            condition = {"IfMatch": etag} if etag else {"IfNoneMatch": "*"}
            try:
                # A single PUT is atomic on S3: readers see the old or the new body, never a mix.
                self.client.put_object(
                    Bucket=self.location.bucket, Key=key, Body=text.encode(), ContentType="text/plain", **condition
                )
                return True
            except ClientError as exc:
                code = exc.response.get("Error", {}).get("Code", "")
                status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
                if code in ("PreconditionFailed", "ConditionalRequestConflict") or status in (409, 412):
                    continue
                raise _access_error(exc, f"s3://{self.location.bucket}/{key}") from None
        raise UserError(
            f"s3://{self.location.bucket}/{key} kept changing during {_CAS_TRIES} conditional writes; "
            "is another writer running for this job?"
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

    def read_manifest_bytes(self, job_id: str, step: int) -> bytes:
        key = self._key(job_id, layout.step_dir(step), layout.MANIFEST)
        try:
            obj = self.client.get_object(Bucket=self.location.bucket, Key=key)
        except self.client.exceptions.NoSuchKey:
            raise ManifestError(f"s3://{self.location.bucket}/{key} is missing") from None
        except ClientError as exc:
            raise ManifestError(str(_access_error(exc, f"s3://{self.location.bucket}/{key}"))) from None
        return check_size(obj["Body"].read(MAX_MANIFEST_BYTES + 1), f"s3://{self.location.bucket}/{key}")

    def step_object_names(self, job_id: str, step: int) -> list[str]:
        """The names of every object under the step's prefix, relative to it."""
        prefix = self._key(job_id, layout.step_dir(step)) + "/"
        names: list[str] = []
        paginator = self.client.get_paginator("list_objects_v2")
        try:
            for page in paginator.paginate(Bucket=self.location.bucket, Prefix=prefix):
                names.extend(obj["Key"][len(prefix) :] for obj in page.get("Contents", []))
        except ClientError as exc:
            raise ManifestError(str(_access_error(exc, f"s3://{self.location.bucket}/{prefix}"))) from None
        return names

    def upload_files(self, src_dir: Path, names: list[str], job_id: str, step: int) -> None:
        """Upload this rank's files of a step; every rank does so at once, so the durable copy is made
        from every node in parallel (the commit waits for all of them before the manifest)."""
        if self.uploader == S3TORCH:
            self._upload_with_s3torchconnector(src_dir, names, job_id, step)
        else:
            self._upload_with_boto3(src_dir, names, job_id, step)

    def _upload_with_s3torchconnector(self, src_dir: Path, names: list[str], job_id: str, step: int) -> None:
        """AWS's S3 connector for PyTorch (the CRT underneath: parallel multipart parts, many
        connections per node). Chosen on benchmarks/bench_s3_writers.py. A failed file raises; the
        step stays uncommitted (no manifest, no LATEST), whatever the connector left behind."""
        from concurrent.futures import ThreadPoolExecutor

        checkpoint = self._s3torch_checkpoint()
        bucket = self.location.bucket

        def put(name: str) -> None:
            uri = f"s3://{bucket}/{self._key(job_id, layout.step_dir(step), name)}"
            with open(src_dir / name, "rb") as src, checkpoint.writer(uri) as dst:
                shutil.copyfileobj(src, dst, _COPY_CHUNK)

        with ThreadPoolExecutor(max_workers=max(1, min(len(names), 8)), thread_name_prefix="s3-upload") as pool:
            for done in [pool.submit(put, name) for name in names]:
                done.result()

    def _s3torch_checkpoint(self):
        if self._s3torch is None:
            from s3torchconnector import S3Checkpoint, S3ClientConfig

            endpoint = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL") or None
            config = S3ClientConfig(
                part_size=self.transfer_config.multipart_chunksize,
                throughput_target_gbps=S3TORCH_TARGET_GBPS,
                force_path_style=endpoint is not None,  # emulators (moto, MinIO) serve path-style
            )
            region = self.client.meta.region_name or "us-east-1"
            self._s3torch = S3Checkpoint(region, endpoint=endpoint, s3client_config=config)
        return self._s3torch

    def _upload_with_boto3(self, src_dir: Path, names: list[str], job_id: str, step: int) -> None:
        """boto3's managed transfer: one transfer manager, shared part concurrency."""
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

    def put_manifest(self, job_id: str, step: int, manifest_bytes: bytes) -> None:
        self.client.put_object(
            Bucket=self.location.bucket,
            Key=self._key(job_id, layout.step_dir(step), layout.MANIFEST),
            Body=manifest_bytes,
            ContentType="application/json",
        )

    def download_step(self, job_id: str, step: int, manifest: Manifest, manifest_bytes: bytes, dst: Path) -> None:
        """Download the files ``manifest`` lists (and the manifest's exact bytes) into ``dst``."""
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
        write_bytes_atomic(dst / layout.MANIFEST, manifest_bytes)

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
UPLOADER_ENV = "GPUCLOUD_S3_UPLOADER"  # auto (default) | s3torchconnector | boto3
S3TORCH = "s3torchconnector"
UPLOADERS = ("auto", S3TORCH, "boto3")
# The CRT sizes its connection pool for this target; its default (10 Gbps) is a tenth of a P4d/P5
# node's IP card (cluster/emergency_save.IP_CARD_GBPS). A higher target on a small node costs little.
S3TORCH_TARGET_GBPS = 100.0
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


def s3_uploader(environ: dict[str, str] | None = None) -> str:
    """Which library uploads a step's files: AWS's s3torchconnector when installed (the ``s3``
    extra), else boto3's managed transfer; ``GPUCLOUD_S3_UPLOADER`` forces one."""
    env = os.environ if environ is None else environ
    choice = env.get(UPLOADER_ENV, "").strip() or "auto"
    if choice not in UPLOADERS:
        raise UserError(f"{UPLOADER_ENV}={choice!r} is not known; allowed: {', '.join(UPLOADERS)}")
    if choice == "auto":
        import importlib.util

        return S3TORCH if importlib.util.find_spec(S3TORCH) is not None else "boto3"
    if choice == S3TORCH:
        import importlib.util

        if importlib.util.find_spec(S3TORCH) is None:
            raise UserError(f"{UPLOADER_ENV}={S3TORCH} but it is not installed; pip install 'gpucloud[s3]'")
    return choice


def open_tier(location: layout.Location) -> Tier:
    if isinstance(location, layout.S3Location):
        return S3Tier(location, **s3_transfer_settings(), uploader=s3_uploader())
    return LocalTier(location.root)
