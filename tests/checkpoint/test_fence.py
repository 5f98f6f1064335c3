"""The commit fence: an attempt that no longer holds the job can never replace
LATEST, on a file system and on S3. A newer attempt claims the job in LATEST when it restores;
an older one still running is refused at its next commit and stops."""

from __future__ import annotations

import threading

import boto3
import pytest

from gpucloud.checkpoint import latest
from gpucloud.checkpoint.session import CheckpointFencedError
from gpucloud.checkpoint.store import CheckpointStore, FencedError

S3_URI = "s3://ckpt-bucket/runs"


def _latest_bytes(uri: str, tmp_path) -> bytes:
    if uri.startswith("s3://"):
        return boto3.client("s3").get_object(Bucket="ckpt-bucket", Key="runs/job/LATEST")["Body"].read()
    return (tmp_path / "ck" / "job" / "LATEST").read_bytes()


@pytest.fixture(params=["fs", "s3"])
def uri(request, tmp_path):
    if request.param == "s3":
        request.getfixturevalue("moto_s3")
        return S3_URI
    return str(tmp_path / "ck")


def _attempt(monkeypatch, tiny_job, uri, tmp_path, attempt: int, **kw):
    monkeypatch.setenv("GPUCLOUD_ATTEMPT", str(attempt))
    return tiny_job(uri, local_dir=str(tmp_path / f"nvme-{attempt}"), **kw)


def test_a_fenced_out_attempt_cannot_replace_latest(uri, tmp_path, monkeypatch, tiny_job):
    old = _attempt(monkeypatch, tiny_job, uri, tmp_path, 1, every_steps=2)
    assert old.session.restore() == 0
    for step in range(4):
        old.train_step()
        old.session.step_done(step + 1)
    old.session.wait()
    assert latest.parse(_latest_bytes(uri, tmp_path), "x").step == 4

    new = _attempt(monkeypatch, tiny_job, uri, tmp_path, 2)
    assert new.session.restore() == 4  # the lease passed on: attempt 2 holds the job now
    held = _latest_bytes(uri, tmp_path)
    assert latest.parse(held, "x").attempt == 2

    old.train_step()
    with pytest.raises(CheckpointFencedError, match="attempt 1 of job job no longer holds it: attempt 2 took it over"):
        old.session.save_now(5)
    assert _latest_bytes(uri, tmp_path) == held, "LATEST unchanged"
    assert CheckpointStore(uri, "job", local_dir=str(tmp_path / "probe")).committed_durable() == [2, 4]


def test_an_async_save_that_is_fenced_out_stops_the_attempt(tmp_path, monkeypatch, tiny_job):
    uri = str(tmp_path / "ck")
    old = _attempt(monkeypatch, tiny_job, uri, tmp_path, 1, every_steps=1)
    old.session.restore()
    _attempt(monkeypatch, tiny_job, uri, tmp_path, 2).session.restore()
    old.train_step()
    old.session.step_done(1)  # starts an asynchronous save that will be refused
    with pytest.raises(CheckpointFencedError, match="not committed: attempt 1 of job job no longer holds it"):
        old.session.wait()
    assert latest.parse(_latest_bytes(uri, tmp_path), "x") == latest.LatestRecord(step=None, attempt=2)


def test_an_older_attempt_cannot_start_after_a_newer_one(uri, tmp_path, monkeypatch, tiny_job):
    _attempt(monkeypatch, tiny_job, uri, tmp_path, 3).session.restore()
    with pytest.raises(FencedError, match="attempt 2 of job job no longer holds it: attempt 3 took it over"):
        _attempt(monkeypatch, tiny_job, uri, tmp_path, 2).session.restore()


def test_a_session_outside_spot_train_is_not_fenced_and_keeps_the_holder(tmp_path, monkeypatch, tiny_job):
    uri = str(tmp_path / "ck")
    _attempt(monkeypatch, tiny_job, uri, tmp_path, 4).session.restore()
    monkeypatch.delenv("GPUCLOUD_ATTEMPT")
    tiny_job(uri, every_steps=2).run(2)
    record = latest.parse(_latest_bytes(uri, tmp_path), "x")
    assert (record.step, record.attempt) == (2, 4)


def test_s3_commit_loses_the_race_to_a_claim_made_between_its_read_and_its_write(moto_s3, tmp_path):
    """The conditional put: a newer attempt claims the job after the commit read LATEST (while
    the manifest goes up); the commit's put fails its If-Match, re-reads, and is refused."""
    old = CheckpointStore(S3_URI, "job", local_dir=str(tmp_path / "a"))
    new = CheckpointStore(S3_URI, "job", local_dir=str(tmp_path / "b"))
    old.claim(1)
    with pytest.raises(FencedError, match="refusing to commit step-8"):
        old.commit_durable(8, b"{}", 1, publish=lambda: new.claim(2))
    assert latest.parse(_latest_bytes(S3_URI, tmp_path), "x") == latest.LatestRecord(step=None, attempt=2)


def test_fs_commit_and_claim_are_serialised_by_the_lock(tmp_path):
    """On a file system the commit holds the job's lock from reading LATEST to replacing it: a
    claim arriving meanwhile waits, then sees the commit (never the other way round)."""
    uri = str(tmp_path / "ck")
    old, new = CheckpointStore(uri, "job"), CheckpointStore(uri, "job")
    old.claim(1)
    claimer = threading.Thread(target=new.claim, args=(2,))

    def publish() -> None:
        claimer.start()
        claimer.join(timeout=0.5)
        assert claimer.is_alive(), "the claim got past the lock held by the commit"

    old.commit_durable(8, b"{}", 1, publish=publish)
    claimer.join()
    record = latest.parse(_latest_bytes(uri, tmp_path), "x")
    assert (record.step, record.attempt) == (8, 2)


class _ThreadRanks:
    """Two ranks as threads with the collectives commit() uses; ``on_first_barrier`` runs once, on
    rank 0, between the fence pre-check and the commit (where a newer attempt's claim can land)."""

    def __init__(self, world_size: int, on_first_barrier) -> None:
        self.world_size = world_size
        self._barrier = threading.Barrier(world_size, timeout=60)
        self._slots: list[object] = [None] * world_size
        self._hook = on_first_barrier

    def rank_view(self, rank: int):
        ranks = self

        class View:
            is_node_leader = rank == 0
            world_size = ranks.world_size

            def __init__(self) -> None:
                self.rank = rank

            def all_gather_object(self, obj: object) -> list[object]:
                ranks._barrier.wait()
                ranks._slots[rank] = obj
                ranks._barrier.wait()
                out = list(ranks._slots)
                ranks._barrier.wait()
                return out

            def barrier(self) -> None:
                if rank == 0 and ranks._hook is not None:
                    hook, ranks._hook = ranks._hook, None
                    hook()
                ranks._barrier.wait()

        return View()


def test_every_rank_learns_that_rank_0_was_fenced_at_commit(tmp_path):
    from gpucloud.checkpoint import commit as protocol
    from gpucloud.checkpoint.manifest import FileEntry, file_digest

    uri = str(tmp_path / "ck")
    store = CheckpointStore(uri, "job")
    store.claim(1)
    ranks = _ThreadRanks(2, on_first_barrier=lambda: CheckpointStore(uri, "job").claim(2))
    ctx = protocol.SaveContext(store, 6, "a1", 1, attempt_token=1)
    ctx.staging.mkdir(parents=True)
    outcomes: dict[int, BaseException | None] = {}

    def run(rank: int) -> None:
        name = f"__{rank}_0.distcp"
        (ctx.staging / name).write_bytes(bytes([rank]) * 10)
        size, digest = file_digest(ctx.staging / name)
        try:
            protocol.commit(ctx, [FileEntry(name=name, size=size, xxh3=digest)], ranks.rank_view(rank))
            outcomes[rank] = None
        except BaseException as exc:  # noqa: BLE001 - recorded for the assertions
            outcomes[rank] = exc

    threads = [threading.Thread(target=run, args=(r,)) for r in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not any(t.is_alive() for t in threads), "a rank is stuck at a barrier"
    assert all(isinstance(outcomes[r], FencedError) for r in range(2)), outcomes
    assert "refusing to commit step-6" in str(outcomes[1])
    assert latest.parse(_latest_bytes(uri, tmp_path), "x") == latest.LatestRecord(step=None, attempt=2)
    assert not (tmp_path / "ck" / "job" / "step-6").exists(), "the step stays uncommitted"
