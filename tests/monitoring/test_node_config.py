"""Managed mode's per-node Prometheus agent configuration (``gpucloud monitoring node-config``): the
real promtool accepts it in agent mode, it scrapes what the rendered managed prometheus.yml scrapes
(same jobs, honor_labels, remote write) from 127.0.0.1, and bad input is a one-line error."""

from __future__ import annotations

import pytest
import yaml

from gpucloud.monitoring import ec2_prometheus_config
from gpucloud.monitoring.prometheus_config import node_agent_config

from .conftest import AMP_URL, assert_ok, run_tool
from .test_render_cli import run_cli

NODE = {"cluster": "p5", "region": "us-east-1", "instance_id": "i-0abc12345def67890", "node_group": "h100"}


def test_promtool_accepts_the_node_agent_config_in_agent_mode_and_not_a_broken_one(tmp_path, promtool):
    text = node_agent_config(**NODE, remote_write_url=AMP_URL)
    (tmp_path / "agent.yml").write_text(text)
    assert_ok(run_tool([promtool, "check", "config", "--agent", "agent.yml"], cwd=tmp_path))
    (tmp_path / "broken.yml").write_text(text.replace("job_name: node-exporter", "job_nam: x"))
    assert run_tool([promtool, "check", "config", "--agent", "broken.yml"], cwd=tmp_path).returncode != 0


def test_the_node_config_scrapes_what_the_managed_prometheus_yml_scrapes_from_the_node_itself():
    node = yaml.safe_load(node_agent_config(**NODE, remote_write_url=AMP_URL, agent_port=9500))
    cluster = yaml.safe_load(
        ec2_prometheus_config(cluster="p5", region="us-east-1", mode="managed", remote_write_url=AMP_URL)
    )
    by_job = {j["job_name"]: j for j in node["scrape_configs"]}
    assert [(j["job_name"], j["honor_labels"]) for j in node["scrape_configs"]] == [
        (j["job_name"], j["honor_labels"]) for j in cluster["scrape_configs"]
    ]
    assert node["remote_write"] == cluster["remote_write"]
    assert node["global"]["scrape_interval"] == cluster["global"]["scrape_interval"]
    # the labels discovery's relabelling gives in self-hosted mode, on every sample written
    assert node["global"]["external_labels"] == {
        "cluster": "p5",
        "instance_id": NODE["instance_id"],
        "node_group": "h100",
    }
    targets = {job: j["static_configs"][0]["targets"] for job, j in by_job.items()}
    assert targets == {
        "dcgm-exporter": ["127.0.0.1:9400"],
        "node-exporter": ["127.0.0.1:9100"],
        "gpucloud-agent": ["127.0.0.1:9500"],
    }
    assert "rule_files" not in node and "alerting" not in node  # the workspace evaluates the rules


def node_config_argv(out, **overrides: str) -> list[str]:
    values = {"remote-write-url": AMP_URL, "region": "us-east-1", "cluster": "p5", "node-group": "h100"}
    values |= {"instance-id": NODE["instance_id"], **overrides}
    return ["monitoring", "node-config", *(x for k, v in values.items() for x in (f"--{k}", v)), "--out", str(out)]


def test_the_command_writes_the_rendered_config(tmp_path, capsys):
    out = tmp_path / "etc" / "prometheus-agent.yml"
    code, _, err = run_cli(capsys, *node_config_argv(out))
    assert code == 0, err
    assert out.read_text() == node_agent_config(**NODE, remote_write_url=AMP_URL)


@pytest.mark.parametrize(
    ("option", "value"),
    [
        ("remote-write-url", "https://example.com/api/v1/remote_write"),
        ("region", "useast1"),
        ("instance-id", "i-0abc"),
        ("node-group", "h100 gpus"),
        ("cluster", ""),
    ],
)
def test_bad_input_is_a_one_line_error_naming_the_option_and_writes_nothing(tmp_path, capsys, option, value):
    out = tmp_path / "prometheus-agent.yml"
    code, _, err = run_cli(capsys, *node_config_argv(out, **{option: value}))
    assert code == 2
    assert err.startswith(f"gpucloud: error: --{option} {value!r} is not valid; expected ") and err.count("\n") == 1
    assert not out.exists()
