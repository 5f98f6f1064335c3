"""`render` as the one source and `gpucloud monitoring render` writing it."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import yaml

from cli_run import run_cli
from gpucloud.monitoring import render, write_files
from gpucloud.monitoring.dcgm_fields import counters_csv

from .conftest import AMP_URL, TOPIC, shipped_spec

STACKS = Path(__file__).resolve().parents[2] / "stacks"
EXPECTED = {
    "prometheus.yml",
    "rules/gpu-health.yml",
    "rules/training.yml",
    "rules/nodes.yml",
    "alertmanager.yml",
    "dashboards/cluster.json",
    "dashboards/job.json",
    "dcgm-counters.csv",
}


@pytest.mark.parametrize("mode", ["self-hosted", "managed", "off"])
def test_render_gives_every_file_in_every_mode(mode):
    files = render(shipped_spec(mode=mode), "p5-capacity-block", sns_topic_arn=TOPIC, amp_remote_write_url=AMP_URL)
    assert set(files) == EXPECTED
    assert files["dcgm-counters.csv"] == counters_csv()
    prometheus = yaml.safe_load(files["prometheus.yml"])
    assert ("remote_write" in prometheus) is (mode == "managed")
    assert prometheus["global"]["external_labels"] == {"cluster": "p5-capacity-block"}


def test_render_is_deterministic():
    spec = shipped_spec(mode="self-hosted")
    assert render(spec, "p5-capacity-block", sns_topic_arn=TOPIC) == render(
        spec, "p5-capacity-block", sns_topic_arn=TOPIC
    )


def test_the_cluster_name_and_region_come_from_the_spec():
    spec = shipped_spec("p4d-spot", mode="self-hosted")
    spec = spec.model_copy(update={"cluster_name": "research", "region": "eu-west-1"})
    files = render(spec, "p4d-spot", sns_topic_arn=TOPIC)
    dcgm = yaml.safe_load(files["prometheus.yml"])["scrape_configs"][0]["ec2_sd_configs"][0]
    assert dcgm["region"] == "eu-west-1"
    assert {"name": "tag:gpucloud:cluster", "values": ["research"]} in dcgm["filters"]
    assert json.loads(files["dashboards/cluster.json"])["title"] == "gpucloud research: cluster"


def test_write_files_refuses_a_path_outside_the_directory(tmp_path):
    with pytest.raises(ValueError, match="outside"):
        write_files({"../escape.yml": "x"}, tmp_path / "out")
    assert not (tmp_path / "escape.yml").exists()


def test_cli_writes_every_file_with_placeholder_notes(tmp_path, capsys):
    out = tmp_path / "monitoring"
    code, stdout, stderr = run_cli(
        capsys, "monitoring", "render", "--stack", "p5-capacity-block", "--out", str(out), "--output", "json"
    )
    assert code == 0
    report = json.loads(stdout)
    assert {f["path"] for f in report["files"]} == EXPECTED
    assert {str(p.relative_to(out)) for p in out.rglob("*") if p.is_file()} == EXPECTED
    for f in report["files"]:
        assert (out / f["path"]).stat().st_size == f["bytes"]
    alertmanager = yaml.safe_load((out / "alertmanager.yml").read_text())
    arn = alertmanager["receivers"][0]["sns_configs"][0]["topic_arn"]
    assert arn == "arn:aws:sns:us-east-1:000000000000:p5-capacity-block-alerts"
    assert "placeholder account 000000000000" in stderr and "--sns-topic-arn" in stderr
    assert any("000000000000" in n for n in report["notes"])


def test_cli_uses_the_topic_arn_given(tmp_path, capsys):
    code, _, stderr = run_cli(
        capsys, "monitoring", "render", "--stack", "p4d-spot", "--out", str(tmp_path), "--sns-topic-arn", TOPIC
    )
    assert code == 0 and "placeholder account" not in stderr
    assert TOPIC in (tmp_path / "alertmanager.yml").read_text()


def _stack_file(tmp_path: Path, mode: str) -> Path:
    text = (STACKS / "Pulumi.p5-capacity-block.yaml").read_text()
    document = yaml.safe_load(text)
    document["config"]["gpucloud:monitoring"] = {"mode": mode}
    path = tmp_path / "Pulumi.watched.yaml"
    path.write_text(yaml.safe_dump(document))
    return path


def test_cli_managed_stack_remote_writes_to_a_placeholder_workspace(tmp_path, capsys):
    stack = _stack_file(tmp_path, "managed")
    code, _, stderr = run_cli(capsys, "monitoring", "render", "--stack-file", str(stack), "--out", str(tmp_path / "o"))
    assert code == 0
    remote = yaml.safe_load((tmp_path / "o" / "prometheus.yml").read_text())["remote_write"][0]
    assert "ws-00000000-0000-0000-0000-000000000000" in remote["url"]
    assert "placeholder workspace" in stderr
    code, _, stderr = run_cli(
        capsys,
        "monitoring",
        "render",
        "--stack-file",
        str(stack),
        "--out",
        str(tmp_path / "o"),
        "--amp-remote-write-url",
        AMP_URL,
    )
    assert code == 0 and "placeholder workspace" not in stderr
    assert yaml.safe_load((tmp_path / "o" / "prometheus.yml").read_text())["remote_write"][0]["url"] == AMP_URL


def test_cli_mode_off_still_renders_and_says_nothing_deploys_them(tmp_path, capsys):
    code, _, stderr = run_cli(
        capsys, "monitoring", "render", "--stack-file", str(_stack_file(tmp_path, "off")), "--out", str(tmp_path / "o")
    )
    assert code == 0 and "mode off: nothing deploys these files" in stderr
    assert (tmp_path / "o" / "rules" / "training.yml").is_file()


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (
            ["--stack", "p5-capacity-block", "--sns-topic-arn", "arn:aws:sqs:us-east-1:123456789012:q"],
            "is not an SNS topic ARN",
        ),
        (
            ["--stack", "p5-capacity-block", "--amp-remote-write-url", "http://localhost:9090/api/v1/write"],
            "is not a workspace remote-write URL",
        ),
        (["--stack", "no-such-stack"], "no stack named 'no-such-stack'"),
        ([], "give exactly one of --stack NAME or --stack-file PATH"),
        (["--stack", "dev", "--stack-file", "x.yaml"], "give exactly one of --stack NAME or --stack-file PATH"),
    ],
)
def test_cli_bad_input_is_one_line_and_writes_nothing(tmp_path, capsys, argv, message):
    out = tmp_path / "o"
    code, _, stderr = run_cli(capsys, "monitoring", "render", "--out", str(out), *argv)
    assert code == 2
    assert stderr.startswith("gpucloud: error: ") and message in stderr and stderr.count("\n") == 1
    assert not out.exists()


def test_cli_out_that_is_a_file_is_refused(tmp_path, capsys):
    target = tmp_path / "file"
    target.write_text("keep me")
    code, _, stderr = run_cli(capsys, "monitoring", "render", "--stack", "dev", "--out", str(target))
    assert code == 2 and "Invalid value for '--out'" in stderr and "is a file" in stderr
    assert target.read_text() == "keep me"


def test_cli_help_teaches_the_files_and_the_placeholders(capsys):
    code, out, _ = run_cli(capsys, "monitoring", "render", "--help")
    assert code == 0
    for text in (
        "prometheus.yml",
        "rules/*.yml",
        "alertmanager.yml",
        "dashboards/*.json",
        "--sns-topic-arn",
        "mode: off",
    ):
        assert text in out, text


BLOCK_SDK = """
import importlib.abc, sys
class NoSdk(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name.split(".")[0] == "grafana_foundation_sdk":
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
sys.meta_path.insert(0, NoSdk())
from gpucloud.cli import main
main(sys.argv[1:])
"""


def test_without_the_deploy_extra_the_cli_says_how_to_get_it_in_one_line(tmp_path):
    import subprocess

    done = subprocess.run(
        [sys.executable, "-c", BLOCK_SDK, "monitoring", "render", "--stack", "dev", "--out", str(tmp_path / "o")],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 2, done.stderr[-2000:]
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "gpucloud[deploy]" in lines[0] and "grafana-foundation-sdk" in lines[0], done.stderr
    assert not (tmp_path / "o").exists()
