"""The commit protocol: a step becomes visible only when every byte of it is durable.

Order, per save (every rank runs this after its DCP writes returned):

1. each rank knows (size, XXH3-64) of the files it wrote; ranks exchange them so that every rank
   holds the full manifest;
2. two tiers: every rank copies (shared path) or uploads (S3, multipart) its own files into the
   durable tier; a barrier makes sure all are in;
3. global rank 0 commits on the durable tier: manifest into the staging directory, then rename to
   ``step-<n>`` (S3: manifest put after all parts), then ``LATEST`` replaced atomically (S3: one put);
4. a barrier, so no rank reports the save done before LATEST names it;
5. the first rank of each node commits its local copy the same way (a cache for the next attempt).

A crash anywhere before step 3 leaves LATEST naming the previous checkpoint and a staging
directory (a dot-name) that retention removes later.
"""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path
from typing import Protocol

from gpucloud.checkpoint.manifest import FileEntry, Manifest
from gpucloud.checkpoint.store import CheckpointStore
from gpucloud.checkpoint.tiers import LocalTier, S3Tier


class Group(Protocol):
    """The collectives the commit needs (a gloo group in a job, trivial in one process)."""

    @property
    def rank(self) -> int: ...
    @property
    def world_size(self) -> int: ...
    @property
    def is_node_leader(self) -> bool: ...

    def all_gather_object(self, obj: object) -> list[object]: ...
    def barrier(self) -> None: ...


@dataclasses.dataclass(frozen=True)
class SaveContext:
    store: CheckpointStore
    step: int
    token: str  # the same on every rank: names the staging directory of this save
    attempt: int

    @property
    def staging(self) -> Path:
        return self.store.staging_path(self.step, self.token)


def build_manifest(ctx: SaveContext, per_rank: list[list[FileEntry]], world_size: int) -> Manifest:
    files: dict[str, FileEntry] = {}
    for entries in per_rank:
        for entry in entries:
            if entry.name in files and files[entry.name] != entry:
                raise RuntimeError(f"two ranks wrote {entry.name} with different contents")
            files[entry.name] = entry
    return Manifest(
        job_id=ctx.store.job_id,
        step=ctx.step,
        world_size=world_size,
        attempt=ctx.attempt,
        files=sorted(files.values(), key=lambda e: e.name),
    )


def commit(ctx: SaveContext, my_files: list[FileEntry], group: Group) -> Manifest:
    """Run the protocol above on every rank; return the committed manifest."""
    per_rank = group.all_gather_object(my_files)
    manifest = build_manifest(ctx, per_rank, group.world_size)  # type: ignore[arg-type]
    store = ctx.store
    names = [e.name for e in my_files]
    durable = store.durable

    if store.writes_direct_to_durable:
        assert isinstance(durable, LocalTier)
        group.barrier()
        if group.rank == 0:
            durable.commit_staging(store.job_id, ctx.step, ctx.staging, manifest)
            durable.write_latest(store.job_id, ctx.step)
        group.barrier()
        return manifest

    durable_staging = None
    if isinstance(durable, S3Tier):
        durable.upload_files(ctx.staging, names, store.job_id, ctx.step)
    else:
        durable_staging = durable.staging_path(store.job_id, ctx.step, ctx.token)
        durable.import_files(ctx.staging, names, durable_staging)
    group.barrier()
    if group.rank == 0:
        if isinstance(durable, S3Tier):
            durable.commit(store.job_id, ctx.step, manifest)
        else:
            assert durable_staging is not None
            durable.commit_staging(store.job_id, ctx.step, durable_staging, manifest)
        durable.write_latest(store.job_id, ctx.step)
    group.barrier()
    if group.is_node_leader and store.local is not None:
        store.local.commit_staging(store.job_id, ctx.step, ctx.staging, manifest)
        store.local.write_latest(store.job_id, ctx.step)
    return manifest


def discard(ctx: SaveContext) -> None:
    """Remove this save's staging directory after a failed save (never a committed step)."""
    shutil.rmtree(ctx.staging, ignore_errors=True)


def prepare(ctx: SaveContext, group: Group) -> None:
    """Clear a staging directory left by a killed writer of the same step and attempt, so the
    save starts empty on every rank (rank 0 clears, everyone waits)."""
    if group.rank == 0 and ctx.staging.exists():
        shutil.rmtree(ctx.staging, ignore_errors=True)
    group.barrier()
