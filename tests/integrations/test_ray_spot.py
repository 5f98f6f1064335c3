"""Ray Train on spot with gpucloud (docs/ray.md), against real Ray: a multi-raylet cluster on this
machine, a TorchTrainer with gloo on CPU workers, each node with its own IMDS emulator and
gpucloud's NoticeDrainer. One cluster for the module; each test adds the spare node it needs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("ray.train.torch")

import ray
import torch
from tests.integrations import ray_cluster as rc

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


def test_a_notice_on_one_node_saves_the_agreed_step_and_the_group_restarts_from_it(nodes, reference, tmp_path):
    run = rc.interrupted_run(nodes, tmp_path, lead_seconds=15)
    preempted = run.of("preempted")
    assert sorted(e["rank"] for e in preempted) == [0, 1], f"not every worker handled the preemption: {preempted}"
    agreed = {e["step"] for e in preempted}
    assert len(agreed) == 1, f"the ranks saved different steps: {preempted}"
    step = agreed.pop()
    assert {e["committed"] for e in preempted} == {step}, preempted
    assert {e["step"] for e in run.restarts} == {step}, f"restarted from {run.restarts}, committed {step}"
    assert run.trained_before_restart - step <= 1, f"trained to {run.trained_before_restart}, resumed at {step}"
    assert _bitwise_equal(_final(run.logdir), reference)


def test_a_notice_with_too_little_time_left_uses_the_last_committed_checkpoint(nodes, reference, tmp_path):
    run = rc.interrupted_run(nodes, tmp_path, lead_seconds=1)
    preempted = run.of("preempted")
    assert sorted(e["rank"] for e in preempted) == [0, 1], f"not every worker handled the preemption: {preempted}"
    assert all(e["committed"] is None and "not saving" in (e["skipped"] or "") for e in preempted), preempted
    step = preempted[0]["step"]
    resumed = {e["step"] for e in run.restarts}
    assert len(resumed) == 1, run.restarts
    (resumed_at,) = resumed
    # The notice may fall on a periodic save's step (every 4): then that save is the last commit and
    # nothing is lost; otherwise the run goes back to the last periodic save before the notice.
    assert 0 < resumed_at <= step and resumed_at % 4 == 0, f"resumed at {resumed_at}, preempted at {step}"
    assert resumed_at >= max(e["last_committed"] or 0 for e in preempted)
    assert _bitwise_equal(_final(run.logdir), reference)


def _spot_train(home: Path, ray_address: str, *args: str, **settings) -> subprocess.Popen:
    env = {
        **os.environ,
        "GPUCLOUD_HOME": str(home),
        "RAY_ADDRESS": ray_address,
        "GPUCLOUD_TEST_RAY_CONFIG": json.dumps(settings),
    }
    gpucloud = [sys.executable, "-m", "gpucloud"]
    return subprocess.Popen([*gpucloud, "spot-train", "--no-imds", *args], env=env, cwd=rc.ROOT, text=True)


def test_a_lost_cluster_requeues_the_run_and_it_resumes_from_the_same_checkpoint(nodes, reference, tmp_path):
    from gpucloud.checkpoint.store import latest_committed

    logdir, ckpt = tmp_path / "log", tmp_path / "ckpt"
    settings = {
        "config": rc.config(logdir, ckpt, integration=True, pause_at=10),
        "storage": str(tmp_path / "ray"),
    }
    doomed = rc.RayNodes()  # a cluster of its own, lost whole while attempt 1 trains on it
    try:
        for _ in range(2):
            doomed.add(drainer=False)
        driver = [sys.executable, "-m", "gpucloud.integrations.ray.driver", "--lost-after", "5", "--"]
        driver += [sys.executable, str(rc.ROOT / "tests" / "integrations" / "ray_driver.py")]
        first = _spot_train(
            tmp_path,
            doomed.cluster.address,
            "--job-id",
            "ray-lost",
            "--checkpoint-uri",
            str(ckpt),
            "--",
            *driver,
            **settings,
        )
        rc.wait_for("attempt 1 at its pause", lambda: (logdir / "paused").exists(), timeout=300)
        committed = 8  # the periodic save (every 4 steps) before the pause at step 10
        rc.wait_for("the periodic commit", lambda: latest_committed(str(ckpt), "ray-lost") == committed)
    finally:
        doomed.shutdown()  # every node, head included: the whole cluster is gone
    assert first.wait(timeout=120) == 75, "a lost cluster must requeue the run (spot-train exits 75)"
    second = _spot_train(tmp_path, nodes.cluster.address, "--job-id", "ray-lost", **settings)
    assert second.wait(timeout=400) == 0
    resumed = [e for e in rc.events(logdir) if e["event"] == "start" and e["step"] > 0]
    assert {e["step"] for e in resumed} == {committed}, resumed
    assert _bitwise_equal(_final(logdir), reference)
