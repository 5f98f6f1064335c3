"""The checkpoint store of one job: which steps are committed, which one to resume from.

No torch here: the supervisor calls ``latest_committed`` to learn what the job has committed.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import shutil
import tempfile
from pathlib import Path

from gpucloud.checkpoint import layout
from gpucloud.checkpoint.manifest import Manifest, ManifestError, read_manifest, verify_directory
from gpucloud.checkpoint.retention import steps_to_delete
from gpucloud.checkpoint.tiers import LocalTier, S3Tier, open_tier
from gpucloud.errors import UserError

log = logging.getLogger(__name__)


class LatestError(UserError):
    """LATEST exists but does not name a step."""


def parse_latest(text: str, where: str) -> int:
    step = layout.parse_step_dir(text.strip())
    if step is None:
        shown = text.strip()[:40]
        raise LatestError(
            f"{where}/LATEST is corrupt (contains {shown!r}); expected one line 'step-<n>'. "
            "Write the step to resume from into it, or delete it to start from scratch"
        )
    return step


def read_latest(tier: LocalTier | S3Tier, job_id: str) -> int | None:
    text = tier.read_latest(job_id)
    return None if text is None else parse_latest(text, tier.describe(job_id))


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


class CheckpointStore:
    """Durable tier (path or s3://) plus an optional node-local fast tier, for one job."""

    def __init__(self, uri: str, job_id: str, *, local_dir: str | os.PathLike[str] | None = None) -> None:
        self.uri = uri
        self.job_id = layout.validate_job_id(job_id)
        self.location = layout.parse_uri(uri)
        self.durable = open_tier(self.location)
        if local_dir:
            self.local: LocalTier | None = LocalTier(Path(local_dir).expanduser().absolute())
        elif isinstance(self.durable, S3Tier):
            # S3 needs files on disk to upload from and to load from; without a configured fast
            # tier, stage in a per-user temp directory.
            self.local = LocalTier(Path(tempfile.gettempdir()) / f"gpucloud-checkpoints-{os.getuid()}")
        else:
            self.local = None

    # -- where a save is written -------------------------------------------------------------
    def staging_path(self, step: int, token: str) -> Path:
        tier = self.local if self.local is not None else self.durable
        assert isinstance(tier, LocalTier)
        return tier.staging_path(self.job_id, step, token)

    @property
    def writes_direct_to_durable(self) -> bool:
        return self.local is None

    def durable_description(self, step: int | None = None) -> str:
        base = self.durable.describe(self.job_id)
        return base if step is None else f"{base}/{layout.step_dir(step)}"

    # -- what is committed --------------------------------------------------------------------
    def latest_durable(self) -> int | None:
        return read_latest(self.durable, self.job_id)

    def committed_durable(self) -> list[int]:
        return self.durable.committed_steps(self.job_id)

    def resolve(self, *, verify_checksums: bool = True) -> Resolved | None:
        """The newest committed checkpoint that verifies, from the local tier when it has a
        valid copy, else from the durable tier; None when the job has no checkpoint."""
        latest = self.latest_durable()
        candidates = resume_candidates(latest, self.committed_durable())
        if latest is not None and latest not in self.committed_durable():
            log.warning(
                "%s names %s, which has no manifest; falling back to the previous committed step",
                f"{self.durable_description()}/LATEST",
                layout.step_dir(latest),
            )
        for step in candidates:
            resolved = self._resolve_step(step, verify_checksums)
            if resolved is not None:
                return resolved
        if candidates:
            raise UserError(
                f"no checkpoint of job {self.job_id} under {self.durable_description()} verifies "
                f"(tried {', '.join(layout.step_dir(s) for s in candidates)}); see the warnings above"
            )
        return None

    def _resolve_step(self, step: int, verify_checksums: bool) -> Resolved | None:
        if self.local is not None:
            directory = self.local.step_path(self.job_id, step)
            if directory.exists():
                try:
                    manifest = read_manifest(directory)
                    verify_directory(directory, manifest, checksums=verify_checksums)
                    return Resolved(step, "local", directory, manifest)
                except ManifestError as exc:
                    log.warning("local copy not usable, reading the durable tier: %s", exc)
        try:
            manifest = self.durable.read_manifest(self.job_id, step)
            if isinstance(self.durable, S3Tier):
                assert self.local is not None
                directory = self.local.staging_path(self.job_id, step, "download")
                self.durable.download_step(self.job_id, step, manifest, directory)
                verify_directory(directory, manifest, checksums=verify_checksums)
                # Keep the verified download as the local copy: the next attempt on this node
                # (or the other ranks of this node) read it from there.
                directory = self.local.commit_staging(self.job_id, step, directory, manifest)
            else:
                directory = self.durable.step_path(self.job_id, step)
                verify_directory(directory, manifest, checksums=verify_checksums)
            return Resolved(step, "durable", directory, manifest)
        except ManifestError as exc:
            log.warning("skipping %s: %s", layout.step_dir(step), exc)
            return None

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
            if isinstance(self.durable, LocalTier):
                _remove_all(self.durable.stale_staging(self.job_id))
        if local and self.local is not None:
            local_latest = read_latest(self.local, self.job_id)
            for step in steps_to_delete(
                self.local.committed_steps(self.job_id), keep_last, protected=(latest, local_latest)
            ):
                self.local.delete_step(self.job_id, step)
            _remove_all(self.local.stale_staging(self.job_id))
        return doomed


def _remove_all(paths: list[Path]) -> None:
    for path in paths:
        shutil.rmtree(path, ignore_errors=True)


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
