"""``gpucloud sweep`` where botocore's credential chain finds nothing: one line that says no request
was made, not that AWS refused one."""

from __future__ import annotations

from pathlib import Path

import pytest

from cli_run import one_line_error, run_cli

_CREDENTIAL_VARIABLES = (
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "AWS_SECURITY_TOKEN",
    "AWS_PROFILE",
    "AWS_DEFAULT_PROFILE",
    "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
    "AWS_CONTAINER_CREDENTIALS_FULL_URI",
    "AWS_WEB_IDENTITY_TOKEN_FILE",
    "AWS_ROLE_ARN",
)


@pytest.fixture
def no_credentials(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for name in _CREDENTIAL_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-credentials"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-config"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")  # no instance role to ask for either


@pytest.mark.usefixtures("no_credentials")
def test_sweep_without_credentials_says_so_and_that_nothing_was_asked(capsys) -> None:
    code, out, err = run_cli(capsys, "sweep", "--region", "us-east-1", "--all")
    line = one_line_error(err)
    assert code == 2 and out == ""
    assert "no AWS credentials found" in line and "asked AWS nothing" in line
    assert "refused" not in line
