"""``gpucloud.checkpoint.load``: a job's committed checkpoint into a model, outside any job.

    from gpucloud.checkpoint import load
    step = load("/fsx/checkpoints/llama-7b", model)                      # the job's directory
    step = load("s3://bucket/ckpt", model, job_id="llama-7b")            # the root + the job id

The same guarantees as ``TrainingSession.restore``: LATEST is read, the step it names (else the
previous committed one) is used only when its manifest matches LATEST's checksum and every file
verifies. Unlike restore it never touches the job: no claim on LATEST (a running attempt keeps
its fence), no control files, no job environment read, and RNG states are left alone.
"""

from __future__ import annotations

from pathlib import PurePosixPath
from typing import Any

import torch

from gpucloud.checkpoint import dcp_io, layout, state
from gpucloud.checkpoint.session import check_fits, validate_extra_state
from gpucloud.checkpoint.store import CheckpointStore, Resolved
from gpucloud.errors import UserError


def load(
    uri: str,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer | None = None,
    *,
    job_id: str | None = None,
    extra_state: dict[str, Any] | None = None,
    local_dir: str | None = None,
) -> int:
    """Load the newest committed checkpoint of a job into ``model`` (and ``optimizer``, and the
    ``extra_state`` objects, when given); return its step.

    ``uri`` is the job's directory, ``<checkpoint-uri>/<job-id>`` (what ``gpucloud job show``
    prints), or, with ``job_id=``, the checkpoint root the job ran with (``GPUCLOUD_CHECKPOINT_URI``).
    From S3 the files are downloaded to ``local_dir`` (default: the node's scratch or a temp
    directory) and verified there. With a process group initialized, call it on every rank."""
    root, job = split_job_uri(uri, job_id)
    extra = validate_extra_state(extra_state)
    store = CheckpointStore(root, job, local_dir=local_dir)

    def load_into_model(candidate: Resolved) -> None:
        keys = dcp_io.saved_keys(candidate.directory)
        present = {k.split(".", 3)[2] for k in keys if k.startswith("extra.rank0.")}
        missing = sorted(extra.keys() - present)
        if missing:
            raise UserError(
                f"checkpoint {candidate.directory} has no state for extra_state {missing}; it has {sorted(present)}"
            )
        target: dict[str, Any] = state.capture(model, optimizer, extra, rank=0, step=0)
        target.pop("rng")
        if not extra:
            target.pop("extra")
        sections = ("model.", "optim.") if optimizer is not None else ("model.",)
        check_fits(target, candidate.directory, sections=sections)
        # Hashed as read when only the metadata was checked (one pass); a file that does not
        # verify raises ManifestError and the previous committed step is tried.
        verify = None if candidate.data_verified else candidate.manifest.files
        dcp_io.load(target, candidate.directory, verify=verify)
        state.apply_weights(target, model, optimizer, extra, source_rank=0)

    # With a process group, every rank loads: rank-local verification would let ranks disagree
    # on the step, so the files are all verified first, then loaded.
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        resolved = store.resolve()
        if resolved is not None:
            load_into_model(resolved)
    else:
        resolved = store.resolve(load=load_into_model)
    if resolved is None:
        raise UserError(
            f"no committed checkpoint of job {job} under {store.durable_description()} (no LATEST there); "
            "give the job's directory <checkpoint-uri>/<job-id>, or the checkpoint root with job_id="
        )
    return resolved.step


def split_job_uri(uri: str, job_id: str | None) -> tuple[str, str]:
    """(checkpoint root, job id): ``job_id`` with ``uri`` as the root, else the last part of ``uri``."""
    if not isinstance(uri, str) or not uri.strip():
        raise UserError("checkpoint URI is empty; give the job's directory <checkpoint-uri>/<job-id>")
    if job_id is not None:
        return uri, layout.validate_job_id(job_id)
    trimmed = uri.strip().rstrip("/")
    scheme, sep, path = trimmed.partition("://")
    if not sep:
        scheme, path = "", trimmed
    parts = PurePosixPath(path)
    last = parts.name
    if last == layout.LATEST or layout.parse_step_dir(last) is not None:
        raise UserError(
            f"checkpoint URI {uri!r} names {last!r} inside a job's directory; give the job's directory "
            f"itself ({trimmed.rsplit('/', 1)[0]}): its LATEST picks the committed step"
        )
    bucket_only = scheme == "s3" and "/" not in path.strip("/")
    if not last or last in (".", "..") or bucket_only:
        raise UserError(f"checkpoint URI {uri!r} names no job; give <checkpoint-uri>/<job-id>, or pass job_id=")
    root = f"{scheme}://{parts.parent}" if sep else str(parts.parent)
    return root, layout.validate_job_id(last)
