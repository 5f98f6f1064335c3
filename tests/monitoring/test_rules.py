"""The alerting rules: promtool checks them, and ``promtool test rules`` runs the cases in
rule_tests/ for every alert: where it must fire and where it must not."""

from __future__ import annotations

import dataclasses
import re
import shutil
from pathlib import Path

import pytest
import yaml

from gpucloud.monitoring.names import CRITICAL_XIDS
from gpucloud.monitoring.rules import ALERTS, SEVERITIES, Alert, alert_names, render_rules, rule_groups
from gpucloud.monitoring.yamltext import dump

from .conftest import assert_ok, run_tool

RULE_TESTS = Path(__file__).parent / "rule_tests"
ISSUE_13_ALERTS = {
    "GpuXidError",
    "GpuEccDoubleBit",
    "GpuRowRemapFailure",
    "GpuThermalThrottling",
    "GpuIdleWhileJobRunning",
    "GpuMemoryHigh",
    "TrainingStalled",
    "CheckpointFailing",
    "NodeAgentDown",
    "SpotInterruptionNotice",
}


def _stage(tmp_path: Path, rules: dict[str, str]) -> list[str]:
    """The rule files and the test files in one directory, as promtool resolves them."""
    for relative, text in rules.items():
        path = tmp_path / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    names = []
    for test in sorted(RULE_TESTS.glob("*_test.yml")):
        shutil.copy(test, tmp_path / test.name)
        names.append(test.name)
    return names


def test_the_alerts_are_the_ones_the_issue_names():
    assert set(alert_names()) == ISSUE_13_ALERTS


def test_promtool_checks_the_rules(tmp_path, promtool):
    files = _stage(tmp_path, render_rules())
    assert files
    assert_ok(run_tool([promtool, "check", "rules", *sorted(render_rules())], cwd=tmp_path))


def test_promtool_unit_tests_pass(tmp_path, promtool):
    tests = _stage(tmp_path, render_rules())
    assert_ok(run_tool([promtool, "test", "rules", *tests], cwd=tmp_path))


def _cases() -> dict[str, dict[str, int]]:
    """Per alert: how many evaluations expect it to fire, and how many expect silence."""
    seen: dict[str, dict[str, int]] = {}
    for path in RULE_TESTS.glob("*_test.yml"):
        for test in yaml.safe_load(path.read_text())["tests"]:
            for case in test.get("alert_rule_test", []):
                counts = seen.setdefault(case["alertname"], {"fires": 0, "silent": 0})
                counts["fires" if case.get("exp_alerts") else "silent"] += 1
    return seen


def test_every_alert_has_a_case_that_fires_and_one_that_must_not():
    cases = _cases()
    for name in alert_names():
        assert cases.get(name, {}).get("fires"), f"{name}: no promtool case where it fires"
        assert cases[name]["silent"], f"{name}: no promtool case where it must stay silent"


def test_every_rule_file_is_tested():
    tested = {f for path in RULE_TESTS.glob("*_test.yml") for f in yaml.safe_load(path.read_text())["rule_files"]}
    assert tested == set(render_rules())


def _mutated(name: str, **changes: str) -> dict[str, str]:
    """The rules with ``name``'s changed (``name/severity``: only that severity's rule)."""
    name, _, severity = name.partition("/")
    alerts = [
        dataclasses.replace(a, **changes) if a.name == name and severity in ("", a.severity) else a for a in ALERTS
    ]
    return {f"rules/{group}.yml": dump(doc) for group, doc in rule_groups(alerts).items()}


@pytest.mark.parametrize(
    ("name", "changes", "symptom"),
    [
        # without the join, i-0bbb's GPU idling with no attempt would page someone
        ("GpuIdleWhileJobRunning", {"expr": "DCGM_FI_DEV_GPU_UTIL < 10"}, "GpuIdleWhileJobRunning"),
        # the last-value gauge misses the second XID 79: the count in the description stays 1
        (
            "GpuXidError",
            {"expr": "changes(DCGM_FI_DEV_XID_ERRORS[10m]) > 0 and DCGM_FI_DEV_XID_ERRORS == 79"},
            "GpuXidError",
        ),
        # increase() alone does not see a labelled counter born at 1
        ("SpotInterruptionNotice", {"expr": "increase(gpucloud_notices_total[5m]) > 0"}, "SpotInterruptionNotice"),
        ("GpuMemoryHigh", {"for_": "1m"}, "GpuMemoryHigh"),
        # absent() is one label-less series, for the whole cluster: any node's step hides j-4's missing one
        (
            "TrainingStalled/warning",
            {"expr": "gpucloud_attempt_running == 1 and on () absent(gpucloud_training_step)"},
            "TrainingStalled",
        ),
        # j-5's first step came at 6m: a shorter wait warns about a restore that was merely slow
        ("TrainingStalled/warning", {"for_": "5m"}, "TrainingStalled"),
    ],
)
def test_the_unit_tests_catch_a_wrong_rule(tmp_path, promtool, name, changes, symptom):
    tests = _stage(tmp_path, _mutated(name, **changes))
    result = run_tool([promtool, "test", "rules", *tests], cwd=tmp_path)
    assert result.returncode != 0
    assert f"alertname: {symptom}" in result.stdout + result.stderr


@pytest.mark.parametrize("alert", ALERTS, ids=lambda a: f"{a.name}-{a.severity}")
def test_every_alert_has_severity_summary_naming_node_and_gpu_and_a_runbook(alert: Alert):
    rule = alert.to_rule()
    assert rule["labels"]["severity"] in SEVERITIES
    summary = rule["annotations"]["summary"]
    assert "$labels.instance_id" in summary
    assert "$labels.gpu" in summary or "all GPUs" in summary
    assert len(rule["annotations"]["runbook"]) > 20 and "\n" not in rule["annotations"]["runbook"]
    assert rule["annotations"]["runbook_url"] == f"docs/monitoring.md#{alert.name.lower()}"


def test_critical_xids_page_and_the_rest_warn():
    xid = {a.severity: a.expr for a in ALERTS if a.name == "GpuXidError"}
    codes = "|".join(str(c) for c in CRITICAL_XIDS)
    assert set(CRITICAL_XIDS) == {48, 63, 64, 74, 79, 94, 95}
    assert f'xid=~"{codes}"' in xid["critical"] and f'xid!~"{codes}"' in xid["warning"]


def test_spot_notices_are_info_and_hardware_faults_page():
    severity = {a.name: a.severity for a in ALERTS if a.name not in ("GpuXidError", "TrainingStalled")}
    assert severity["SpotInterruptionNotice"] == "info"
    for name in ("GpuEccDoubleBit", "GpuRowRemapFailure", "NodeAgentDown"):
        assert severity[name] == "critical"
    # a step that stopped moving pages; no step at all warns (a long setup or a script without the session)
    stalled = {a.severity: a.expr for a in ALERTS if a.name == "TrainingStalled"}
    assert set(stalled) == {"critical", "warning"}
    assert "unless on (instance_id, job_id) gpucloud_training_step" in stalled["warning"]


def test_an_unknown_severity_is_refused():
    with pytest.raises(ValueError, match="severity 'page'"):
        rule_groups([dataclasses.replace(ALERTS[0], severity="page")])


def test_the_rules_header_says_how_xids_are_counted():
    text = render_rules()["rules/gpu-health.yml"]
    assert re.search(r"^# .*DCGM_EXP_XID_ERRORS_COUNT", text, re.M)
    assert "changes() cannot see it" in text


def test_every_runbook_url_has_its_section_in_the_docs():
    doc = (Path(__file__).resolve().parents[2] / "docs" / "monitoring.md").read_text()
    headings = {line[4:].strip().lower() for line in doc.splitlines() if line.startswith("### ")}
    for alert in ALERTS:
        anchor = alert.to_rule()["annotations"]["runbook_url"].split("#", 1)[1]
        assert anchor in headings, f"docs/monitoring.md has no '### {alert.name}' section"
