"""The driver's side: a lost Ray cluster becomes a requeue, not a crash.

Ray restarts the worker group when one node goes; when the whole cluster goes (every node
reclaimed, or the head node), the driver is left with a GCS that never answers, and Ray's core
worker ends the process after ``gcs_rpc_server_reconnect_timeout_s`` (60 s by default) with a
code ``gpucloud spot-train`` reads as a crash. ``fit_or_requeue`` runs ``trainer.fit()`` and, when
the GCS stays unreachable for ``lost_after`` seconds (or ``fit`` fails because the cluster is gone),
exits 75: spot-train then requeues the run, and its next attempt, on a new cluster, resumes from
the checkpoint the workers committed to the gpucloud store.

    ray.init(address="auto")
    result = fit_or_requeue(TorchTrainer(train_func, ...))
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import ray

from gpucloud import jobenv

log = logging.getLogger("gpucloud.integrations.ray")


def cluster_reachable(gcs_address: str, *, timeout: float = 2.0) -> bool:
    """Whether the cluster's GCS answers within ``timeout`` seconds."""
    try:
        import ray._raylet

        ray._raylet.GcsClient(address=gcs_address).get_all_node_info(timeout=timeout)
    except Exception:  # noqa: BLE001 - any failure to answer is "not reachable"
        return False
    return True


class ClusterWatch:
    """Calls ``on_lost`` once when the GCS has not answered for ``lost_after`` seconds."""

    def __init__(
        self,
        gcs_address: str,
        on_lost: Callable[[float], None],
        *,
        lost_after: float = 15.0,
        every: float = 1.0,
        reachable: Callable[[str], bool] = cluster_reachable,
    ) -> None:
        if not (lost_after > 0 and every > 0):
            raise ValueError(f"lost_after and every must be > 0 seconds, got {lost_after} and {every}")
        self.gcs_address = gcs_address
        self._on_lost = on_lost
        self.lost_after = lost_after
        self.every = every
        self._reachable = reachable
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="gpucloud-ray-cluster-watch", daemon=True)

    def start(self) -> ClusterWatch:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        last_ok = time.monotonic()
        while not self._stop.wait(self.every):
            if self._reachable(self.gcs_address):
                last_ok = time.monotonic()
            elif time.monotonic() - last_ok >= self.lost_after:
                self._on_lost(time.monotonic() - last_ok)
                return


def _exit_requeued(silent_for: float) -> None:
    log.error(
        "the Ray cluster is gone (its GCS has not answered for %.0fs): exiting %d so gpucloud spot-train "
        "requeues the run; it resumes from the last committed checkpoint",
        silent_for,
        jobenv.EXIT_REQUEUED,
    )
    for handler in logging.getLogger().handlers:
        handler.flush()
    sys.stderr.flush()
    # Not SystemExit: the main thread is blocked inside Ray, whose core worker would end the
    # process with its own code once its reconnect timeout ran out.
    os._exit(jobenv.EXIT_REQUEUED)


def fit_or_requeue(trainer: Any, *, lost_after: float = 15.0, on_lost: Callable[[float], None] = _exit_requeued) -> Any:
    """``trainer.fit()``; a lost cluster exits 75 (requeue) instead of a crash. ``ray.init`` first."""
    gcs_address = ray.get_runtime_context().gcs_address
    watch = ClusterWatch(gcs_address, on_lost, lost_after=lost_after).start()
    try:
        return trainer.fit()
    except ray.exceptions.RayError:
        if not cluster_reachable(gcs_address):
            on_lost(lost_after)
        raise
    finally:
        watch.stop()
