"""Where checkpoints live: the URI forms we accept and the names inside a job's directory.

The layout every reader and writer relies on (docs/architecture.md, "Contracts"):
``<uri>/<job-id>/step-<n>/`` holds the DCP files and ``manifest.json``, and a step is committed
only once its manifest is in place; ``<uri>/<job-id>/LATEST`` names the committed step and is
written last, so a reader that goes through LATEST never sees a partial step. Work in progress
sits beside the steps under a dot-name. ``uri`` is a local or shared path (also ``file://``) or
``s3://bucket/prefix``.
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from urllib.parse import urlparse

from gpucloud.errors import UserError

LATEST = "LATEST"
MANIFEST = "manifest.json"
STEP_PREFIX = "step-"
# Work in progress lives beside the committed steps under a dot-name, so listings skip it and a
# crash leaves nothing that looks committed.
TMP_PREFIX = ".tmp-"

# At most 18 digits: every step fits in an int64, and a 5000-digit "step" never reaches int().
_STEP_RE = re.compile(r"\Astep-(0|[1-9][0-9]{0,17})\Z")
_JOB_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
_BUCKET_RE = re.compile(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")


def step_dir(step: int) -> str:
    if step < 0:
        raise ValueError(f"step must be >= 0, got {step}")
    return f"{STEP_PREFIX}{step}"


def parse_step_dir(name: str) -> int | None:
    """The step of a committed step directory name, or None for anything else."""
    match = _STEP_RE.match(name)
    return int(match.group(1)) if match else None


def validate_job_id(job_id: str) -> str:
    if not job_id or not _JOB_ID_RE.fullmatch(job_id):
        raise UserError(
            f"job id {job_id!r} is not usable in a checkpoint path; use 1-128 characters "
            "from letters, digits, '.', '_' and '-', starting with a letter or digit"
        )
    return job_id


@dataclasses.dataclass(frozen=True)
class LocalLocation:
    """A directory on a local or shared file system (NVMe, FSx for Lustre, NFS)."""

    root: Path

    def __str__(self) -> str:
        return str(self.root)


@dataclasses.dataclass(frozen=True)
class S3Location:
    bucket: str
    prefix: str  # no leading or trailing slash; may be empty

    def key(self, *parts: str) -> str:
        return "/".join(p for p in (self.prefix, *parts) if p)

    def __str__(self) -> str:
        return f"s3://{self.bucket}/{self.prefix}" if self.prefix else f"s3://{self.bucket}"


Location = LocalLocation | S3Location


def parse_uri(uri: str) -> Location:
    """Parse a checkpoint URI: a path, ``file:///path`` or ``s3://bucket[/prefix]``."""
    if not uri or not uri.strip():
        raise UserError("checkpoint URI is empty; give a directory path or s3://bucket/prefix")
    uri = uri.strip()
    if "://" not in uri:
        return LocalLocation(Path(uri).expanduser().absolute())
    parsed = urlparse(uri)
    if parsed.scheme == "file":
        if parsed.netloc not in ("", "localhost"):
            raise UserError(f"checkpoint URI {uri!r}: file:// URIs must name a local path (file:///dir)")
        return LocalLocation(Path(parsed.path).absolute())
    if parsed.scheme == "s3":
        bucket = parsed.netloc
        if not _BUCKET_RE.fullmatch(bucket or ""):
            raise UserError(
                f"checkpoint URI {uri!r}: {bucket!r} is not a valid S3 bucket name "
                "(3-63 lowercase letters, digits, '.' and '-')"
            )
        return S3Location(bucket, parsed.path.strip("/"))
    raise UserError(
        f"checkpoint URI {uri!r}: scheme {parsed.scheme!r} is not supported; "
        "use a directory path, file:///dir or s3://bucket/prefix"
    )
