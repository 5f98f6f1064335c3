"""Ray Train on spot with gpucloud (docs/ray.md), against real Ray: a multi-raylet cluster on this
machine, a TorchTrainer with gloo on CPU workers, each node with its own IMDS emulator and
gpucloud's NoticeDrainer. One cluster for the module; each test adds the spare node it needs."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

pytest.importorskip("ray.train.torch")

import ray  # noqa: E402
import torch  # noqa: E402

from tests.integrations import ray_cluster as rc  # noqa: E402

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def nodes():
    cluster = rc.RayNodes()
    for _ in range(3):
        cluster.add()
    ray.init(address=cluster.cluster.address, logging_level="WARNING", log_to_driver=False)
    yield cluster
    ray.shutdown()
    cluster.shutdown()


@pytest.fixture(scope="module")
def reference(nodes, tmp_path_factory) -> dict[str, torch.Tensor]:
    """The final weights of an uninterrupted run of the same function."""
    base = tmp_path_factory.mktemp("ray-reference")
    cfg = rc.config(base / "log", base / "ckpt", integration=True, pause_at=None)
    rc.Run(rc.trainer(cfg, base / "ray", "reference", max_failures=0)).start()
    return _final(base / "log")


def _final(logdir: Path, timeout: float = 300) -> dict[str, torch.Tensor]:
    rc.wait_for("the final weights", lambda: (logdir / "final.pt").exists(), timeout=timeout)
    return torch.load(logdir / "final.pt", weights_only=True)


def _bitwise_equal(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def _interrupt(nodes: rc.RayNodes, tmp_path: Path, *, lead_seconds: float) -> tuple[list[dict], Path]:
    """Train until the pause, announce a spot interruption on the node of rank 1, open the gate,
    reclaim the node at the notice's deadline (as EC2 does), and return the run's events."""
    while len(nodes.nodes) < 3:
        nodes.add()  # the spare node the restarted group moves to
    logdir = tmp_path / "log"
    cfg = rc.config(logdir, tmp_path / "ckpt", integration=True, pause_at=10)
    run = rc.Run(rc.trainer(cfg, tmp_path / "ray", "spot", max_failures=0))
    run.start()
    rc.wait_for("the pause at step 10", lambda: (logdir / "paused").exists(), timeout=300)
    starts = [e for e in rc.events(logdir) if e["event"] == "start"]
    rank1_node = next(e["node"] for e in starts if e["rank"] == 1)
    node = next(n for n in nodes.nodes if n.node_id == rank1_node)
    node.notice(lead_seconds=lead_seconds)
    assert node.drainer is not None
    drain = rc.wait_for("the drain of the noticed node", lambda: node.drainer.sent and node.drainer.sent[0])
    (logdir / "gate").write_text("go")
    rc.wait_for("the preemption at every rank", lambda: len(_of(logdir, "preempted")) == 2, timeout=120)
    rc.wait_for("the notice's deadline", lambda: time.time() * 1000 >= drain.deadline_ms, timeout=120)
    nodes.reclaim(node)
    run.outcome(timeout=300)
    return rc.events(logdir), logdir


def _of(logdir: Path, kind: str) -> list[dict]:
    return [e for e in rc.events(logdir) if e["event"] == kind]


def test_a_notice_on_one_node_saves_the_agreed_step_and_the_group_restarts_from_it(nodes, reference, tmp_path):
    events, logdir = _interrupt(nodes, tmp_path, lead_seconds=15)
    preempted = [e for e in events if e["event"] == "preempted"]
    agreed = {e["step"] for e in preempted}
    assert len(agreed) == 1, f"the ranks saved different steps: {preempted}"
    step = agreed.pop()
    assert {e["committed"] for e in preempted} == {step}, preempted
    first_run = {e["run"] for e in preempted}
    trained = max(e["step"] for e in events if e["event"] == "step" and e["run"] in first_run)
    restarts = [e for e in events if e["event"] == "start" and e["run"] not in first_run and e["step"] > 0]
    assert {e["step"] for e in restarts} == {step}, f"restarted from {restarts}, committed {step}"
    assert trained - step <= 1, f"trained to {trained}, resumed at {step}"
    assert _bitwise_equal(_final(logdir), reference)


def test_a_notice_with_too_little_time_left_uses_the_last_committed_checkpoint(nodes, reference, tmp_path):
    events, logdir = _interrupt(nodes, tmp_path, lead_seconds=1)
    preempted = [e for e in events if e["event"] == "preempted"]
    assert preempted and all(e["committed"] is None and "not saving" in (e["skipped"] or "") for e in preempted)
    step = preempted[0]["step"]
    first_run = {e["run"] for e in preempted}
    restarts = [e for e in events if e["event"] == "start" and e["run"] not in first_run]
    resumed = {e["step"] for e in restarts}
    assert len(resumed) == 1, restarts
    (resumed_at,) = resumed
    assert 0 < resumed_at < step and resumed_at % 4 == 0, f"resumed at {resumed_at}, preempted at {step}"
    assert resumed_at >= max(e["last_committed"] or 0 for e in preempted)
    assert _bitwise_equal(_final(logdir), reference)
