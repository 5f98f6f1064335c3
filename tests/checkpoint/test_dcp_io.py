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


def _mixed_state() -> dict:
    torch.manual_seed(1)
    return {
        "model": {
            "f32": torch.randn(300, 200),
            "bf16": torch.randn(64, 48).to(torch.bfloat16),
            "i64": torch.arange(1000, dtype=torch.int64),
            "transposed": torch.randn(40, 30).t(),  # saved with its strides: not row-major
            "scalar": torch.tensor(3.5),
        },
        "meta": {"step": 11, "note": "bytes item"},
    }


def _zeros_like_state(state: dict) -> dict:
    return {
        "model": {k: torch.zeros_like(v) for k, v in state["model"].items()},
        "meta": {"step": 0, "note": ""},
    }


def _same(a: dict, b: dict) -> bool:
    return all(torch.equal(a["model"][k], v) for k, v in b["model"].items()) and a["meta"] == b["meta"]


def test_direct_load_matches_dcp_and_reads_tensors_without_torch_load(tmp_path, monkeypatch):
    import torch.distributed.checkpoint as dcp

    state = _mixed_state()
    entries = dcp_io.save(state, tmp_path / "ckpt", thread_count=2)
    by_dcp = _zeros_like_state(state)
    dcp.load(by_dcp, storage_reader=dcp.FileSystemReader(tmp_path / "ckpt"), no_dist=True)
    assert _same(by_dcp, state)

    loads: list[object] = []
    real_load = torch.load
    monkeypatch.setattr(torch, "load", lambda f, *a, **k: loads.append(f) or real_load(f, *a, **k))
    for verify in (None, entries):
        loads.clear()
        direct = _zeros_like_state(state)
        dcp_io.load(direct, tmp_path / "ckpt", verify=verify)
        assert _same(direct, state)
        assert len(loads) == 2  # only DCP's two bytes items (meta.step, meta.note) are pickles


def test_direct_load_into_a_non_contiguous_target(tmp_path):
    state = _mixed_state()
    dcp_io.save(state, tmp_path / "ckpt", thread_count=1)
    target = _zeros_like_state(state)
    target["model"]["f32"] = torch.zeros(200, 300).t()  # the live tensor is a transposed view
    dcp_io.load(target, tmp_path / "ckpt")
    assert _same(target, state)


def _flip_byte(path, offset: int) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0xFF
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("where", ["tensor bytes", "bytes item", "zip header"])
def test_verified_load_names_a_corrupt_file_and_unpickles_nothing_of_it(tmp_path, monkeypatch, where):
    from gpucloud.checkpoint.manifest import ManifestError

    state = _mixed_state()
    entries = dcp_io.save(state, tmp_path / "ckpt", thread_count=1)
    storage = dcp_io.read_metadata(tmp_path / "ckpt").storage_data
    if where == "bytes item":
        info = next(v for k, v in storage.items() if k.fqn == "meta.note")
        offset = info.offset + info.length - 3
    else:
        info = next(v for k, v in storage.items() if k.fqn == "model.f32")
        offset = info.offset + (info.length // 2 if where == "tensor bytes" else 2)
    _flip_byte(tmp_path / "ckpt" / info.relative_path, offset)
    unpickled: list[object] = []
    real_load = torch.load
    monkeypatch.setattr(torch, "load", lambda f, *a, **k: unpickled.append(f) or real_load(f, *a, **k))
    with pytest.raises(ManifestError, match=rf"{info.relative_path} checksum [0-9a-f]{{16}} does not match"):
        dcp_io.load(_zeros_like_state(state), tmp_path / "ckpt", verify=entries)
    assert unpickled == []


def test_verified_load_checks_files_it_does_not_read(tmp_path):
    from gpucloud.checkpoint.manifest import ManifestError

    entries = dcp_io.save({"a": torch.randn(100), "b": torch.randn(100)}, tmp_path / "ckpt", thread_count=2)
    storage = dcp_io.read_metadata(tmp_path / "ckpt").storage_data
    info_b = next(v for k, v in storage.items() if k.fqn == "b")
    info_a = next(v for k, v in storage.items() if k.fqn == "a")
    assert info_a.relative_path != info_b.relative_path
    _flip_byte(tmp_path / "ckpt" / info_b.relative_path, info_b.offset + info_b.length // 2)
    only_a = {"a": torch.zeros(100)}
    dcp_io.load(only_a, tmp_path / "ckpt")  # unverified: b's file is not read at all
    with pytest.raises(ManifestError, match=info_b.relative_path):
        dcp_io.load({"a": torch.zeros(100)}, tmp_path / "ckpt", verify=entries)


def test_a_single_process_restore_hashes_each_data_file_once_while_loading(tmp_path, monkeypatch):
    from gpucloud.checkpoint import TrainingSession, manifest

    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.Linear(64, 8))
    opt = torch.optim.AdamW(model.parameters())
    model(torch.randn(2, 64)).sum().backward()
    opt.step()
    sess = TrainingSession(model, opt, checkpoint_uri=str(tmp_path), job_id="j", writer_threads=2)
    sess.restore()
    sess.save_now(5)
    sess.finish()
    hashed_apart: list[str] = []
    real_digest = manifest.file_digest
    monkeypatch.setattr(manifest, "file_digest", lambda p: hashed_apart.append(str(p)) or real_digest(p))
    fresh = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.Linear(64, 8))
    again = TrainingSession(fresh, torch.optim.AdamW(fresh.parameters()), checkpoint_uri=str(tmp_path), job_id="j")
    assert again.restore() == 5
    again.finish()
    assert [p.rsplit("/", 1)[1] for p in hashed_apart] == [".metadata"]  # data files: hashed by the load
    assert all(torch.equal(a, b) for a, b in zip(fresh.parameters(), model.parameters(), strict=True))


def test_a_step_that_fails_its_hash_mid_load_leaves_the_previous_step_whole(tmp_path):
    from gpucloud.checkpoint import TrainingSession, load

    def build() -> torch.nn.Module:
        torch.manual_seed(3)
        return torch.nn.Sequential(torch.nn.Linear(32, 32), torch.nn.Linear(32, 4))

    model = build()
    sess = TrainingSession(model, None, checkpoint_uri=str(tmp_path), job_id="j", writer_threads=1)
    sess.restore()
    sess.save_now(2)
    step2 = {k: v.clone() for k, v in model.state_dict().items()}
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1.0)
    sess.save_now(4)
    sess.finish()
    # The last bytes of step 4's only data file: every tensor of it is read (into the model)
    # before its hash can fail.
    shard = next((tmp_path / "j" / "step-4").glob("*.distcp"))
    _flip_byte(shard, shard.stat().st_size - 1)
    fresh = build()
    with torch.no_grad():
        for p in fresh.parameters():
            p.fill_(7.0)
    assert load(str(tmp_path / "j"), fresh) == 2
    assert all(torch.equal(v, step2[k]) for k, v in fresh.state_dict().items())
