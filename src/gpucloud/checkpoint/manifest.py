"""The manifest written into every committed step: what the checkpoint holds and how to check it.

Checksum choice: XXH3-64. The failures we defend against are accidental: a writer killed
mid-file, a truncated copy or upload, a flipped block. A 64-bit non-cryptographic hash detects
all of those, and XXH3 runs at ~13 GB/s per core here against ~2.6-4 GB/s for CRC-32 and
~1.8 GB/s for SHA-256. That matters because the hash is computed on the save path, whose goal is
to stay within 80% of raw disk speed (measured: inline CRC-32 cost a third of the save
throughput on 2 vCPUs). Integrity against tampering is the storage's job (IAM, bucket policy,
S3's own transfer checksums), not the manifest's.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Literal

import xxhash
from pydantic import BaseModel, Field, ValidationError

FORMAT: Literal["gpucloud-checkpoint/1"] = "gpucloud-checkpoint/1"
_READ_CHUNK = 8 * 1024 * 1024


class ManifestError(Exception):
    """A manifest is missing, unparsable, or does not match the files it describes."""


class FileEntry(BaseModel):
    name: str = Field(pattern=r"^[^/\\]+$")  # a plain file name inside the step directory
    size: int = Field(ge=0)
    xxh3: str = Field(pattern=r"^[0-9a-f]{16}$")  # XXH3-64 of the file's bytes, hex


class Manifest(BaseModel):
    format: Literal["gpucloud-checkpoint/1"] = FORMAT
    job_id: str
    step: int = Field(ge=0)
    world_size: int = Field(ge=1)
    attempt: int = Field(ge=0)
    created_at: float = Field(default_factory=time.time)
    checksum: Literal["xxh3-64"] = "xxh3-64"
    files: list[FileEntry]

    @property
    def total_bytes(self) -> int:
        return sum(f.size for f in self.files)

    def to_json(self) -> str:
        return self.model_dump_json(indent=1)

    @classmethod
    def parse(cls, text: str | bytes, where: str) -> Manifest:
        try:
            return cls.model_validate_json(text)
        except ValidationError as exc:
            first = exc.errors()[0]
            loc = ".".join(str(p) for p in first.get("loc", ())) or "document"
            raise ManifestError(f"{where}: invalid manifest ({loc}: {first.get('msg')})") from None


def new_hasher() -> xxhash.xxh3_64:
    return xxhash.xxh3_64()


def file_digest(path: str | os.PathLike[str]) -> tuple[int, str]:
    """(size, XXH3-64 hex) of a file, read in large chunks."""
    hasher = new_hasher()
    size = 0
    with open(path, "rb", buffering=0) as fh:
        while True:
            chunk = fh.read(_READ_CHUNK)
            if not chunk:
                break
            hasher.update(chunk)
            size += len(chunk)
    return size, hasher.hexdigest()


def verify_directory(directory: Path, manifest: Manifest, *, checksums: bool = True) -> None:
    """Raise ManifestError naming the first file that is missing, short, long or corrupt."""
    for entry in manifest.files:
        path = directory / entry.name
        try:
            actual_size = path.stat().st_size
        except FileNotFoundError:
            raise ManifestError(f"{directory}: {entry.name} is missing") from None
        if actual_size != entry.size:
            raise ManifestError(f"{directory}: {entry.name} has {actual_size} bytes, manifest says {entry.size}")
        if checksums:
            _, digest = file_digest(path)
            if digest != entry.xxh3:
                raise ManifestError(f"{directory}: {entry.name} checksum {digest} does not match manifest {entry.xxh3}")


def read_manifest(directory: Path) -> Manifest:
    path = directory / "manifest.json"
    try:
        text = path.read_bytes()
    except FileNotFoundError:
        raise ManifestError(f"{directory}: manifest.json is missing") from None
    return Manifest.parse(text, str(directory))


def write_text_atomic(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` through a temp file, fsync, rename, fsync the directory."""
    tmp = path.with_name(f"{path.name}.tmp-{os.getpid()}")
    with open(tmp, "w") as fh:
        fh.write(text)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)
    fsync_dir(path.parent)


def fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
