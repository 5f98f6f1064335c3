"""Nodes install only the runtime: Pulumi and its providers are the `deploy` extra, which the
README's setup installs on the operator's machine."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import tomllib
from packaging.requirements import Requirement

REPO = Path(__file__).resolve().parents[2]
# Pulumi and its providers, and the dashboards-as-code library the stack's monitoring files are rendered with
DEPLOY_ONLY = {"pulumi", "pulumi-aws", "pulumi-policy", "grafana-foundation-sdk"}
# the commands a node runs (scripts/node-bootstrap.sh starts `gpucloud agent`, which runs attempts, and on a
# managed stack renders its Prometheus agent's configuration with `gpucloud monitoring node-config`)
NODE_COMMANDS = ("agent", "spot-train", "worker", "doctor", "submit", "job", "jobs", "nodes", "monitoring node-config")
BLOCK_PULUMI = """
import importlib.abc, sys
class NoPulumi(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name.split(".")[0] in ("pulumi", "pulumi_aws", "pulumi_policy", "grafana_foundation_sdk"):
            raise ModuleNotFoundError(f"No module named {name!r} (a node has no deploy extra)", name=name)
sys.meta_path.insert(0, NoPulumi())
from gpucloud.cli import main
try:
    main(sys.argv[1:])
except SystemExit as done:
    sys.exit(done.code)
"""


def project() -> dict:
    return tomllib.loads((REPO / "pyproject.toml").read_text())["project"]


def names(requirements: list[str]) -> set[str]:
    return {Requirement(r).name for r in requirements}


def test_pulumi_is_not_a_runtime_dependency() -> None:
    assert not names(project()["dependencies"]) & DEPLOY_ONLY
    assert names(project()["optional-dependencies"]["deploy"]) == DEPLOY_ONLY


def test_the_setup_installs_the_deploy_extra() -> None:
    setup = (REPO / "scripts" / "setup.sh").read_text()
    extras = re.findall(r'extras="([^"]*)"', setup)  # the default and the --test sets
    assert len(extras) == 2 and all("deploy" in e.split(",") for e in extras), extras
    assert "scripts/setup.sh" in (REPO / "README.md").read_text()


def test_the_node_bootstrap_installs_no_extra() -> None:
    bootstrap = (REPO / "scripts" / "node-bootstrap.sh").read_text()
    assert 'pip" install --quiet "$requirement"' in bootstrap and "[deploy]" not in bootstrap


def test_node_commands_run_without_pulumi() -> None:
    for command in NODE_COMMANDS:
        done = subprocess.run(
            [sys.executable, "-c", BLOCK_PULUMI, *command.split(), "--help"],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, (command, done.stderr[-2000:])


def test_plan_without_the_deploy_extra_says_how_to_get_it_in_one_line() -> None:
    done = subprocess.run(
        [sys.executable, "-c", BLOCK_PULUMI, "plan", "--stack", "dev"], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 2, done.stderr[-2000:]
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "deploy extra" in lines[0] and "gpucloud[deploy]" in lines[0], done.stderr


def test_a_managed_node_renders_its_prometheus_agent_config_without_the_deploy_extra(tmp_path) -> None:
    out = tmp_path / "prometheus-agent.yml"
    argv = ["monitoring", "node-config", "--instance-id", "i-0abc12345def67890", "--out", str(out)]
    url = "https://aps-workspaces.us-east-1.amazonaws.com/workspaces/ws-1/api/v1/remote_write"
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "GPUCLOUD_AMP_REMOTE_WRITE_URL": url}
    env |= {"GPUCLOUD_REGION": "us-east-1", "GPUCLOUD_CLUSTER": "p5", "GPUCLOUD_NODE_GROUP": "h100"}
    done = subprocess.run(
        [sys.executable, "-c", BLOCK_PULUMI, *argv], capture_output=True, text=True, timeout=120, env=env
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert f"url: {url}" in out.read_text()
