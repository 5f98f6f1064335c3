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

The fence: rank 0 checks before anything is uploaded that no newer attempt holds the job, and the
commit itself (rename or manifest put, then LATEST) runs under the fence (``store.commit_durable``:
a lock on a file system, a conditional put on S3). A fenced-out attempt changes nothing, and every
rank raises ``FencedError`` (rank 0 tells the others, so none waits at a barrier forever).
"""

from __future__ import annotations

import dataclasses
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from gpucloud.checkpoint.manifest import FileEntry, Manifest
from gpucloud.checkpoint.store import CheckpointStore, FencedError


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
    # GPUCLOUD_ATTEMPT when the job runs under spot-train: the commit is fenced by it. None
    # outside spot-train (nothing to fence against).
    attempt_token: int | None = None

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
    fenced = _fence_check(ctx) if group.rank == 0 else None
    gathered: list[Any] = group.all_gather_object((my_files, fenced))
    if gathered[0][1] is not None:
        raise FencedError(gathered[0][1])
    per_rank: list[list[FileEntry]] = [files for files, _ in gathered]
    manifest = build_manifest(ctx, per_rank, group.world_size)
    manifest_bytes = manifest.to_json().encode()
    store = ctx.store
    durable = store.durable
    if not store.writes_direct_to_durable:  # else DCP wrote the files into the tier's own staging
        durable.stage_files(store.job_id, ctx.step, ctx.token, ctx.staging, [e.name for e in my_files])
    group.barrier()
    failure = None
    if group.rank == 0:
        failure = _commit_durable(
            ctx, manifest_bytes, lambda: durable.publish_step(store.job_id, ctx.step, ctx.token, manifest_bytes)
        )
    _raise_if_rank0_failed(group.all_gather_object(failure)[0])
    if group.is_node_leader and store.local is not None:
        store.local.commit_staging(store.job_id, ctx.step, ctx.staging, manifest_bytes)
        store.commit_local_latest(ctx.step, manifest_bytes, ctx.attempt_token)
    return manifest


def _fence_check(ctx: SaveContext) -> str | None:
    try:
        ctx.store.check_fence(ctx.attempt_token, ctx.step)
    except FencedError as exc:
        return str(exc)
    except Exception:  # noqa: BLE001 - e.g. LATEST unreadable: the commit below meets it again and
        return None  # reports it to every rank; raising here alone would leave the others waiting
    return None


def _commit_durable(ctx: SaveContext, manifest_bytes: bytes, publish: Callable[[], object]) -> tuple[bool, str] | None:
    """Rank 0's durable commit; None when done, else (fenced?, message) for every rank to raise."""
    try:
        ctx.store.commit_durable(ctx.step, manifest_bytes, ctx.attempt_token, publish)
    except FencedError as exc:
        return True, str(exc)
    except Exception as exc:  # noqa: BLE001 - the other ranks must learn of it, or they hang
        return False, f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}"
    return None


def _raise_if_rank0_failed(failure: Any) -> None:
    if failure is None:
        return
    fenced, message = failure
    raise FencedError(message) if fenced else RuntimeError(f"commit on rank 0 failed: {message}")


def discard(ctx: SaveContext) -> None:
    """Remove this save's staging directory after a failed save (never a committed step)."""
    shutil.rmtree(ctx.staging, ignore_errors=True)


def prepare(ctx: SaveContext, group: Group) -> None:
    """Clear a staging directory left by a killed writer of the same step and attempt, so the
    save starts empty on every rank (rank 0 clears, everyone waits)."""
    if group.rank == 0 and ctx.staging.exists():
        shutil.rmtree(ctx.staging, ignore_errors=True)
    group.barrier()
