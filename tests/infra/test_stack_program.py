"""The Pulumi entry point (`Pulumi.yaml` main) reads stack config and builds the same program."""

from __future__ import annotations

import json
import runpy
import time
from pathlib import Path

import pulumi
import pytest
import yaml

from gpucloud.infra.preview import mocked_runtime, preview_stack, recorded_resources
from gpucloud.spec import spec_from_config

REPO = Path(__file__).resolve().parents[2]
MAIN = REPO / "src" / "gpucloud" / "infra" / "__main__.py"


def engine_config(stack: str) -> dict[str, str]:
    """The stack file's config as the Pulumi engine passes it to a program (PULUMI_CONFIG)."""
    config = yaml.safe_load((REPO / "stacks" / f"Pulumi.{stack}.yaml").read_text())["config"]
    return {k: v if isinstance(v, str) else json.dumps(v) for k, v in config.items()}


def test_pulumi_yaml_points_at_the_program() -> None:
    project = yaml.safe_load((REPO / "Pulumi.yaml").read_text())
    assert project["name"] == "gpucloud" and project["stackConfigDir"] == "stacks"
    assert (REPO / project["main"] / "__main__.py") == MAIN and MAIN.is_file()
    assert project["runtime"]["options"]["virtualenv"] == ".venv"


def test_main_builds_what_plan_previews(monkeypatch) -> None:
    monkeypatch.setenv("PULUMI_CONFIG", json.dumps(engine_config("p4d-spot")))

    @pulumi.runtime.test
    def run() -> None:
        runpy.run_path(str(MAIN), run_name="__main__")

    with mocked_runtime("p4d-spot", "us-east-1", "us-east-1a") as (_, monitor):
        run()
    from_main = sorted((r.type, r.name) for r in recorded_resources(monitor))
    spec = spec_from_config(engine_config("p4d-spot"), "Pulumi.p4d-spot.yaml")
    from_plan = sorted((r.type, r.name) for r in preview_stack(spec, "p4d-spot").resources)
    assert from_main == from_plan and len(from_main) > 50


def test_main_stops_on_a_bad_setting(monkeypatch) -> None:
    config = engine_config("dev") | {"gpucloud:storage": json.dumps({"fsx": {"sizeGiB": 1000}})}
    monkeypatch.setenv("PULUMI_CONFIG", json.dumps(config))

    @pulumi.runtime.test
    def run() -> None:
        runpy.run_path(str(MAIN), run_name="__main__")

    with mocked_runtime("dev", "us-east-1") as (_, monitor), pytest.raises(SystemExit) as done:
        run()
    assert done.value.code == 2
    assert not recorded_resources(monitor)  # nothing is created from a bad spec


def sixteen_group_config() -> dict:
    types = ["g6.xlarge", "g5.xlarge", "p4d.24xlarge", "p5.48xlarge"]
    groups = [
        {
            "name": f"g{i:02d}",
            "instanceType": types[i % 4],
            "maxNodes": 2,
            "capacity": {"type": "spot"} if i % 2 else {"type": "on-demand"},
        }
        for i in range(16)
    ]
    return {
        "aws:region": "us-east-1",
        "gpucloud:availabilityZone": "us-east-1b",
        "gpucloud:nodeGroups": groups,
        "gpucloud:storage": {"fsx": {"sizeGiB": 1200}},
        "gpucloud:agent": {"package": "s3://wheels-bucket/gpucloud-0.1.0-py3-none-any.whl"},
    }


def test_sixteen_node_groups() -> None:
    spec = spec_from_config(sixteen_group_config(), "generated")
    started = time.perf_counter()
    preview = preview_stack(spec, "sixteen")
    elapsed = time.perf_counter() - started
    asgs = preview.of_type("aws:autoscaling/group:Group")
    assert len(asgs) == 16 and len({a.name for a in asgs}) == 16
    assert len(preview.of_type("aws:ec2/placementGroup:PlacementGroup")) == 8  # the EFA types
    p5_lt = next(r for r in preview.of_type("aws:ec2/launchTemplate:LaunchTemplate") if "g03" in r.name)
    assert len(p5_lt.inputs["networkInterfaces"]) == 33
    print(f"16 node groups: {len(preview.resources)} resources in {elapsed:.2f}s")  # measured in benchmarks/
