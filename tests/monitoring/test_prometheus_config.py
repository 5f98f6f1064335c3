"""prometheus.yml: checked by promtool in every mode, and the discovery, relabelling and labels the
rules and dashboards join on."""

from __future__ import annotations

import pytest
import yaml

from gpucloud.cluster import monitoring_plan
from gpucloud.monitoring import StaticTarget, ec2_prometheus_config, render, static_prometheus_config
from gpucloud.monitoring.names import AGENT_JOB, DCGM_JOB, EXPORTER_PORTS, NODE_JOB
from gpucloud.monitoring.prometheus_config import meta_tag_label

from .conftest import AMP_URL, TOPIC, assert_ok, run_tool, shipped_spec


def _write(tmp_path, files):
    for relative, text in files.items():
        path = tmp_path / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


@pytest.mark.parametrize("mode", ["self-hosted", "managed", "off"])
def test_promtool_accepts_the_rendered_config(tmp_path, promtool, mode):
    files = render(shipped_spec(mode=mode), "p5-capacity-block", sns_topic_arn=TOPIC, amp_remote_write_url=AMP_URL)
    _write(tmp_path, files)
    result = run_tool([promtool, "check", "config", "prometheus.yml"], cwd=tmp_path)
    assert_ok(result)
    # self-hosted also finds and checks the rule files it names
    if mode != "managed":
        assert "3 rule files found" in result.stdout + result.stderr


def test_promtool_rejects_a_broken_config(tmp_path, promtool):
    # the check above can fail: a scrape job without its name is refused
    text = ec2_prometheus_config(cluster="c", region="us-east-1").replace("job_name: node-exporter", "job_nam: x")
    (tmp_path / "prometheus.yml").write_text(text)
    (tmp_path / "rules").mkdir()
    assert run_tool([promtool, "check", "config", "prometheus.yml"], cwd=tmp_path).returncode != 0


def test_promtool_accepts_the_static_config(tmp_path, promtool):
    targets = [
        StaticTarget(DCGM_JOB, "127.0.0.1:9400", "i-0aaa", "p5"),
        StaticTarget(NODE_JOB, "127.0.0.1:9100", "i-0aaa", "p5"),
        StaticTarget(AGENT_JOB, "127.0.0.1:9108", "i-0aaa", "p5"),
    ]
    (tmp_path / "prometheus.yml").write_text(static_prometheus_config(targets, alertmanager="127.0.0.1:9093"))
    (tmp_path / "rules").mkdir()
    assert_ok(run_tool([promtool, "check", "config", "prometheus.yml"], cwd=tmp_path))
    doc = yaml.safe_load((tmp_path / "prometheus.yml").read_text())
    agent = next(j for j in doc["scrape_configs"] if j["job_name"] == AGENT_JOB)
    assert agent["static_configs"] == [
        {"targets": ["127.0.0.1:9108"], "labels": {"instance_id": "i-0aaa", "node_group": "p5"}}
    ]
    assert agent["honor_labels"] is True
    assert doc["rule_files"] == ["rules/*.yml"]
    assert doc["alerting"]["alertmanagers"][0]["static_configs"][0]["targets"] == ["127.0.0.1:9093"]


def test_static_config_refuses_an_unknown_job():
    with pytest.raises(ValueError, match="unknown scrape job 'dcgm'"):
        static_prometheus_config([StaticTarget("dcgm", "127.0.0.1:1", "i-0aaa", "p5")])


def test_every_exporter_is_discovered_by_the_cluster_tag_on_private_ips():
    doc = yaml.safe_load(ec2_prometheus_config(cluster="research", region="eu-west-1"))
    jobs = {j["job_name"]: j for j in doc["scrape_configs"]}
    assert set(jobs) == {DCGM_JOB, NODE_JOB, AGENT_JOB}
    for name, job in jobs.items():
        (sd,) = job["ec2_sd_configs"]
        assert sd["region"] == "eu-west-1" and sd["port"] == EXPORTER_PORTS[name]
        assert {"name": "tag:gpucloud:cluster", "values": ["research"]} in sd["filters"]
        relabel = job["relabel_configs"]
        # only node-group members (the monitor carries the cluster tag too), addressed by private IP
        assert relabel[0] == {
            "source_labels": ["__meta_ec2_tag_gpucloud_node_group"],
            "regex": ".+",
            "action": "keep",
        }
        address = next(r for r in relabel if r.get("target_label") == "__address__")
        assert address["source_labels"] == ["__meta_ec2_private_ip"]
        assert address["replacement"] == f"$1:{EXPORTER_PORTS[name]}"
        assert {"source_labels": ["__meta_ec2_instance_id"], "target_label": "instance_id"} in relabel
        assert {"source_labels": ["__meta_ec2_tag_gpucloud_node_group"], "target_label": "node_group"} in relabel
        assert job["honor_labels"] is (name == AGENT_JOB)


def test_tag_labels_are_sanitised_as_prometheus_does():
    assert meta_tag_label("gpucloud:node-group") == "__meta_ec2_tag_gpucloud_node_group"
    assert meta_tag_label("team.name") == "__meta_ec2_tag_team_name"


def test_self_hosted_evaluates_rules_and_alerts_locally():
    doc = yaml.safe_load(ec2_prometheus_config(cluster="c", region="us-east-1"))
    assert doc["rule_files"] == ["rules/*.yml"]
    assert doc["alerting"]["alertmanagers"][0]["static_configs"][0]["targets"] == ["localhost:9093"]
    assert "remote_write" not in doc


def test_managed_remote_writes_with_sigv4_and_leaves_rules_to_the_workspace():
    doc = yaml.safe_load(
        ec2_prometheus_config(cluster="c", region="us-west-2", mode="managed", remote_write_url=AMP_URL)
    )
    (remote,) = doc["remote_write"]
    assert remote["url"] == AMP_URL and remote["sigv4"] == {"region": "us-west-2"}
    assert "rule_files" not in doc and "alerting" not in doc


def test_managed_without_a_workspace_url_is_refused():
    with pytest.raises(ValueError, match="remote-write URL"):
        ec2_prometheus_config(cluster="c", region="us-east-1", mode="managed")
    with pytest.raises(ValueError, match="amp_remote_write_url"):
        render(shipped_spec(mode="managed"), "p5-capacity-block", sns_topic_arn=TOPIC)


def test_ports_are_the_exporters_defaults_and_the_agents():
    from gpucloud.agent.metrics import DEFAULT_PORT

    assert EXPORTER_PORTS == {DCGM_JOB: 9400, NODE_JOB: 9100, AGENT_JOB: DEFAULT_PORT}
    assert monitoring_plan.AGENT_METRICS_PORT == DEFAULT_PORT
