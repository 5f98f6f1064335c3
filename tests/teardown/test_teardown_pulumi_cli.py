"""The real Automation API wrapper (``open_stack`` / ``AutomationStack``) and ``gpucloud teardown``
end to end, against a scripted ``pulumi`` binary on PATH (``scripted_pulumi``): what the pulumi SDK
runs, and how its answers and failures come back. The real CLI and a real backend were not run."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from tests.cli_run import one_line_error, run_cli
from tests.teardown.scripted_pulumi import argvs, install

from gpucloud.errors import UserError
from gpucloud.infra.automation import StackOperationFailed, open_stack

REPO = Path(__file__).resolve().parents[2]
STACK = "ci-smoke-7"
RESOURCES: list[dict[str, Any]] = [
    {"urn": f"urn:pulumi:{STACK}::gpucloud::pulumi:pulumi:Stack::gpucloud-{STACK}", "type": "pulumi:pulumi:Stack"},
    {"urn": f"urn:pulumi:{STACK}::gpucloud::aws:ec2/vpc:Vpc::vpc", "type": "aws:ec2/vpc:Vpc", "id": "vpc-0a1b2c3d"},
]


def _script(**destroy: Any) -> dict[str, Any]:
    return {
        "stacks": [STACK],
        "outputs": {"checkpointBucketProtected": False, "apiToken": "s3cr3t"},
        "secret_outputs": ["apiToken"],
        "deployment": {"manifest": {}, "resources": RESOURCES},
        "left": [RESOURCES[0]],
        "destroy": {"lines": ["Destroying (ci-smoke-7):", " -  aws:ec2/vpc:Vpc vpc deleting"], **destroy},
    }


@pytest.fixture
def scripted(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    def use(script: dict[str, Any]) -> Path:
        log = install(tmp_path / "bin", script)
        monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}")
        monkeypatch.setenv("PULUMI_HOME", str(tmp_path / "pulumi-home"))
        return log

    return use


def test_the_real_handle_selects_reads_destroys_with_run_program_and_exports(scripted) -> None:
    log = scripted(_script())
    handle = open_stack(STACK, work_dir=REPO)
    assert handle.outputs() == {"checkpointBucketProtected": False, "apiToken": "s3cr3t"}  # secrets unwrapped
    assert [r.type for r in handle.resources()] == ["pulumi:pulumi:Stack", "aws:ec2/vpc:Vpc"]
    lines: list[str] = []
    handle.destroy(on_output=lines.append, exclude_protected=True, run_program=True)
    assert any("aws:ec2/vpc:Vpc vpc deleting" in line for line in lines)
    [destroy] = [a for a in argvs(log) if a[0] == "destroy"]
    assert {"--yes", "--run-program=true", "--exclude-protected"} <= set(destroy) and STACK in destroy
    assert [r.type for r in handle.resources()] == ["pulumi:pulumi:Stack"]


def test_an_unknown_stack_is_one_line(scripted) -> None:
    scripted(_script())
    with pytest.raises(UserError) as caught:
        open_stack("no-such-stack", work_dir=REPO)
    assert str(caught.value) == (
        f"no Pulumi stack named 'no-such-stack' in the backend of {REPO} (list them with `pulumi stack ls`)"
    )


def test_a_failed_destroy_is_its_last_error_line(scripted) -> None:
    stderr = "error: update failed\nerror: deleting S3 Bucket (ckpt-1): BucketNotEmpty: not empty\n"
    scripted(_script(stderr=stderr, code=255))
    handle = open_stack(STACK, work_dir=REPO)
    with pytest.raises(StackOperationFailed) as caught:
        handle.destroy(on_output=lambda line: None, exclude_protected=False, run_program=True)
    assert str(caught.value) == f"pulumi destroy ({STACK}): deleting S3 Bucket (ckpt-1): BucketNotEmpty: not empty"


def test_teardown_end_to_end_through_the_automation_api(scripted, capsys, monkeypatch) -> None:
    monkeypatch.chdir(REPO)
    scripted(_script())
    code, out, err = run_cli(
        capsys, "teardown", "--stack", STACK, "--yes", "--no-drain", "--no-check-aws", "-o", "json"
    )
    assert code == 0, err
    assert json.loads(out)["destroyed"] is True and "aws:ec2/vpc:Vpc vpc deleting" in err


def test_teardown_end_to_end_names_what_the_state_keeps(scripted, capsys, monkeypatch) -> None:
    monkeypatch.chdir(REPO)
    script = _script()
    script["left"] = RESOURCES
    scripted(script)
    code, _, err = run_cli(capsys, "teardown", "--stack", STACK, "--yes", "--no-drain", "--no-check-aws")
    assert code == 1
    assert "1 resource(s) left: aws:ec2/vpc:Vpc vpc-0a1b2c3d" in err.splitlines()[-1]


def test_teardown_of_an_unknown_stack_is_one_line(scripted, capsys, monkeypatch) -> None:
    monkeypatch.chdir(REPO)
    scripted(_script())
    code, _, err = run_cli(capsys, "teardown", "--stack", "nope", "--yes")
    assert code == 2 and "no Pulumi stack named 'nope'" in one_line_error(err)
