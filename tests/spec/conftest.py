"""Helpers for stack-file tests: a valid base stack that each test breaks in exactly one way."""

from __future__ import annotations

import copy
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

BASE_CONFIG: dict[str, Any] = {
    "aws:region": "us-east-1",
    "gpucloud:availabilityZone": "us-east-1a",
    "gpucloud:nodeGroups": [
        {
            "name": "dev",
            "instanceType": "g6.xlarge",
            "minNodes": 0,
            "desiredNodes": 1,
            "maxNodes": 2,
            "capacity": {"type": "spot"},
        },
        {
            "name": "a100",
            "instanceType": "p4d.24xlarge",
            "minNodes": 0,
            "maxNodes": 2,
            "capacity": {"type": "spot", "onDemandBase": 1},
            "efa": {"mode": "on", "layout": "legacy"},
        },
    ],
    "gpucloud:network": {"vpcCidr": "10.20.0.0/16"},
    "gpucloud:storage": {"fsx": {"sizeGiB": 2400, "throughputPerTiB": 250}},
    "gpucloud:agent": {"package": "s3://wheels-bucket/gpucloud-0.1.0-py3-none-any.whl"},
    "gpucloud:tags": {"team": "research"},
    "gpucloud:costCeilingUsdPerHour": 100,
}


def base_config() -> dict[str, Any]:
    return copy.deepcopy(BASE_CONFIG)


@pytest.fixture
def write_stack(tmp_path: Path) -> Callable[..., Path]:
    """write_stack(mutate) -> path of Pulumi.test.yaml holding the base config after ``mutate``."""

    def write(mutate: Callable[[dict[str, Any]], None] | None = None, name: str = "test") -> Path:
        config = base_config()
        if mutate is not None:
            mutate(config)
        path = tmp_path / f"Pulumi.{name}.yaml"
        path.write_text(yaml.safe_dump({"config": config}, sort_keys=False), encoding="utf-8")
        return path

    return write
