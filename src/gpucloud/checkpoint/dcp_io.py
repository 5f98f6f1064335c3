"""PyTorch Distributed Checkpoint (DCP) I/O: tuned writers that checksum as they write, loads.

Why a custom file system under DCP's ``FileSystemWriter``: the manifest needs a checksum of every
file. Reading the files back after the save would add a second pass over every byte; hashing the
bytes as the writer threads stream them out costs only the CRC itself, spread over the writer
threads.
"""

from __future__ import annotations

import io
import os
import threading
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import FileSystemReader, FileSystemWriter
from torch.distributed.checkpoint.filesystem import FileSystem
from torch.distributed.checkpoint.metadata import Metadata

from gpucloud.checkpoint.manifest import FileEntry, new_hasher

# DCP's default of one writer thread is 2-3x slower than the disk (checkpoint-performance.md
# §1.3); 8 threads reached raw-write speed there.
DEFAULT_WRITER_THREADS = 8

# Without a process group we pass no_dist=True on purpose (one process, its own files); torch still
# warns on every save and load, which would print once per checkpoint in a user's log. A filter
# installed once, not catch_warnings around each call: saves run on background threads, and
# catch_warnings swaps the process-wide filter list under them.
warnings.filterwarnings(
    "ignore", message=r"torch\.distributed is disabled, unavailable or uninitialized", category=UserWarning
)


class _ChecksummingStream(io.RawIOBase):
    """A write-only file that keeps a running XXH3-64 and byte count of what passes through."""

    def __init__(self, raw: IO[bytes], on_close) -> None:
        super().__init__()
        self._raw = raw
        self._hasher = new_hasher()
        self._size = 0
        self._on_close = on_close

    def writable(self) -> bool:
        return True

    def write(self, b) -> int:
        view = memoryview(b)
        self._hasher.update(view)
        written = self._raw.write(view)
        self._size += view.nbytes
        return written if written is not None else view.nbytes

    def tell(self) -> int:
        return self._raw.tell()

    def flush(self) -> None:
        if not self._raw.closed:
            self._raw.flush()

    def fileno(self) -> int:
        return self._raw.fileno()

    def close(self) -> None:
        if not self.closed:
            self._raw.close()
            self._on_close(self._size, self._hasher.hexdigest())
        super().close()


class ChecksummingFileSystem(FileSystem):
    """DCP's local file system, recording (size, XXH3-64) of every file written through it."""

    def __init__(self) -> None:
        super().__init__()
        self._lock = threading.Lock()
        self.written: dict[str, FileEntry] = {}

    @contextmanager
    def create_stream(self, path: str | os.PathLike, mode: str) -> Iterator[io.IOBase]:
        if "w" not in mode:
            with super().create_stream(path, mode) as stream:
                yield stream
            return
        name = Path(path).name

        def record(size: int, digest: str) -> None:
            with self._lock:
                self.written[name] = FileEntry(name=name, size=size, xxh3=digest)

        stream = _ChecksummingStream(open(path, mode), record)  # noqa: SIM115 - closed by the finally below
        try:
            yield stream
        finally:
            stream.close()

    def rename(self, path: str | os.PathLike, new_path: str | os.PathLike) -> None:
        super().rename(path, new_path)
        with self._lock:
            entry = self.written.pop(Path(path).name, None)
            if entry is not None:
                self.written[Path(new_path).name] = entry.model_copy(update={"name": Path(new_path).name})


class ChecksummingWriter(FileSystemWriter):
    def __init__(self, path: Path, *, thread_count: int) -> None:
        super().__init__(path, single_file_per_rank=True, sync_files=True, thread_count=thread_count, overwrite=True)
        self.fs: ChecksummingFileSystem = ChecksummingFileSystem()
        self.path = self.fs.init_path(path)


def save(
    state: dict[str, Any], directory: Path, *, process_group=None, thread_count: int = DEFAULT_WRITER_THREADS
) -> list[FileEntry]:
    """Synchronously save ``state`` with DCP into ``directory``; return this rank's file entries."""
    directory.mkdir(parents=True, exist_ok=True)
    writer = ChecksummingWriter(directory, thread_count=thread_count)
    dcp.save(state, storage_writer=writer, process_group=process_group, no_dist=not dist.is_initialized())
    return sorted(writer.fs.written.values(), key=lambda e: e.name)


def load(state: dict[str, Any], directory: Path, *, process_group=None) -> None:
    """Load ``directory`` into ``state`` in place (resharding to this world size as needed)."""
    dcp.load(
        state,
        storage_reader=FileSystemReader(directory),
        process_group=process_group,
        no_dist=not dist.is_initialized(),
    )


def read_metadata(directory: Path) -> Metadata:
    """DCP's metadata of a checkpoint: every flattened key with its global shape (no tensor data read)."""
    return FileSystemReader(directory).read_metadata()


def saved_keys(directory: Path) -> set[str]:
    """The flattened keys a checkpoint holds (e.g. ``rng.rank1.torch``), read from its metadata."""
    return set(read_metadata(directory).state_dict_metadata.keys())


class StagingCache:
    """Copies state into CPU buffers that are reused from save to save.

    Fresh allocation per save (what ``clone()`` does) is ~7x slower than copying into existing
    buffers (checkpoint-performance.md §1.3); on GPU hosts the buffers are pinned so the
    device-to-host copy runs at full PCIe speed.
    """

    def __init__(self) -> None:
        self._buffers: dict[str, torch.Tensor] = {}
        self._pin = torch.cuda.is_available()

    def copy_later(self, key: str, tensor: torch.Tensor) -> torch.Tensor:
        """The buffer for ``key`` (allocated if shapes changed); the caller fills it later."""
        buf = self._buffers.get(key)
        if buf is None or buf.shape != tensor.shape or buf.dtype != tensor.dtype:
            buf = torch.empty(tensor.shape, dtype=tensor.dtype, device="cpu", pin_memory=self._pin)
            self._buffers[key] = buf
        return buf

    def holds(self, key: str, tensor: torch.Tensor) -> bool:
        """Whether a buffer for ``key`` of ``tensor``'s shape and dtype exists already."""
        buf = self._buffers.get(key)
        return buf is not None and buf.shape == tensor.shape and buf.dtype == tensor.dtype

    def copy(self, key: str, tensor: torch.Tensor) -> torch.Tensor:
        buf = self.copy_later(key, tensor)
        buf.copy_(tensor.detach(), non_blocking=self._pin and tensor.is_cuda)
        return buf

    def synchronize(self) -> None:
        if self._pin:
            torch.cuda.synchronize()
