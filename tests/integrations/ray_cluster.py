"""Test-only: a multi-raylet Ray cluster on this machine, each node with its own IMDS emulator and
(optionally) gpucloud's NoticeDrainer, and a TorchTrainer run of ``ray_train_fn.train_func``.
Shared by tests/integrations/test_ray_spot.py and benchmarks/bench_ray.py."""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.helpers import waiting

from gpucloud.integrations.ray.drain import GcsDrain, NoticeDrainer
from gpucloud.offline.emulator_control import EmulatorControl
from gpucloud.offline.imds_emulator import ImdsEmulator
from gpucloud.signals.hub import SignalHub

ROOT = Path(__file__).resolve().parents[2]
# Ray Train's watcher polls draining nodes every 5 s by default, and its controller polls the
# worker group (finished, failed, preempted) every 2 s; the tests poll both faster.
RAY_ENV = {
    "RAY_TRAIN_PREEMPTION_POLL_INTERVAL_S": "0.5",
    "RAY_TRAIN_HEALTH_CHECK_INTERVAL_S": "0.5",
    "RAY_DEDUP_LOGS": "0",
}


def wait_for(what: str, condition: Callable[[], Any], timeout: float = 120.0, every: float = 0.05) -> Any:
    """The shared wait (``tests/helpers/waiting.py``), called with what is awaited first, as the Ray tests do."""
    return waiting.wait_for(condition, timeout, what, every=every)


class Node:
    def __init__(self, raylet: Any, emulator: ImdsEmulator, drainer: NoticeDrainer | None) -> None:
        self.raylet = raylet
        self.emulator = emulator
        self.drainer = drainer

    @property
    def node_id(self) -> str:
        return self.raylet.node_id

    def notice(self, lead_seconds: float) -> dict[str, Any]:
        return EmulatorControl(self.emulator.endpoint).spot_interruption(lead_seconds=lead_seconds)


class RayNodes:
    """Head (no CPUs: GCS and Ray Train's controller) plus worker nodes of one CPU each."""

    def __init__(self) -> None:
        from ray.cluster_utils import Cluster

        os.environ.update(RAY_ENV)
        paths = [str(ROOT / "src"), str(ROOT), os.environ.get("PYTHONPATH", "")]
        os.environ["PYTHONPATH"] = os.pathsep.join(p for p in paths if p)  # the workers import tests.*
        self.cluster = Cluster(
            initialize_head=True, connect=False, head_node_args={"num_cpus": 0, "include_dashboard": False}
        )
        self.drain = GcsDrain(self.cluster.gcs_address)
        self.nodes: list[Node] = []

    def add(self, *, drainer: bool = True) -> Node:
        raylet = self.cluster.add_node(num_cpus=1)
        emulator = ImdsEmulator()
        emulator.start()
        watcher = None
        if drainer:
            hub = SignalHub()
            hub.add_imds(emulator.endpoint, interval=0.2)
            watcher = NoticeDrainer(raylet.node_id, self.drain, hub).start()
        node = Node(raylet, emulator, watcher)
        self.nodes.append(node)
        return node

    def alive_workers(self) -> int:
        return len(self.nodes)

    def reclaim(self, node: Node) -> None:
        """What EC2 does at the notice's deadline: the instance is gone."""
        if node.drainer is not None:
            node.drainer.stop()
        node.emulator.stop()
        self.nodes.remove(node)
        try:
            self.cluster.remove_node(node.raylet, allow_graceful=False)
        except Exception:  # noqa: BLE001 - a drained idle raylet may have exited on its own
            pass

    def shutdown(self) -> None:
        for node in list(self.nodes):
            if node.drainer is not None:
                node.drainer.stop()
            node.emulator.stop()
        self.nodes.clear()
        self.cluster.shutdown()


def trainer(config: dict[str, Any], storage: Path, name: str, *, max_failures: int) -> Any:
    from ray.train import FailureConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchConfig, TorchTrainer
    from tests.integrations.ray_train_fn import train_func

    return TorchTrainer(
        train_func,
        train_loop_config=config,
        torch_config=TorchConfig(backend="gloo"),
        scaling_config=ScalingConfig(num_workers=2, use_gpu=False, resources_per_worker={"CPU": 1}),
        run_config=RunConfig(
            name=name,
            storage_path=str(storage),
            failure_config=FailureConfig(max_failures=max_failures, max_preemption_failures=-1),
        ),
    )


class Run(threading.Thread):
    """``trainer.fit()`` on a thread of this (driver) process, so the test can act meanwhile."""

    def __init__(self, the_trainer: Any) -> None:
        super().__init__(daemon=True)
        self.trainer = the_trainer
        self.result: Any = None
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            self.result = self.trainer.fit()
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            self.error = exc

    def outcome(self, timeout: float) -> Any:
        self.join(timeout)
        if self.is_alive():
            raise AssertionError(f"training did not finish within {timeout:.0f}s")
        if self.error is not None:
            raise self.error
        return self.result


def events(logdir: Path) -> list[dict[str, Any]]:
    path = logdir / "events.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def config(logdir: Path, checkpoint_uri: Path, *, integration: bool, pause_at: int | None, **over: Any) -> dict:
    logdir.mkdir(parents=True, exist_ok=True)
    base = {
        "logdir": str(logdir),
        "checkpoint_uri": str(checkpoint_uri),
        "job_id": "ray-run",
        "integration": integration,
        "pause_at": pause_at,
        "steps": 40,
        "every": 4,
        "step_seconds": 0.1,
    }
    return {**base, **over}


class Interrupted:
    """One interrupted run: its events, and when the test announced, drained and reclaimed."""

    def __init__(self, logdir: Path, notice_at: float, drained_at: float | None, deadline: float, reclaimed_at: float):
        self.logdir = logdir
        self.events = events(logdir)
        self.notice_at = notice_at
        self.drained_at = drained_at
        self.deadline = deadline
        self.reclaimed_at = reclaimed_at

    def of(self, kind: str) -> list[dict[str, Any]]:
        return [e for e in self.events if e["event"] == kind]

    def _later_runs(self) -> set[str]:
        """The worker runs that started after the notice: the restarted group."""
        return {e["run"] for e in self.of("start") if e["t"] > self.notice_at}

    @property
    def restarts(self) -> list[dict[str, Any]]:
        return [e for e in self.of("start") if e["run"] in self._later_runs()]

    @property
    def trained_before_restart(self) -> int:
        return max(e["step"] for e in self.of("step") if e["run"] not in self._later_runs())


def _of(logdir: Path, kind: str) -> list[dict[str, Any]]:
    return [e for e in events(logdir) if e["event"] == kind]


def interrupted_run(
    nodes: RayNodes, base: Path, *, lead_seconds: float, integration: bool = True, pause_at: int = 10, **over: Any
) -> Interrupted:
    """Train until the pause, announce a spot interruption on the node of rank 1, let training go
    on, reclaim the node at the notice's deadline (as EC2 does) and wait for the run to finish."""
    while len(nodes.nodes) < 3:
        nodes.add(drainer=integration)  # the spare node the restarted group moves to
    logdir = base / "log"
    cfg = config(logdir, base / "ckpt", integration=integration, pause_at=pause_at, **over)
    run = Run(trainer(cfg, base / "ray", "spot", max_failures=0 if integration else 1))
    run.start()
    wait_for(f"the pause at step {pause_at}", lambda: (logdir / "paused").exists(), timeout=300)
    rank1_node = next(e["node"] for e in events(logdir) if e["event"] == "start" and e["rank"] == 1)
    node = next(n for n in nodes.nodes if n.node_id == rank1_node)
    notice_at = time.time()
    node.notice(lead_seconds=lead_seconds)
    deadline = notice_at + lead_seconds
    drained_at = None
    if node.drainer is not None:
        drainer = node.drainer
        drain = wait_for("the drain of the noticed node", lambda: drainer.sent and drainer.sent[0])
        drained_at, deadline = drainer.sent_at[0], drain.deadline_ms / 1000
    (logdir / "gate").write_text("go")
    if integration:
        # Every worker has handled the preemption (saved, or logged that it cannot) before the node
        # goes, so the test is deterministic; EC2 itself does not wait, which the lead covers.
        wait_for("the preemption at every rank", lambda: len(_of(logdir, "preempted")) == 2, timeout=120)
    wait_for("the notice's deadline", lambda: time.time() >= deadline, timeout=lead_seconds + 60)
    reclaimed_at = time.time()
    nodes.reclaim(node)
    run.outcome(timeout=600)
    return Interrupted(logdir, notice_at, drained_at, deadline, reclaimed_at)
