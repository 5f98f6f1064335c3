"""The DCP files a save writes: no torch zip CRC on the save path, writeback started as it goes."""

from __future__ import annotations

import io
import threading
import zipfile

import pytest

torch = pytest.importorskip("torch")

from gpucloud.checkpoint import dcp_io  # noqa: E402
from gpucloud.checkpoint.manifest import file_digest  # noqa: E402


def _state() -> dict:
    torch.manual_seed(0)
    return {
        "model": {"w": torch.randn(512, 512), "b": torch.randn(512), "t": torch.randn(64, 32).t()},
        "meta": {"step": 7},
    }


def _zip_crcs(path, storage) -> list[int]:
    """The CRC-32 fields of every zip record of every tensor DCP stored in ``path``."""
    data = path.read_bytes()
    crcs = []
    for info in storage.values():
        if info.relative_path != path.name:
            continue
        blob = data[info.offset : info.offset + info.length]
        if blob[:4] == b"PK\x03\x04":  # a tensor (torch.save zip); bytes items are raw pickles
            crcs += [i.CRC for i in zipfile.ZipFile(io.BytesIO(blob)).infolist()]
    return crcs


def test_saved_tensors_carry_no_zip_crc_and_load_with_plain_dcp(tmp_path):
    state = _state()
    entries = dcp_io.save(state, tmp_path / "ckpt", thread_count=2)
    storage = dcp_io.read_metadata(tmp_path / "ckpt").storage_data
    crcs = [c for e in entries if e.name.endswith(".distcp") for c in _zip_crcs(tmp_path / "ckpt" / e.name, storage)]
    assert crcs and set(crcs) == {0}  # the manifest's XXH3 covers these bytes; torch's CRC was the cost
    for entry in entries:
        assert file_digest(tmp_path / "ckpt" / entry.name) == (entry.size, entry.xxh3)
    # The format stays DCP's: its own FileSystemReader (torch.load underneath) reads it.
    import torch.distributed.checkpoint as dcp

    target = {"model": {k: torch.zeros_like(v) for k, v in state["model"].items()}, "meta": {"step": 0}}
    dcp.load(target, storage_reader=dcp.FileSystemReader(tmp_path / "ckpt"), no_dist=True)
    assert all(torch.equal(target["model"][k], v) for k, v in state["model"].items())
    assert target["meta"]["step"] == 7


def test_torch_save_on_another_thread_keeps_its_crc_during_a_save():
    inside, done = threading.Event(), threading.Event()

    def writer_thread() -> None:
        with dcp_io._skipping_zip_crc():
            inside.set()
            done.wait(30)

    t = threading.Thread(target=writer_thread)
    t.start()
    try:
        assert inside.wait(30)
        buf = io.BytesIO()
        torch.save(torch.arange(1000.0), buf)  # the training script's own torch.save, meanwhile
    finally:
        done.set()
        t.join(30)
    assert all(i.CRC != 0 for i in zipfile.ZipFile(io.BytesIO(buf.getvalue())).infolist())


def test_large_writes_start_their_writeback_at_once(tmp_path, monkeypatch):
    if dcp_io._sync_file_range is None:
        pytest.skip("no sync_file_range on this platform")
    calls: list[tuple[int, int, int]] = []
    real = dcp_io._sync_file_range

    def spy(fd, offset, nbytes, flags):
        calls.append((offset, nbytes, flags))
        return real(fd, offset, nbytes, flags)

    monkeypatch.setattr(dcp_io, "_sync_file_range", spy)
    big = torch.randn(1024, 1024)  # 4 MiB: above the threshold
    entries = dcp_io.save({"model": {"w": big}}, tmp_path / "ckpt", thread_count=1)
    assert [c[2] for c in calls] == [dcp_io._SYNC_FILE_RANGE_WRITE] * len(calls)
    assert sum(n for _, n, _ in calls) >= big.numel() * 4
    data_file = next(e for e in entries if e.name.endswith(".distcp"))
    assert all(offset + n <= data_file.size for offset, n, _ in calls)
