"""The cluster path of ``gpucloud drill``: which job it asks ``drill/cluster.py`` to run. The
Automation API boundary (open_stack) is faked; run_on_cluster is replaced by a recorder that stops
the drill there (its own tests run it on moto and the Stubber)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from cli_run import one_line_error, run_cli
from gpucloud.errors import UserError
from gpucloud.spec import stack_file_for


class _Stack:
    def outputs(self) -> dict:
        return {"drill": {"experimentTemplateId": "EXT123"}}


@pytest.fixture
def mixed_stack(tmp_path: Path) -> Path:
    """p4d-spot with an on-demand group listed before its spot group."""
    doc = yaml.safe_load(stack_file_for("p4d-spot").read_text())
    spot = doc["config"]["gpucloud:nodeGroups"][0]
    anchor = {**spot, "name": "anchor", "capacity": {"type": "on-demand"}, "scaling": {"enabled": False}}
    anchor.update(minNodes=0, desiredNodes=1, maxNodes=1)
    anchor.pop("placementGroup", None)
    doc["config"]["gpucloud:nodeGroups"] = [anchor, spot]
    path = tmp_path / "Pulumi.mixed.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def test_the_drill_job_goes_to_the_spot_group_even_when_an_on_demand_group_comes_first(
    capsys, monkeypatch, mixed_stack: Path
) -> None:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setattr("gpucloud.infra.automation.open_stack", lambda name, *a, **k: _Stack())
    asked = {}

    def record(**kwargs):
        asked.update(kwargs)
        raise UserError("recorded")

    monkeypatch.setattr("gpucloud.drill.cluster.run_on_cluster", record)
    code, _, err = run_cli(capsys, "drill", "--stack-file", str(mixed_stack))
    assert code == 2 and one_line_error(err) == "gpucloud: error: recorded"
    assert asked["job"].group == "a100"
    assert asked["outputs"] == _Stack().outputs() and asked["stack"] == "mixed"


def test_a_local_drill_without_a_stack_drills_the_shipped_drill_stack(capsys, monkeypatch) -> None:
    asked = {}

    def record(options, **kwargs):
        asked["options"] = options
        raise UserError("recorded")

    monkeypatch.setattr("gpucloud.offline.local_fleet.local_drill", record)
    code, _, err = run_cli(capsys, "drill", "--local")
    assert code == 2 and one_line_error(err) == "gpucloud: error: recorded"
    assert asked["options"].instance_type == "p4d.24xlarge"  # p4d-spot's spot group
