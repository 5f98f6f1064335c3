"""Test-only: a Ray Train driver run under ``gpucloud spot-train`` (the cluster-lost test).

Connects to ``$RAY_ADDRESS``, passes the job environment to the workers and runs
``ray_train_fn.train_func`` (the test runs it under ``python -m gpucloud.integrations.ray.driver``); the test's settings come in
``$GPUCLOUD_TEST_RAY_CONFIG`` (JSON)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import ray

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.integrations import ray_cluster as rc

from gpucloud import jobenv
from gpucloud.integrations.ray.driver import worker_env


def main() -> int:
    settings = json.loads(os.environ["GPUCLOUD_TEST_RAY_CONFIG"])
    config = {**settings["config"], "checkpoint_uri": os.environ[jobenv.CHECKPOINT_URI]}
    config["job_id"] = os.environ[jobenv.JOB_ID]
    ray.init(address=os.environ["RAY_ADDRESS"], runtime_env={"env_vars": worker_env()}, log_to_driver=False)
    name = f"attempt-{os.environ[jobenv.ATTEMPT]}"
    rc.trainer(config, Path(settings["storage"]), name, max_failures=0).fit()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
