"""`gpucloud catalog show` and `gpucloud catalog refresh` end to end through the CLI entry point."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from aws_responses import g6_xlarge, p5_48xlarge, price_list_entry, spot_entry
from botocore.stub import ANY
from stubbed_aws import NOW, expect_describe, expect_prices, stubbed_clients

from cli_run import run_cli
from gpucloud.catalog import load_catalog
from gpucloud.catalog import refresh as catalog_refresh


def test_show_json_is_the_catalog(capsys):
    code, out, _ = run_cli(capsys, "catalog", "show", "--output", "json")
    data = json.loads(out)
    assert code == 0
    assert data["instance_types"]["p5.48xlarge"]["max_efa_interfaces"] == 32
    assert data["as_of"] == load_catalog().as_of.isoformat()


def test_show_table_lists_every_type_with_the_as_of_date(capsys):
    code, out, _ = run_cli(capsys, "catalog", "show")
    catalog = load_catalog()
    assert code == 0 and f"as of {catalog.as_of.isoformat()}" in out
    assert out.count("│ p5") >= 3 and "note:" in out


@pytest.mark.parametrize("region", [None, "us-east-1"])
def test_show_keeps_every_instance_name_whole_at_80_columns(capsys, monkeypatch, region):
    monkeypatch.setenv("COLUMNS", "80")
    code, out, _ = run_cli(capsys, "catalog", "show", *(["--region", region] if region else []))
    assert code == 0
    assert all(len(line) <= 80 for line in out.splitlines() if line[:1] in "┏┃┡│└")
    names = {line.split("│")[1].strip() for line in out.splitlines() if line.startswith("│")}
    assert set(load_catalog().instance_types) <= names, sorted(names)


def test_show_rejects_a_corrupt_catalog_file(capsys, tmp_path):
    bad = tmp_path / "catalog.json"
    bad.write_text('{"as_of": "yesterday"}')
    code, out, err = run_cli(capsys, "catalog", "show", "--catalog-file", str(bad))
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and err.startswith(f"gpucloud: error: {bad}: invalid catalog at as_of")


def test_refresh_without_credentials_explains_how_to_provide_them(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env.update(
        AWS_CONFIG_FILE=str(tmp_path / "none"),
        AWS_SHARED_CREDENTIALS_FILE=str(tmp_path / "none"),
        AWS_EC2_METADATA_DISABLED="true",
        HOME=str(tmp_path),
    )
    target = tmp_path / "out.json"
    proc = subprocess.run(
        [sys.executable, "-m", "gpucloud", "catalog", "refresh", "--output-file", str(target)],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.startswith("gpucloud: error: no AWS credentials found")
    assert "AWS_PROFILE" in proc.stderr and "`gpucloud plan`" in proc.stderr
    assert not target.exists()


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--types", "p5"], "--types: 'p5' is not an EC2 instance type name"),
        (["--region", "mars-east-1"], "--region: unknown AWS region 'mars-east-1'; allowed: "),
    ],
)
def test_refresh_rejects_bad_flags_before_calling_aws(capsys, tmp_path, argv, message):
    code, _, err = run_cli(capsys, "catalog", "refresh", "--output-file", str(tmp_path / "c.json"), *argv)
    assert code == 2 and err.startswith(f"gpucloud: error: {message}") and err.count("\n") == 1


def test_refresh_writes_the_catalog_and_reports_changes(capsys, monkeypatch, tmp_path):
    target = tmp_path / "catalog.json"
    types = ["g6.xlarge", "p5.48xlarge"]
    with stubbed_clients() as (clients, ec2, pricing):
        expect_describe(ec2, types, [[g6_xlarge(), p5_48xlarge()]])
        expect_prices(pricing, "us-east-1", "g6.xlarge", [price_list_entry("g6.xlarge", "0.8048")])
        expect_prices(pricing, "us-east-1", "p5.48xlarge", [price_list_entry("p5.48xlarge", "55.04")])
        ec2.add_response(
            "describe_spot_price_history",
            {"SpotPriceHistory": [spot_entry("p5.48xlarge", "us-east-1a", "22.0", 1, NOW)]},
            {"InstanceTypes": types, "ProductDescriptions": ["Linux/UNIX"], "StartTime": ANY, "EndTime": ANY},
        )
        monkeypatch.setattr(catalog_refresh, "make_clients", lambda region: clients)
        code, out, _ = run_cli(
            capsys,
            "catalog",
            "refresh",
            "--types",
            "p5.48xlarge,g6.xlarge",
            "--output-file",
            str(target),
            "--output",
            "json",
        )
    assert code == 0
    report = json.loads(out)
    assert report["written"] is True and report["output_file"] == str(target)
    assert {c["name"]: c["status"] for c in report["changes"]} == {"g6.xlarge": "refreshed", "p5.48xlarge": "refreshed"}
    written = load_catalog(target)
    assert written.instance_types["p5.48xlarge"].spot_usd_per_hour == 22.0
    assert written.instance_types["g6.xlarge"].spot_usd_per_hour is None  # no spot price seen for it


def test_dry_run_writes_nothing(capsys, monkeypatch, tmp_path):
    target = tmp_path / "catalog.json"
    with stubbed_clients() as (clients, ec2, pricing):
        expect_describe(ec2, ["p5.48xlarge"], [[p5_48xlarge()]])
        expect_prices(pricing, "us-east-1", "p5.48xlarge", [price_list_entry("p5.48xlarge", "55.04")])
        monkeypatch.setattr(catalog_refresh, "make_clients", lambda region: clients)
        code, out, _ = run_cli(
            capsys,
            "catalog",
            "refresh",
            "--types",
            "p5.48xlarge",
            "--no-spot",
            "--dry-run",
            "--output-file",
            str(target),
        )
    assert code == 0 and "would write" in out and "55.04" in out
    assert not target.exists()


def test_refresh_refuses_to_overwrite_a_corrupt_target(capsys, tmp_path):
    target = tmp_path / "catalog.json"
    target.write_text("{broken")
    code, _, err = run_cli(capsys, "catalog", "refresh", "--output-file", str(target))
    assert code == 2 and "not a readable JSON catalog" in err
    assert target.read_text() == "{broken"


def test_help_teaches_the_commands():
    proc = subprocess.run(
        [sys.executable, "-m", "gpucloud", "catalog", "refresh", "--help"], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0
    for flag in ("--region", "--types", "--output-file", "--no-spot", "--dry-run", "--output"):
        assert flag in proc.stdout
    assert "pricing:GetProducts" in proc.stdout


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("[" * 100_000 + "]" * 100_000, "JSON nested too deeply"),
        ('{"as_of": ' + "1" * 5000 + "}", "JSON that cannot be read"),
        (b'{"as_of": "\xff"}', "not UTF-8"),
    ],
    ids=["deep", "5000-digits", "bad-utf8"],
)
def test_show_refuses_hostile_json_in_one_line(capsys, tmp_path, text, expected):
    # each of these once gave a RecursionError / ValueError traceback from `catalog show`
    bad = tmp_path / "catalog.json"
    bad.write_bytes(text if isinstance(text, bytes) else text.encode())
    code, out, err = run_cli(capsys, "catalog", "show", "--catalog-file", str(bad))
    assert code == 2 and out == "" and "Traceback" not in err
    assert (
        err.count("\n") == 1
        and err.startswith(f"gpucloud: error: {bad}: not a readable JSON catalog")
        and expected in err
    )


@pytest.mark.parametrize(
    ("field", "value"),
    [("on_demand_usd_per_hour", "NaN"), ("spot_usd_per_hour", "-1.5"), ("memory_gib", "Infinity"), ("gpus", "true")],
)
def test_show_refuses_impossible_numbers(capsys, tmp_path, field, value):
    catalog = json.loads(load_catalog().model_dump_json())
    catalog["instance_types"]["g6.xlarge"][field] = "VALUE"
    bad = tmp_path / "catalog.json"
    bad.write_text(json.dumps(catalog).replace('"VALUE"', value))
    code, out, err = run_cli(capsys, "catalog", "show", "--catalog-file", str(bad), "-o", "json")
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and f"invalid catalog at instance_types.g6.xlarge.{field} = " in err
