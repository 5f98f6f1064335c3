"""alertmanager.yml: amtool accepts it, each severity takes its route, everything goes to the SNS topic."""

from __future__ import annotations

import pytest
import yaml

from gpucloud.monitoring.alertmanager import RECEIVERS, alertmanager_config, render_alertmanager

from .conftest import TOPIC, assert_ok, run_tool


@pytest.fixture
def config_file(tmp_path):
    path = tmp_path / "alertmanager.yml"
    path.write_text(render_alertmanager(sns_topic_arn=TOPIC, region="us-east-1", cluster="p5-capacity-block"))
    return path


def test_amtool_accepts_the_config(config_file, amtool):
    result = run_tool([amtool, "check-config", str(config_file)])
    assert_ok(result)
    assert "3 receivers" in result.stdout


def test_amtool_rejects_a_broken_config(tmp_path, amtool):
    # the check above can fail: a route to a receiver that does not exist is refused
    bad = tmp_path / "alertmanager.yml"
    bad.write_text(
        render_alertmanager(sns_topic_arn=TOPIC, region="us-east-1", cluster="c").replace(
            "receiver: sns-info", "receiver: nobody"
        )
    )
    assert run_tool([amtool, "check-config", str(bad)]).returncode != 0


@pytest.mark.parametrize(
    ("labels", "receiver"),
    [
        (["alertname=GpuXidError", "severity=critical"], "sns-critical"),
        (["alertname=GpuMemoryHigh", "severity=warning"], "sns-warning"),
        (["alertname=SpotInterruptionNotice", "severity=info"], "sns-info"),
        (["alertname=Other"], "sns-warning"),
    ],
)
def test_each_severity_takes_its_route(config_file, amtool, labels, receiver):
    result = run_tool([amtool, "config", "routes", "test", f"--config.file={config_file}", *labels])
    assert_ok(result)
    assert result.stdout.strip() == receiver


def test_every_receiver_publishes_to_the_topic_signed_for_its_region():
    config = alertmanager_config(sns_topic_arn=TOPIC, region="eu-west-1")
    assert {r["name"] for r in config["receivers"]} == set(RECEIVERS.values())
    for receiver in config["receivers"]:
        (sns,) = receiver["sns_configs"]
        assert sns["topic_arn"] == TOPIC and sns["sigv4"] == {"region": "eu-west-1"}
        assert sns["send_resolved"] is True


def test_info_and_warnings_are_held_back_while_a_critical_fires_on_the_node():
    (inhibit,) = alertmanager_config(sns_topic_arn=TOPIC, region="us-east-1")["inhibit_rules"]
    assert inhibit == {
        "source_matchers": ['severity="critical"'],
        "target_matchers": ['severity=~"info|warning"'],
        "equal": ["instance_id"],
    }


def test_critical_pages_sooner_and_repeats_more_often_than_warnings():
    route = alertmanager_config(sns_topic_arn=TOPIC, region="us-east-1")["route"]
    by_severity = {r["matchers"][0]: r for r in route["routes"]}
    critical = by_severity['severity="critical"']
    assert critical["group_wait"] == "10s" and critical["repeat_interval"] == "1h"
    assert route["repeat_interval"] == "4h" and route["group_by"] == ["alertname", "instance_id"]
    assert by_severity['severity="info"']["group_by"] == ["alertname", "node_group"]


def test_the_file_names_the_topic_in_its_header():
    text = render_alertmanager(sns_topic_arn=TOPIC, region="us-east-1", cluster="c")
    assert text.startswith("# Alertmanager for gpucloud cluster c")
    assert yaml.safe_load(text)["receivers"][0]["sns_configs"][0]["topic_arn"] == TOPIC
