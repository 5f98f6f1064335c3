"""The driver's side: a lost Ray cluster becomes a requeue, not a crash.

Ray restarts the worker group when one node goes. When the whole cluster goes (every node
reclaimed, or the head node), the driver cannot report anything: Ray's core worker ends the
driver process itself as soon as its raylet is gone (exit 1, no traceback), or after
``gcs_rpc_server_reconnect_timeout_s`` (60 s) without its GCS, and ``gpucloud spot-train`` reads
that as a crash. So the decision is made one process up, by a wrapper that never connects to Ray:

    gpucloud spot-train --job-id llama-7b -- \\
        python -m gpucloud.integrations.ray.driver --address HEAD_IP:6379 -- python driver.py

It runs the driver as its child and watches the cluster's GCS. When the GCS has not answered for
``--lost-after`` seconds (15), or the driver fails and the GCS stops answering within that time,
the wrapper ends the driver and exits 75: spot-train requeues the run, and its next attempt, on a
new cluster, resumes from the checkpoint the workers committed to the gpucloud store. Any other
exit is passed on as it is (0 finished, a failure stays a failure).

In the driver, ``worker_env()`` hands the job environment spot-train gave it (job id, attempt,
checkpoint location) to Ray's workers, so their ``TrainingSession`` finds the job's checkpoints
and its commits are fenced by this attempt:

    ray.init(address="auto", runtime_env={"env_vars": worker_env()})
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable

from gpucloud import jobenv

log = logging.getLogger("gpucloud.integrations.ray")

# The job environment the workers need. Not GPUCLOUD_CONTROL_DIR: it is a directory on the driver's
# node, where the supervisor reads it; the workers run on other nodes.
_WORKER_VARS = (jobenv.JOB_ID, jobenv.ATTEMPT, jobenv.CHECKPOINT_URI, jobenv.LOCAL_CHECKPOINT_DIR)


def worker_env() -> dict[str, str]:
    """The spot-train job variables to pass to Ray's workers (``runtime_env={"env_vars": ...}``)."""
    return {name: os.environ[name] for name in _WORKER_VARS if os.environ.get(name)}


def cluster_reachable(gcs_address: str, *, timeout: float = 2.0) -> bool:
    """Whether the cluster's GCS answers within ``timeout`` seconds."""
    try:
        import ray._raylet

        ray._raylet.GcsClient(address=gcs_address).get_all_node_info(timeout=timeout)
    except Exception:  # noqa: BLE001 - any failure to answer is "not reachable"
        return False
    return True


def goes_unreachable(
    gcs_address: str, *, within: float, reachable: Callable[[str], bool] = cluster_reachable, every: float = 0.5
) -> bool:
    """Whether the GCS stops answering within ``within`` seconds (checked every ``every``)."""
    deadline = time.monotonic() + within
    while True:
        if not reachable(gcs_address):
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(every)


def supervise(
    command: list[str],
    gcs_address: str,
    *,
    lost_after: float = 15.0,
    every: float = 1.0,
    reachable: Callable[[str], bool] = cluster_reachable,
) -> int:
    """Run the driver ``command``; its exit code, or 75 when the cluster was lost (see the module docs)."""
    child = subprocess.Popen(command)
    last_ok = time.monotonic()
    while True:
        try:
            code = child.wait(timeout=every)
        except subprocess.TimeoutExpired:
            if reachable(gcs_address):
                last_ok = time.monotonic()
            elif time.monotonic() - last_ok >= lost_after:
                _end(child)
                return _lost(time.monotonic() - last_ok)
            continue
        if code != 0 and goes_unreachable(gcs_address, within=lost_after, reachable=reachable):
            return _lost(lost_after)
        return code if code >= 0 else 128 - code


def _end(child: subprocess.Popen) -> None:
    child.send_signal(signal.SIGTERM)
    try:
        child.wait(timeout=10)
    except subprocess.TimeoutExpired:
        child.kill()
        child.wait()


def _lost(silent_for: float) -> int:
    log.error(
        "the Ray cluster is gone (its GCS does not answer, %.0fs): exiting %d so gpucloud spot-train requeues "
        "the run; it resumes from the last committed checkpoint",
        silent_for,
        jobenv.EXIT_REQUEUED,
    )
    return jobenv.EXIT_REQUEUED


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m gpucloud.integrations.ray.driver",
        description="Run a Ray driver; exit 75 (requeue) when the whole Ray cluster is lost.",
    )
    parser.add_argument("--address", default=os.environ.get("RAY_ADDRESS"), help="GCS HOST:PORT (default $RAY_ADDRESS)")
    parser.add_argument("--lost-after", type=float, default=15.0, help="seconds without a GCS answer (default 15)")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- the driver command")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    problem = None
    if not args.address or args.address == "auto" or ":" not in args.address:
        problem = f"--address must be the cluster's GCS as HOST:PORT (or $RAY_ADDRESS), got {args.address!r}"
    elif not args.lost_after > 0:
        problem = f"--lost-after must be > 0 seconds, got {args.lost_after}"
    elif not command:
        problem = "no driver command: give it after --, e.g. -- python driver.py"
    if problem:
        print(f"error: {problem}", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    return supervise(command, args.address, lost_after=args.lost_after)


if __name__ == "__main__":
    raise SystemExit(main())
