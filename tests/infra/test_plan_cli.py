"""`gpucloud plan` end to end: JSON and table output, no credentials, no network, lazy imports."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from gpucloud.cli import main

REPO = Path(__file__).resolve().parents[2]
GPUCLOUD = [sys.executable, "-m", "gpucloud"]


def run_main(argv: list[str]) -> int:
    try:
        main(argv)
    except SystemExit as done:
        return int(done.code or 0)
    return 0


def bare_env(tmp_path: Path) -> dict[str, str]:
    """No AWS credentials, config or profile anywhere; IMDS disabled (as on a laptop)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "PULUMI_"))}
    env.update(
        HOME=str(tmp_path),
        AWS_CONFIG_FILE=str(tmp_path / "none"),
        AWS_SHARED_CREDENTIALS_FILE=str(tmp_path / "none"),
        AWS_EC2_METADATA_DISABLED="true",
    )
    return env


def test_plan_json_without_credentials(tmp_path: Path) -> None:
    proc = subprocess.run(
        GPUCLOUD + ["plan", "--stack", "p5-capacity-block", "--output", "json"],
        cwd=tmp_path,
        env=bare_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert data["stack"] == "p5-capacity-block"
    assert data["policy_violations"] == []  # the policy pack passes the shipped stack
    resources = data["resources"]
    assert all({"type", "name", "inputs"} <= set(r) for r in resources)
    lts = [r for r in resources if r["type"] == "aws:ec2/launchTemplate:LaunchTemplate"]
    assert len(lts) == 1 and len(lts[0]["inputs"]["networkInterfaces"]) == 33
    assert data["efa_layout"] == [
        {
            "node_group": "h100",
            "placement_group": False,
            "instance_type": "p5.48xlarge",
            "layout": "efa-only",
            "network_cards": 32,
            "interfaces": 33,
            "efa_interfaces": 32,
            "ip_interfaces": 1,
            "by_type": {"interface": 1, "efa-only": 32},
        }
    ]
    assert data["cost"]["on_demand"]["max"] == pytest.approx(2 * 55.04)  # after the June 2025 price cut
    assert data["cost"]["groups"][0]["capacity"] == "capacity-block"


def test_plan_table_shows_tree_layout_and_cost(tmp_path: Path) -> None:
    env = bare_env(tmp_path) | {"COLUMNS": "160"}
    proc = subprocess.run(
        GPUCLOUD + ["plan", "--stack", "p4d-spot"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "p4d-spot-group-a100-lt aws:ec2/launchTemplate:LaunchTemplate" in out
    assert "EFA layout per node" in out and "legacy" in out  # p4d: AWS documents no EFA-only layout
    assert "Hourly cost" in out and "$87.83" in out  # 4 x p4d.24xlarge at the post-cut on-demand price


def test_plan_opens_no_network_connection(monkeypatch, capsys) -> None:
    def refuse(*args, **kwargs):
        raise AssertionError(f"network access attempted: {args}")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)
    for key in [k for k in os.environ if k.startswith("AWS_")]:
        monkeypatch.delenv(key)
    assert run_main(["plan", "--stack", "dev", "--output", "json"]) == 0
    assert json.loads(capsys.readouterr().out)["cluster"] == "dev"


def test_stack_file_name_gives_the_stack_name(tmp_path: Path, capsys) -> None:
    source = (REPO / "stacks" / "Pulumi.dev.yaml").read_text()
    path = tmp_path / "Pulumi.research.yaml"
    path.write_text(source)
    assert run_main(["plan", "--stack-file", str(path), "--output", "json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["stack"] == "research"
    lt = next(r for r in data["resources"] if r["type"] == "aws:ec2/launchTemplate:LaunchTemplate")
    assert lt["inputs"]["tags"]["gpucloud:stack"] == "research"


def test_help_imports_neither_pulumi_nor_boto3() -> None:
    code = (
        "import sys\n"
        "from gpucloud.cli import main\n"
        "for argv in (['--help'], ['plan', '--help']):\n"
        "    try:\n"
        "        main(argv)\n"
        "    except SystemExit:\n"
        "        pass\n"
        "heavy = sorted(m for m in sys.modules if m.split('.')[0] in ('pulumi', 'pulumi_aws', 'boto3', 'botocore'))\n"
        "print('HEAVY', heavy)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "HEAVY []" in proc.stdout
    assert "--stack-file PATH" in proc.stdout and "gpucloud plan --stack dev" in proc.stdout


def _strict_json(text: str) -> object:
    """json.loads that refuses the NaN / Infinity Python's json writes by default (not RFC 8259)."""

    def refuse(constant: str) -> object:
        raise ValueError(f"not JSON: {constant}")

    return json.loads(text, parse_constant=refuse)


def test_plan_json_is_strict_json(tmp_path: Path, capsys) -> None:
    # before: a catalog spot price of NaN printed a bare NaN in `plan -o json`; now the catalog is refused
    catalog = json.loads((REPO / "src/gpucloud/catalog/instance_types.json").read_text())
    catalog["instance_types"]["g6.xlarge"]["spot_usd_per_hour"] = "NAN"
    file = tmp_path / "catalog.json"
    file.write_text(json.dumps(catalog).replace('"NAN"', "NaN"))
    assert run_main(["plan", "--stack", "dev", "--catalog-file", str(file), "--output", "json"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and "spot_usd_per_hour" in err
    assert run_main(["plan", "--stack", "dev", "--output", "json"]) == 0
    _strict_json(capsys.readouterr().out)


def test_json_output_never_writes_nan() -> None:
    from gpucloud.output import print_json

    with pytest.raises(ValueError, match="not JSON compliant"):
        print_json({"cost": float("nan")})
