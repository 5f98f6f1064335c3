from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpucloud.catalog import get_instance_type
from gpucloud.errors import UserError
from gpucloud.spec import available_stacks, load_stack_file, spec_from_config, stack_file_for
from gpucloud.spec.decisions import efa_enabled, uses_placement_group


def test_shipped_stacks_load() -> None:
    assert available_stacks() == ["dev", "p4d-spot", "p5-capacity-block"]
    specs = {name: load_stack_file(stack_file_for(name)) for name in available_stacks()}
    assert specs["dev"].node_groups[0].instance_type.startswith("g6.")
    assert specs["dev"].storage.fsx is None
    p4d = specs["p4d-spot"]
    assert (p4d.node_groups[0].max_nodes, p4d.node_groups[0].capacity.type) == (4, "spot")
    assert p4d.storage.fsx is not None and p4d.storage.fsx.size_gib == 2400
    p5 = specs["p5-capacity-block"].node_groups[0]
    assert (p5.instance_type, p5.capacity.type, p5.efa.layout) == ("p5.48xlarge", "capacity-block", "efa-only")


def test_engine_style_config_with_json_text_values() -> None:
    # the Pulumi engine hands structured config to the program as JSON text, numbers as strings
    config = {
        "aws:region": "us-west-2",
        "gpucloud:nodeGroups": json.dumps([{"name": "a", "instanceType": "g6.xlarge", "maxNodes": 3}]),
        "gpucloud:costCeilingUsdPerHour": "10.5",
        "aws:profile": "research",  # provider settings pass through untouched
        "gpucloud:agent": json.dumps({"package": "s3://wheels-bucket/gpucloud-0.1.0-py3-none-any.whl"}),
    }
    spec = spec_from_config(config, "Pulumi.x.yaml")
    assert spec.region == "us-west-2"
    assert spec.node_groups[0].max_nodes == 3
    assert spec.cost_ceiling_usd_per_hour == 10.5


def test_unprefixed_keys_are_the_project_namespace() -> None:
    spec = spec_from_config(
        {
            "aws:region": "us-east-1",
            "nodeGroups": [{"name": "a", "instanceType": "g5.xlarge"}],
            "agent": {"package": "s3://wheels-bucket/gpucloud-0.1.0-py3-none-any.whl"},
        },
        "f",
    )
    assert spec.node_groups[0].name == "a"


def test_yaml_on_off_for_efa_mode(tmp_path: Path) -> None:
    path = tmp_path / "Pulumi.x.yaml"
    path.write_text(
        "config:\n  aws:region: us-east-1\n  gpucloud:nodeGroups:\n"
        "    - {name: a, instanceType: p4d.24xlarge, efa: {mode: on}}\n"
        "    - {name: b, instanceType: p4d.24xlarge, efa: {mode: off}}\n"
        "  gpucloud:agent: {package: 's3://wheels-bucket/gpucloud-0.1.0-py3-none-any.whl'}\n"
    )
    spec = load_stack_file(path)
    assert [g.efa.mode for g in spec.node_groups] == ["on", "off"]


def test_defaults_decide_efa_and_placement() -> None:
    spec = spec_from_config(
        {
            "aws:region": "us-east-1",
            "gpucloud:nodeGroups": [
                {"name": "p4d", "instanceType": "p4d.24xlarge"},
                {
                    "name": "cb",
                    "instanceType": "p5.48xlarge",
                    "capacity": {"type": "capacity-block", "reservationId": "cr-0123456789abcdef0"},
                },
                {"name": "g", "instanceType": "g6.xlarge"},
            ],
            "gpucloud:agent": {"package": "s3://wheels-bucket/gpucloud-0.1.0-py3-none-any.whl"},
        },
        "f",
    )
    p4d, cb, g = spec.node_groups
    assert efa_enabled(p4d, get_instance_type("p4d.24xlarge")) and uses_placement_group(
        p4d, get_instance_type("p4d.24xlarge")
    )
    assert efa_enabled(cb, get_instance_type("p5.48xlarge")) and not uses_placement_group(
        cb, get_instance_type("p5.48xlarge")
    )
    assert not efa_enabled(g, get_instance_type("g6.xlarge")) and not uses_placement_group(
        g, get_instance_type("g6.xlarge")
    )
    assert spec.network.vpc_cidr is None and spec.ami.ssm_parameter.startswith("/aws/service/deeplearning/ami/x86_64/")


def test_stack_file_for_unknown_name_lists_stacks(tmp_path: Path) -> None:
    (tmp_path / "Pulumi.one.yaml").write_text("config: {}\n")
    with pytest.raises(UserError, match="available stacks: one"):
        stack_file_for("two", tmp_path)
    assert stack_file_for("one", tmp_path) == tmp_path / "Pulumi.one.yaml"
