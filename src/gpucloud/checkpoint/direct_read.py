"""A DCP storage reader that reads each tensor's bytes straight into the tensor it restores.

DCP's ``FileSystemReader`` hands every stored tensor to ``torch.load``, which allocates a new
tensor, reads the bytes into it, and then copies it into the state dict's tensor: two copies and
a fresh allocation (page faults) per tensor. The files are DCP's own (each tensor a small
``torch.save`` zip with its bytes stored uncompressed), so the record holding a tensor's bytes can
be located from the zip's directory, and read with ``readinto`` into the destination's memory.

Each file is read front to back, once. Given the manifest's entries, it also hashes every byte as
it passes (zip headers and items this rank does not need included), so a verified restore costs
the hash on top of the read, not a second read of every file.

Anything this reader does not recognise (a compressed record, more than one storage, a pickle that
is not a plain tensor, a big-endian file) is read the way DCP reads it, with ``torch.load``.
"""

from __future__ import annotations

import collections
import ctypes
import io
import os
import pickle
import threading
import zipfile
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, cast

import torch
from torch.distributed._shard._utils import narrow_tensor_by_index
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint.planner import LoadItemType, LoadPlan, LoadPlanner, ReadItem
from torch.futures import Future

from gpucloud.checkpoint.manifest import FileEntry, ManifestError, new_hasher

_CHUNK = 16 * 1024 * 1024
_LOCAL_HEADER = 30  # bytes of a zip local file header before its name and extra field


@dataclass(frozen=True)
class _Record:
    """Where a stored tensor's bytes are, and how the tensor lies on them."""

    start: int  # absolute offset of the storage's first byte in the file
    nbytes: int
    dtype: torch.dtype
    storage_offset: int
    size: tuple[int, ...]
    stride: tuple[int, ...]


class _StorageRef:
    def __init__(self, dtype: torch.dtype, key: str, numel: int) -> None:
        self.dtype, self.key, self.numel = dtype, key, numel


class _Desc:
    def __init__(self, storage: _StorageRef, storage_offset: int, size, stride, *_ignored) -> None:
        self.storage, self.storage_offset = storage, int(storage_offset)
        self.size, self.stride = tuple(int(s) for s in size), tuple(int(s) for s in stride)


class _StorageType:
    def __init__(self, name: str) -> None:
        # torch's own name -> dtype table (what torch.load uses); touching torch.FloatStorage
        # itself would print TypedStorage's deprecation warning.
        from torch.storage import _get_dtype_from_pickle_storage_type

        try:
            self.dtype = _get_dtype_from_pickle_storage_type(name)
        except KeyError:
            raise pickle.UnpicklingError(f"unknown storage type {name}") from None


class _TensorPickle(pickle.Unpickler):
    """Reads only what ``torch.save`` writes for one plain tensor: nothing is constructed but
    these descriptions (any other global refuses, and the caller falls back to torch.load)."""

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) == ("torch._utils", "_rebuild_tensor_v2"):
            return _Desc
        if (module, name) == ("collections", "OrderedDict"):
            return collections.OrderedDict
        if module == "torch" and name.endswith("Storage"):
            return _StorageType(name)
        raise pickle.UnpicklingError(f"{module}.{name}")

    def persistent_load(self, pid: Any) -> Any:
        kind, storage_type, key, _location, numel = pid
        if kind != "storage" or not isinstance(storage_type, _StorageType):
            raise pickle.UnpicklingError("not a storage")
        return _StorageRef(storage_type.dtype, str(key), int(numel))


class _Window(io.RawIOBase):
    """A read-only view of ``[start, start + length)`` of a file, by pread (no shared position)."""

    def __init__(self, fd: int, start: int, length: int) -> None:
        super().__init__()
        self._fd, self._start, self._length, self._pos = fd, start, length, 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = 0) -> int:
        base = {0: 0, 1: self._pos, 2: self._length}[whence]
        self._pos = max(0, base + offset)
        return self._pos

    def readinto(self, b) -> int:
        view = memoryview(b).cast("B")
        n = max(0, min(view.nbytes, self._length - self._pos))
        data = os.pread(self._fd, n, self._start + self._pos) if n else b""
        view[: len(data)] = data
        self._pos += len(data)
        return len(data)


def locate_tensor(fd: int, offset: int, length: int) -> _Record | None:
    """The record of the ``torch.save`` zip at ``[offset, offset + length)`` that holds the
    tensor's bytes; None when it is not one plain, uncompressed, little-endian tensor.

    Records are read by their offsets, not through ``zipfile``'s reader: the files we write carry
    no zip CRC (the manifest's XXH3 checks them), which ``zipfile`` would refuse."""
    try:
        with zipfile.ZipFile(cast(Any, _Window(fd, offset, length))) as archive:
            infos = archive.infolist()
        pkl = [i for i in infos if i.filename.endswith("/data.pkl")]
        order = [i for i in infos if i.filename.endswith("/byteorder")]
        if len(pkl) != 1 or any(i.compress_type != zipfile.ZIP_STORED for i in infos):
            return None
        if order and os.pread(fd, order[0].file_size, _data_start(fd, offset, order[0])) != b"little":
            return None
        pickled = os.pread(fd, pkl[0].file_size, _data_start(fd, offset, pkl[0]))
        desc = _TensorPickle(io.BytesIO(pickled)).load()
        if not isinstance(desc, _Desc):
            return None
        prefix = pkl[0].filename[: -len("data.pkl")]
        data = [i for i in infos if i.filename.startswith(prefix + "data/")]
        if len(data) != 1 or data[0].filename != f"{prefix}data/{desc.storage.key}":
            return None
        info = data[0]
        start = _data_start(fd, offset, info)
        itemsize = torch.empty((), dtype=desc.storage.dtype).element_size()
        if info.file_size != desc.storage.numel * itemsize or start + info.file_size > offset + length:
            return None
        return _Record(start, info.file_size, desc.storage.dtype, desc.storage_offset, desc.size, desc.stride)
    except (zipfile.BadZipFile, pickle.UnpicklingError, ValueError, TypeError, EOFError, OSError, KeyError):
        return None


def _data_start(fd: int, offset: int, info: zipfile.ZipInfo) -> int:
    """Absolute offset of a stored record's first byte: after its local header, name and extra."""
    header = os.pread(fd, _LOCAL_HEADER, offset + info.header_offset)
    if len(header) != _LOCAL_HEADER or header[:4] != b"PK\x03\x04":
        raise ValueError("no local zip header")
    name_len = int.from_bytes(header[26:28], "little")
    extra_len = int.from_bytes(header[28:30], "little")
    return offset + info.header_offset + _LOCAL_HEADER + name_len + extra_len


def _buffer(tensor: torch.Tensor) -> memoryview:
    """A writable byte view of a contiguous CPU tensor's memory (any dtype, bf16 included)."""
    nbytes = tensor.numel() * tensor.element_size()
    return memoryview((ctypes.c_char * nbytes).from_address(tensor.data_ptr())).cast("B")


def _is_whole_contiguous(record: _Record, target: torch.Tensor, req: ReadItem) -> bool:
    """The record's bytes are exactly ``target``'s: same dtype and shape, row-major, whole."""
    if not (target.device.type == "cpu" and target.is_contiguous() and target.dtype == record.dtype):
        return False
    if tuple(target.shape) != record.size or record.storage_offset != 0:
        return False
    if any(o != 0 for o in req.storage_offsets) or tuple(req.lengths) != record.size:
        return False
    return record.nbytes == target.numel() * target.element_size() and _row_major(record.size, record.stride)


def _row_major(size: tuple[int, ...], stride: tuple[int, ...]) -> bool:
    """Whether ``stride`` lays ``size`` out in C order (dimensions of size 1 may have any stride)."""
    expected = 1
    for dim, step in zip(reversed(size), reversed(stride), strict=True):
        if dim != 1 and step != expected:
            return False
        expected *= dim
    return True


class _SequentialFile:
    """Reads one file front to back; with a hasher, every byte passes through it."""

    def __init__(self, path: Path, hasher) -> None:
        self.fh = open(path, "rb", buffering=0)  # noqa: SIM115 - closed by close()
        self.pos = 0
        self.hasher = hasher
        self._scratch: bytearray | None = None

    def skip_to(self, pos: int) -> None:
        if pos < self.pos:
            raise ManifestError(f"{self.fh.name}: items overlap")
        if self.hasher is None:
            self.pos = self.fh.seek(pos)
            return
        while self.pos < pos:
            self.read_into(memoryview(self._scratch_buffer())[: min(_CHUNK, pos - self.pos)])

    def read_into(self, view: memoryview) -> None:
        done = 0
        while done < view.nbytes:
            n = self.fh.readinto(view[done:])
            if not n:
                raise ManifestError(f"{self.fh.name}: ends at byte {self.pos + done}, before its data")
            done += n
        if self.hasher is not None:
            self.hasher.update(view)
        self.pos += done

    def read_bytes(self, n: int) -> bytes:
        buf = bytearray(n)
        self.read_into(memoryview(buf))
        return bytes(buf)

    def finish(self) -> int:
        """Read (and hash) whatever is left; the file's size."""
        if self.hasher is not None:
            while True:
                n = self.fh.readinto(self._scratch_buffer())
                if not n:
                    break
                self.hasher.update(memoryview(self._scratch_buffer())[:n])
                self.pos += n
        return self.pos

    def _scratch_buffer(self) -> bytearray:
        if self._scratch is None:
            self._scratch = bytearray(_CHUNK)
        return self._scratch

    def close(self) -> None:
        self.fh.close()


class DirectReader(FileSystemReader):
    """DCP's ``FileSystemReader`` with the data path above; ``verify`` (the manifest's entries)
    makes every file it reads checked against its size and XXH3-64 in the same pass."""

    def __init__(self, path: str | os.PathLike[str], *, verify: list[FileEntry] | None = None, threads: int = 8):
        super().__init__(path)
        self._expected = None if verify is None else {e.name: e for e in verify}
        self._threads = max(1, threads)
        self._planner_lock = threading.Lock()
        self.files_read: list[str] = []

    def read_data(self, plan: LoadPlan, planner: LoadPlanner) -> Future[None]:
        per_file: dict[str, list[ReadItem]] = {}
        for req in plan.items:
            per_file.setdefault(self.storage_data[req.storage_index].relative_path, []).append(req)
        names = sorted(per_file)
        self.files_read = names
        if self._threads == 1 or len(names) <= 1:
            for name in names:
                self._read_file(name, per_file[name], planner)
        else:
            with ThreadPoolExecutor(max_workers=min(self._threads, len(names)), thread_name_prefix="dcp-read") as pool:
                for done in [pool.submit(self._read_file, n, per_file[n], planner) for n in names]:
                    done.result()
        fut: Future[None] = Future()
        fut.set_result(None)
        return fut

    def _read_file(self, name: str, reqs: list[ReadItem], planner: LoadPlanner) -> None:
        """Read one file front to back. Verifying, nothing in it is unpickled (DCP's bytes items,
        a tensor read the fallback way) before its hash matched: those run after ``finish``."""
        path = Path(self.path) / name
        expected = None if self._expected is None else self._expected.get(name)
        if self._expected is not None and expected is None:
            raise ManifestError(f"{path.parent}: DCP metadata references {name!r}, which the manifest does not list")
        stream = _SequentialFile(path, new_hasher() if expected is not None else None)
        after_check: list[Callable[[], None]] = []
        failure: Exception | None = None
        try:
            by_item: dict[Any, list[ReadItem]] = {}
            for req in reqs:
                by_item.setdefault(req.storage_index, []).append(req)
            items = sorted(by_item.items(), key=lambda kv: self.storage_data[kv[0]].offset)
            try:
                for index, item_reqs in items:
                    info = self.storage_data[index]
                    if item_reqs[0].type == LoadItemType.BYTE_IO:
                        stream.skip_to(info.offset)
                        data = stream.read_bytes(info.length)
                        after_check += [partial(self._load_bytes, planner, req, data) for req in item_reqs]
                        continue
                    self._read_tensor_item(stream, info, item_reqs, planner, after_check)
            except ManifestError:
                raise
            except Exception as exc:
                if expected is None:
                    raise
                failure = exc
            size = stream.finish()
        finally:
            stream.close()
        if expected is not None:
            assert stream.hasher is not None
            if size != expected.size:
                raise ManifestError(f"{path.parent}: {name} has {size} bytes, manifest says {expected.size}")
            if (digest := stream.hasher.hexdigest()) != expected.xxh3:
                raise ManifestError(f"{path.parent}: {name} checksum {digest} does not match manifest {expected.xxh3}")
        if failure is not None:
            raise failure
        for step in after_check:
            step()

    def _load_bytes(self, planner: LoadPlanner, req: ReadItem, data: bytes) -> None:
        with self._planner_lock:
            planner.load_bytes(req, io.BytesIO(data))

    def _read_tensor_item(
        self,
        stream: _SequentialFile,
        info: Any,
        reqs: list[ReadItem],
        planner: LoadPlanner,
        after_check: list[Callable[[], None]],
    ) -> None:
        if info.transform_descriptors:
            record = None  # an extension (e.g. compression) transformed the bytes: DCP's path
        else:
            record = locate_tensor(stream.fh.fileno(), info.offset, info.length)
        with self._planner_lock:
            targets = [planner.resolve_tensor(req).detach() for req in reqs]
        if record is None:
            stream.skip_to(info.offset)
            blob = stream.read_bytes(info.length)
            after_check.append(partial(self._torch_load_item, blob, reqs, targets, planner))
            return
        stream.skip_to(record.start)
        if len(reqs) == 1 and _is_whole_contiguous(record, targets[0], reqs[0]):
            stream.read_into(_buffer(targets[0]))  # the only copy: file -> the tensor's memory
            with self._planner_lock:
                planner.commit_tensor(reqs[0], targets[0])
            return
        raw = torch.empty(record.nbytes, dtype=torch.uint8)
        stream.read_into(_buffer(raw))
        itemsize = torch.empty((), dtype=record.dtype).element_size()
        if record.nbytes % itemsize:
            raise ValueError(f"a tensor record of {record.nbytes} bytes is not whole {record.dtype}")
        tensor = raw.view(record.dtype).as_strided(record.size, record.stride, record.storage_offset)
        for req, target in zip(reqs, targets, strict=True):
            self._commit(planner, req, target, narrow_tensor_by_index(tensor, req.storage_offsets, req.lengths))

    def _torch_load_item(self, blob: bytes, reqs: list[ReadItem], targets: list[torch.Tensor], planner) -> None:
        """DCP's own way, for a record this reader does not recognise."""
        for req, target in zip(reqs, targets, strict=True):
            loaded = torch.load(io.BytesIO(blob), map_location="cpu", weights_only=True)
            self._commit(planner, req, target, narrow_tensor_by_index(loaded, req.storage_offsets, req.lengths))

    def _commit(self, planner: LoadPlanner, req: ReadItem, target: torch.Tensor, tensor: torch.Tensor) -> None:
        if target.size() != tensor.size():
            raise AssertionError(f"req {req.storage_index} mismatch sizes {target.size()} vs {tensor.size()}")
        target.copy_(tensor)
        with self._planner_lock:
            planner.commit_tensor(req, target)
