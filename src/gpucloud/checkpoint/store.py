"""The checkpoint store of one job: which steps are committed, which one to resume from.

No torch here: the supervisor calls ``latest_committed`` to learn what the job has committed.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Literal

from gpucloud.checkpoint import latest as latest_format
from gpucloud.checkpoint import layout
from gpucloud.checkpoint.latest import LatestRecord
from gpucloud.checkpoint.manifest import (
    Manifest,
    ManifestError,
    check_dcp_references,
    manifest_digest,
    os_reason,
    read_manifest_bytes,
    verify_directory,
)
from gpucloud.checkpoint.placement import SCRATCH_ENV
from gpucloud.checkpoint.retention import steps_to_delete
from gpucloud.checkpoint.tiers import LocalTier, Tier, open_tier
from gpucloud.errors import UserError

log = logging.getLogger(__name__)


class LatestError(UserError):
    """LATEST exists but does not name a step."""


class FencedError(RuntimeError):
    """A newer attempt holds the job: this attempt may not commit (or start) any more."""


def parse_latest_record(raw: bytes, where: str) -> LatestRecord:
    try:
        return latest_format.parse(raw, where)
    except latest_format.LatestCorrupt as exc:
        raise LatestError(str(exc)) from None


def read_latest_record(tier: Tier, job_id: str) -> LatestRecord | None:
    raw = tier.read_latest(job_id)
    return None if raw is None else parse_latest_record(raw, tier.describe(job_id))


def read_latest(tier: Tier, job_id: str) -> int | None:
    record = read_latest_record(tier, job_id)
    return None if record is None else record.step


def check_fence(record: LatestRecord | None, attempt: int | None, job_id: str, where: str, action: str) -> None:
    """Refuse ``action`` when LATEST says a newer attempt than ``attempt`` holds the job (an
    attempt without a token, i.e. outside spot-train, is never fenced)."""
    if attempt is None or record is None or record.attempt is None or record.attempt <= attempt:
        return
    raise FencedError(
        f"attempt {attempt} of job {job_id} no longer holds it: attempt {record.attempt} took it over "
        f"({where}/LATEST); refusing to {action}"
    )


def resume_candidates(latest: int | None, committed: list[int]) -> list[int]:
    """Steps to try, newest first: what LATEST names, then older committed steps.

    Steps newer than LATEST were renamed into place but never named by LATEST (the writer died
    between the two), so they are not candidates.
    """
    if latest is None:
        return []
    older = sorted((s for s in committed if s < latest), reverse=True)
    return [latest, *older]


@dataclasses.dataclass(frozen=True)
class Resolved:
    step: int
    tier: str  # "local" or "durable"
    directory: Path  # where DCP reads it (a local copy for S3)
    manifest: Manifest
    manifest_bytes: bytes  # exactly as committed (what LATEST's checksum covers)
    # False: every file but DCP's metadata still has to be hashed, by the load that reads them.
    data_verified: bool = True


class CheckpointStore:
    """Durable tier (path or s3://) plus an optional node-local fast tier, for one job."""

    def __init__(self, uri: str, job_id: str, *, local_dir: str | os.PathLike[str] | None = None) -> None:
        self.uri = uri
        self.job_id = layout.validate_job_id(job_id)
        self.location = layout.parse_uri(uri)
        self.durable = open_tier(self.location)
        if local_dir:
            self.local: LocalTier | None = LocalTier(Path(local_dir).expanduser().absolute())
        elif self.durable.needs_local_copy:
            # S3 needs files on disk to upload from and to load from; without a configured fast
            # tier, stage on the node's NVMe scratch, else in a per-user temp directory.
            self.local = LocalTier(default_staging_root())
        else:
            self.local = None

    # -- where a save is written -------------------------------------------------------------
    def staging_path(self, step: int, token: str) -> Path:
        if self.local is not None:
            return self.local.staging_path(self.job_id, step, token)
        directory = self.durable.save_directory(self.job_id, step, token)
        assert directory is not None, "a tier that cannot be written in place always gets a local one"
        return directory

    @property
    def writes_direct_to_durable(self) -> bool:
        return self.local is None

    def durable_description(self, step: int | None = None) -> str:
        base = self.durable.describe(self.job_id)
        return base if step is None else f"{base}/{layout.step_dir(step)}"

    # -- what is committed --------------------------------------------------------------------
    def latest_record(self) -> LatestRecord | None:
        return read_latest_record(self.durable, self.job_id)

    def latest_durable(self) -> int | None:
        record = self.latest_record()
        return None if record is None else record.step

    def committed_durable(self) -> list[int]:
        return self.durable.committed_steps(self.job_id)

    def resolve(
        self, *, verify_checksums: bool = True, load: Callable[[Resolved], object] | None = None
    ) -> Resolved | None:
        """The newest committed checkpoint that verifies, from the local tier when it has a
        valid copy, else from the durable tier; None when the job has no checkpoint.

        ``load`` is called with each candidate that passed every other check; it loads it, and
        (with ``verify_checksums``) checks the data files' XXH3 as it reads them, which this
        then leaves to it (``dcp_io.load(verify=...)``): every byte is read once. A ManifestError
        from it rejects the candidate like any other failed check, and the next one is tried."""
        record = self.latest_record()
        latest = None if record is None else record.step
        committed = self.committed_durable()
        candidates = resume_candidates(latest, committed)
        if latest is not None and latest not in committed:
            log.warning(
                "%s names %s, which has no manifest; falling back to the previous committed step",
                f"{self.durable_description()}/LATEST",
                layout.step_dir(latest),
            )
        for step in candidates:
            expected = None if record is None else record.manifest_digest(step)
            resolved = self._resolve_step(step, expected, verify_checksums, load)
            if resolved is not None:
                return resolved
        if candidates:
            raise UserError(
                f"no checkpoint of job {self.job_id} under {self.durable_description()} verifies "
                f"(tried {', '.join(layout.step_dir(s) for s in candidates)}); see the warnings above"
            )
        return None

    def _resolve_step(
        self,
        step: int,
        expected_digest: str | None,
        verify_checksums: bool,
        load: Callable[[Resolved], object] | None,
    ) -> Resolved | None:
        # With a loader that hashes as it reads, only DCP's metadata is hashed here.
        checks: bool | Literal["metadata"] = "metadata" if verify_checksums and load is not None else verify_checksums
        if self.local is not None:
            directory = self.local.step_path(self.job_id, step)
            if _is_dir(directory):
                try:
                    manifest, raw = self._verify_copy(directory, step, expected_digest, checks)
                    resolved = Resolved(step, "local", directory, manifest, raw, data_verified=checks is True)
                    if load is not None:
                        load(resolved)
                    return resolved
                except ManifestError as exc:
                    log.warning("local copy not usable, reading the durable tier: %s", exc)
                except OSError as exc:  # verified, but keeping it failed (e.g. the local disk is full)
                    log.warning("local copy not usable, reading the durable tier: %s: %s", directory, os_reason(exc))
        try:
            in_place = self.durable.step_directory(self.job_id, step)
            if in_place is None:  # hashed as it is checked after the download
                directory, manifest, raw = self._download_verified(step, expected_digest, verify_checksums)
                verified = verify_checksums
            else:
                directory = in_place
                manifest, raw = self._verify_copy(directory, step, expected_digest, checks)
                verified = checks is True
            resolved = Resolved(step, "durable", directory, manifest, raw, data_verified=verified)
            if load is not None:
                load(resolved)
            return resolved
        except ManifestError as exc:
            log.warning("skipping %s: %s", layout.step_dir(step), exc)
            return None
        except OSError as exc:  # e.g. the local tier cannot hold the verified S3 download
            log.warning("skipping %s: %s: %s", layout.step_dir(step), getattr(exc, "filename", ""), os_reason(exc))
            return None

    def _verify_copy(
        self, directory: Path, step: int, expected_digest: str | None, verify_checksums: bool | Literal["metadata"]
    ) -> tuple[Manifest, bytes]:
        """A step directory is valid only if its manifest is the one LATEST recorded (when it
        recorded one), names this job and step, lists every file in the directory, every listed
        file verifies, and every file DCP's metadata references is listed."""
        raw = read_manifest_bytes(directory)
        manifest = self._trusted_manifest(raw, str(directory), step, expected_digest)
        verify_directory(directory, manifest, checksums=verify_checksums)
        if verify_checksums:  # True or "metadata": the metadata verified, so it may be read
            check_dcp_references(directory, manifest)
        return manifest, raw

    def _trusted_manifest(self, raw: bytes, where: str, step: int, expected_digest: str | None) -> Manifest:
        if expected_digest is not None and (actual := manifest_digest(raw)) != expected_digest:
            raise ManifestError(f"{where}: manifest.json checksum {actual} does not match LATEST's {expected_digest}")
        manifest = Manifest.parse(raw, where)
        if manifest.step != step or manifest.job_id != self.job_id:
            raise ManifestError(
                f"{where}: manifest is for job {manifest.job_id!r} step {manifest.step}, "
                f"not job {self.job_id!r} {layout.step_dir(step)}"
            )
        return manifest

    def _download_verified(
        self, step: int, expected_digest: str | None, verify_checksums: bool
    ) -> tuple[Path, Manifest, bytes]:
        assert self.local is not None, "a tier read by download always gets a local one"
        where = self.durable_description(step)
        raw = self.durable.read_manifest_bytes(self.job_id, step)
        manifest = self._trusted_manifest(raw, where, step, expected_digest)
        listed = {f.name for f in manifest.files}
        for name in sorted(self.durable.step_object_names(self.job_id, step)):
            if name != layout.MANIFEST and name not in listed:
                raise ManifestError(f"{where}: {name!r} is not listed in the manifest")
        staging = self.local.staging_path(self.job_id, step, "download")
        shutil.rmtree(staging, ignore_errors=True)  # a killed download's leftovers are not listed
        self.durable.download_step(self.job_id, step, manifest, raw, staging)
        verify_directory(staging, manifest, checksums=verify_checksums)
        check_dcp_references(staging, manifest)
        # Keep the verified download as the local copy: the next attempt on this node (or the
        # other ranks of this node) read it from there.
        return self.local.commit_staging(self.job_id, step, staging, raw), manifest, raw

    # -- the commit fence -----------------------------------------------------------------------
    def claim(self, attempt: int) -> None:
        """Record in the durable LATEST that ``attempt`` now holds the job, so that an older
        attempt still running can no longer commit. FencedError when a newer one holds it."""
        where = self.durable_description()

        def change(raw: bytes | None) -> str | None:
            record = None if raw is None else parse_latest_record(raw, where)
            check_fence(record, attempt, self.job_id, where, "start")
            if record is not None and record.attempt == attempt:
                return None
            return (record or LatestRecord(step=None)).claimed(attempt).render()

        self.durable.update_latest(self.job_id, change)

    def check_fence(self, attempt: int | None, step: int) -> None:
        """FencedError if a newer attempt holds the job (a cheap early check before uploading)."""
        if attempt is not None:
            check_fence(
                self.latest_record(), attempt, self.job_id, self.durable_description(), f"save {layout.step_dir(step)}"
            )

    def commit_durable(
        self, step: int, manifest_bytes: bytes, attempt: int | None, publish: Callable[[], object]
    ) -> None:
        """Under the fence: ``publish`` the step (rename / manifest put), then point LATEST at it.
        A newer attempt holding the job leaves both undone (FencedError)."""
        where = self.durable_description()
        digest = manifest_digest(manifest_bytes)

        def change(raw: bytes | None) -> str:
            record = None if raw is None else parse_latest_record(raw, where)
            check_fence(record, attempt, self.job_id, where, f"commit {layout.step_dir(step)}")
            return (record or LatestRecord(step=None)).committed(step, digest, attempt).render()

        self.durable.update_latest(self.job_id, change, before_write=publish)

    def commit_local_latest(self, step: int, manifest_bytes: bytes, attempt: int | None) -> None:
        """Point the node-local LATEST (a cache, never fenced) at ``step``."""
        assert self.local is not None
        try:
            record = read_latest_record(self.local, self.job_id)
        except UserError:
            record = None
        record = (record or LatestRecord(step=None)).committed(step, manifest_digest(manifest_bytes), attempt)
        self.local.write_latest(self.job_id, record.render())

    # -- retention ----------------------------------------------------------------------------
    def apply_retention(self, keep_last: int, *, durable: bool = True, local: bool = True) -> list[int]:
        """Delete committed steps beyond the newest ``keep_last`` (never the one LATEST names),
        and staging directories left by killed writers. Call only while no save is in flight."""
        latest = self.latest_durable()
        doomed: list[int] = []
        if durable:
            doomed = steps_to_delete(self.committed_durable(), keep_last, protected=(latest,))
            for step in doomed:
                self.durable.delete_step(self.job_id, step)
            self.durable.remove_stale_staging(self.job_id)
        if local and self.local is not None:
            try:
                local_latest = read_latest(self.local, self.job_id)
            except UserError:  # a damaged cache protects nothing; the durable LATEST still does
                local_latest = None
            for step in steps_to_delete(
                self.local.committed_steps(self.job_id), keep_last, protected=(latest, local_latest)
            ):
                self.local.delete_step(self.job_id, step)
            self.local.remove_stale_staging(self.job_id)
        return doomed


# node.env (infra/program.py): whether the stack made the NVMe scratch (its mount: placement.SCRATCH_ENV).
NVME_SCRATCH_ENV = "GPUCLOUD_NVME_SCRATCH"


def default_staging_root(environ: dict[str, str] | None = None) -> Path:
    """Where a save to S3 is written before its upload when no local tier was given.

    On a node with NVMe scratch (node.env names the mount the bootstrap made), that: instance store
    writes at GB/s. The temp directory is on the gp3 root volume, 125 MiB/s unless provisioned
    higher (https://docs.aws.amazon.com/ebs/latest/userguide/general-purpose.html): 208 GB of state
    on four nodes would take about 7 minutes to stage there, far past a 2-minute spot notice."""
    env = os.environ if environ is None else environ
    scratch = env.get(SCRATCH_ENV, "").strip()
    nvme = env.get(NVME_SCRATCH_ENV, "1").strip() != "0"
    if nvme and scratch and os.path.isabs(scratch) and os.path.isdir(scratch) and os.access(scratch, os.W_OK):
        return Path(scratch) / f"gpucloud-checkpoints-{os.getuid()}"
    return Path(tempfile.gettempdir()) / f"gpucloud-checkpoints-{os.getuid()}"


def _is_dir(path: Path) -> bool:
    try:
        return path.is_dir()
    except OSError as exc:  # e.g. permission denied on the tier's directory
        log.warning("%s: %s", path, os_reason(exc))
        return False


def latest_committed(uri: str, job_id: str) -> int | None:
    """The step the job would resume from (LATEST, or the previous committed step when LATEST
    names one without a manifest); None when nothing is committed. Reads manifests, not data."""
    store = CheckpointStore(uri, job_id)
    latest = store.latest_durable()
    committed = set(store.committed_durable())
    for step in resume_candidates(latest, sorted(committed)):
        if step in committed:
            return step
    return None
