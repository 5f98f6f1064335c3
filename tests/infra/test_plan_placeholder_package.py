"""`gpucloud plan` warns when the stack's agent package still names the placeholder wheel bucket the
shipped stacks carry: one line in the table output and in the JSON's warnings."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpucloud.jobs.code.agent_package import placeholder_warning
from infra.test_plan_emergency_save import run_plan, stack_with

REPO = Path(__file__).resolve().parents[2]
LINE = "gpucloud:agent.package names the placeholder bucket my-gpucloud-artifacts"


def test_the_shipped_stacks_name_the_placeholder_and_the_table_says_so_in_one_line(capsys) -> None:
    code, out, err = run_plan(["plan", "--stack", "dev"], capsys)
    assert code == 0, err
    [line] = [line for line in out.splitlines() if "placeholder bucket" in line]
    assert line.startswith(f"warning: {LINE} (s3://my-gpucloud-artifacts/wheels/gpucloud-0.1.0-py3-none-any.whl)")


def test_json_carries_the_warning_and_a_real_bucket_has_none(tmp_path: Path, capsys) -> None:
    code, out, err = run_plan(["plan", "--stack", "p4d-spot", "--output", "json"], capsys)
    assert code == 0, err
    [warning] = json.loads(out)["warnings"]
    assert warning.startswith(LINE)
    ours = {"package": "s3://acme-ml-platform/wheels/gpucloud-0.1.0-py3-none-any.whl"}
    code, out, err = run_plan(
        ["plan", "--stack-file", str(stack_with(tmp_path, "p4d-spot", **{"gpucloud:agent": ours})), "--output", "json"],
        capsys,
    )
    assert code == 0, err
    assert json.loads(out)["warnings"] == []


@pytest.mark.parametrize("stack", sorted(p.name for p in (REPO / "stacks").glob("Pulumi.*.yaml")))
def test_every_shipped_stack_that_names_a_wheel_names_the_placeholder(stack: str) -> None:
    import yaml

    package = yaml.safe_load((REPO / "stacks" / stack).read_text())["config"].get("gpucloud:agent", {}).get("package")
    assert package is None or placeholder_warning(package) is not None


@pytest.mark.parametrize(
    ("package", "warns"),
    [
        ("s3://my-gpucloud-artifacts/wheels/gpucloud-0.1.0-py3-none-any.whl", True),
        ("s3://my-artifacts/wheels/", True),  # a wheelhouse in the docs' example bucket
        ("s3://acme-ml-platform/wheels/gpucloud-0.1.0-py3-none-any.whl", False),
        ("gpucloud==0.1.0", False),
        (None, False),
    ],
)
def test_which_packages_are_placeholders(package: str | None, warns: bool) -> None:
    assert (placeholder_warning(package) is not None) is warns
