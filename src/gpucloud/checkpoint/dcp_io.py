"""PyTorch Distributed Checkpoint (DCP) I/O: tuned writers that checksum as they write, loads.

Why a custom file system under DCP's ``FileSystemWriter``: the manifest needs a checksum of every
file. Reading the files back after the save would add a second pass over every byte; hashing the
bytes as the writer threads stream them out costs only the hash itself, spread over the writer
threads.

Why torch's own zip CRC-32 is off for the files we write: DCP stores each tensor as a small
``torch.save`` zip, and ``torch.save`` computes a CRC-32 of every record by default. On the save
path that CRC was the largest single cost (about 1 GB/s of CPU per core, against ~13 GB/s for
XXH3), and it protects nothing the manifest's XXH3-64 of the whole file does not. ``torch.load``
(so DCP's own ``FileSystemReader`` too) reads such files as they are; only an external ``unzip``
of one tensor's record would complain. It is switched off only on DCP's writer threads, while
they write a checkpoint file, so a ``torch.save`` elsewhere in the process is unaffected.
"""

from __future__ import annotations

import io
import os
import sys
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
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.filesystem import FileSystem
from torch.distributed.checkpoint.metadata import Metadata

from gpucloud.checkpoint.manifest import DCP_METADATA, FileEntry, ManifestError, file_digest, new_hasher, os_reason

# DCP's default of one writer thread is 2-3x slower than the disk (benchmarks/bench_checkpoint.py
# measures it); 8 threads reached raw-write speed.
DEFAULT_WRITER_THREADS = 8

# Without a process group we pass no_dist=True on purpose (one process, its own files); torch still
# warns on every save and load, which would print once per checkpoint in a user's log. A filter
# installed once, not catch_warnings around each call: saves run on background threads, and
# catch_warnings swaps the process-wide filter list under them.
warnings.filterwarnings(
    "ignore", message=r"torch\.distributed is disabled, unavailable or uninitialized", category=UserWarning
)


_writer_thread = threading.local()

# Writes at least this large (a tensor's bytes; zip headers and pickles are tiny) start their
# writeback at once.
_WRITEBACK_MIN_BYTES = 1024 * 1024


def _load_sync_file_range():
    """libc's sync_file_range (Linux), or None where there is none."""
    import ctypes
    import ctypes.util

    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        fn = libc.sync_file_range
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]
    fn.restype = ctypes.c_int
    return fn


_sync_file_range = _load_sync_file_range()
_SYNC_FILE_RANGE_WRITE = 2  # <linux/fs.h>: start writeback of dirty pages in the range, do not wait


def start_writeback(fd: int, offset: int, nbytes: int) -> None:
    """Ask the kernel to start writing ``nbytes`` at ``offset`` of ``fd`` to disk, without
    waiting (sync_file_range(2) with SYNC_FILE_RANGE_WRITE). Not a durability guarantee: the
    fsync at the end of the file still is. Without it the page cache holds every byte until
    that fsync, and the disk idles while the file is being written."""
    if _sync_file_range is not None:
        _sync_file_range(fd, offset, nbytes, _SYNC_FILE_RANGE_WRITE)


def _install_thread_scoped_crc_switch() -> None:
    """Make ``torch.save`` skip its zip CRC-32 on a thread that is writing a checkpoint file.

    torch reads the setting through ``torch.serialization.get_crc32_options()`` each time it
    opens a zip writer; the setting itself (``set_crc32_options``) is process-wide, which would
    also change a ``torch.save`` the training script runs on another thread at the same time."""
    import torch.serialization as serialization

    original = getattr(serialization, "get_crc32_options", None)
    if original is None or getattr(original, "_gpucloud_thread_scoped", False):
        return  # an older torch without the option (it always computes the CRC), or done already

    def get_crc32_options() -> bool:
        return False if getattr(_writer_thread, "writing", False) else bool(original())

    get_crc32_options._gpucloud_thread_scoped = True  # type: ignore[attr-defined]
    serialization.get_crc32_options = get_crc32_options


_install_thread_scoped_crc_switch()


@contextmanager
def _skipping_zip_crc() -> Iterator[None]:
    previous = getattr(_writer_thread, "writing", False)
    _writer_thread.writing = True
    try:
        yield
    finally:
        _writer_thread.writing = previous


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
        written = self._raw.write(view)
        if view.nbytes >= _WRITEBACK_MIN_BYTES:
            # Start the disk on these bytes now, then hash them while it writes: the final fsync
            # then waits only for the tail instead of the whole file.
            start_writeback(self._raw.fileno(), self._size, view.nbytes)
        self._hasher.update(view)
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
            with _skipping_zip_crc():  # DCP's torch.save of each tensor runs inside this block
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


def load(state: dict[str, Any], directory: Path, *, process_group=None, verify: list[FileEntry] | None = None) -> None:
    """Load ``directory`` into ``state`` in place (resharding to this world size as needed).

    Each tensor's bytes are read straight into its tensor (``direct_read``). With ``verify`` (the
    manifest's entries), every file is checked against its size and XXH3-64 in the same pass, the
    files this process does not read included; a mismatch raises ``ManifestError`` after the
    load wrote into ``state``: the caller then loads another step over it or gives up."""
    from gpucloud.checkpoint.direct_read import DirectReader

    reader = DirectReader(directory, verify=verify)
    try:
        dcp.load(state, storage_reader=reader, process_group=process_group, no_dist=not dist.is_initialized())
    except CheckpointException as exc:  # DCP wraps every rank's failure; a bad file is ours to name
        for failure, _trace in exc.failures.values():
            if isinstance(failure, (ManifestError, OSError)):
                raise ManifestError(_one_line(failure, directory)) from None
        raise
    if verify is not None:
        unread = [e for e in verify if e.name not in reader.files_read and e.name != DCP_METADATA]
        for entry in unread:  # another rank's RNG, say: verified all the same, so the step is whole
            _check_file(directory, entry)


def _one_line(failure: BaseException, directory: Path) -> str:
    if isinstance(failure, ManifestError):
        return str(failure)
    assert isinstance(failure, OSError)
    return f"{directory}: {Path(failure.filename or '?').name} cannot be read ({os_reason(failure)})"


def _check_file(directory: Path, entry: FileEntry) -> None:
    try:
        size, digest = file_digest(directory / entry.name)
    except OSError as exc:
        raise ManifestError(f"{directory}: {entry.name} cannot be read ({os_reason(exc)})") from None
    if size != entry.size:
        raise ManifestError(f"{directory}: {entry.name} has {size} bytes, manifest says {entry.size}")
    if digest != entry.xxh3:
        raise ManifestError(f"{directory}: {entry.name} checksum {digest} does not match manifest {entry.xxh3}")


def read_metadata(directory: Path) -> Metadata:
    """DCP's metadata of a checkpoint: every flattened key with its global shape (no tensor data read)."""
    return FileSystemReader(directory).read_metadata()


def saved_keys(directory: Path) -> set[str]:
    """The flattened keys a checkpoint holds (e.g. ``rng.rank1.torch``), read from its metadata."""
    return set(read_metadata(directory).state_dict_metadata.keys())


class StagingCache:
    """Copies state into CPU buffers that are reused from save to save.

    Fresh allocation per save (what ``clone()`` does) is ~7x slower than copying into existing
    buffers; on GPU hosts the buffers are pinned so the
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
