"""The Automation API boundary (gpucloud.infra.automation): what can run without the pulumi CLI."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpucloud.errors import UserError
from gpucloud.infra.automation import StackResource, command_error_line, find_project_dir, open_stack, resources_of

REPO = Path(__file__).resolve().parents[2]


def test_open_stack_without_the_pulumi_cli_is_one_line(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # an empty directory: no `pulumi` to run
    with pytest.raises(UserError) as caught:
        open_stack("dev", work_dir=REPO)
    message = str(caught.value)
    assert "\n" not in message
    assert "pulumi CLI is not installed" in message and "https://www.pulumi.com/" in message


def test_open_stack_outside_a_project_says_so(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="holds no Pulumi.yaml"):
        open_stack("dev", work_dir=tmp_path)


def test_project_dir_is_found_upwards_else_the_repository(tmp_path: Path) -> None:
    (tmp_path / "Pulumi.yaml").write_text("name: x\n", encoding="utf-8")
    nested = tmp_path / "a" / "b"
    nested.mkdir(parents=True)
    assert find_project_dir(nested) == tmp_path.resolve()
    assert find_project_dir(Path("/")) == REPO


def test_resources_of_an_exported_deployment() -> None:
    deployment = {
        "resources": [
            {"urn": "urn:pulumi:dev::gpucloud::pulumi:pulumi:Stack::gpucloud-dev", "type": "pulumi:pulumi:Stack"},
            {"urn": "urn:p::aws", "type": "pulumi:providers:aws", "id": "abc"},
            {"urn": "urn:p::bucket", "type": "aws:s3/bucketV2:BucketV2", "id": "ckpt-1", "protect": True},
        ]
    }
    resources = resources_of(deployment)
    assert resources[2] == StackResource(
        urn="urn:p::bucket", type="aws:s3/bucketV2:BucketV2", id="ckpt-1", protected=True
    )
    assert not resources[1].protected
    assert [r.bookkeeping for r in resources] == [True, True, False]
    assert resources_of({}) == []


def test_command_error_line_is_the_last_error() -> None:
    text = (
        "\n code: 255\n stdout: Destroying (dev):\n  - aws:s3:BucketV2 ckpt deleting\n"
        " stderr: error: update failed\n    error: deleting S3 Bucket (ckpt): BucketNotEmpty\n"
    )
    assert command_error_line(text) == "deleting S3 Bucket (ckpt): BucketNotEmpty"
    assert command_error_line("\n code: 1\n stdout: \n stderr: something broke\n") == "something broke"
