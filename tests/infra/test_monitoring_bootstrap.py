"""What scripts/node-bootstrap.sh starts for monitoring, run for real in bash with the system calls
stubbed: no exporter when monitoring is off; node_exporter with the infiniband collector and
dcgm-exporter with the wheel's counters file otherwise; managed nodes add Prometheus in agent mode,
whose configuration the real ``gpucloud monitoring node-config`` renders (the agent venv's ``gpucloud``
is this checkout's) and the real ``promtool`` accepts."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from gpucloud.infra.userdata import USER_DATA_LIMIT, render_user_data, without_comment_lines

REPO = Path(__file__).resolve().parents[2]
BOOTSTRAP = REPO / "scripts" / "node-bootstrap.sh"
FUNCTIONS = (
    "retry",
    "imds_instance_id",
    "ensure_release",
    "exporter_unit",
    "start_exporters",
    "start_prometheus_agent",
)
RECORD = '#!/bin/sh\necho "$(basename "$0") $*" >> "$CALLS"\n'
IMDS_CURL = '#!/bin/sh\necho "curl $*" >> "$CALLS"\ncase "$*" in *instance-id*) echo i-0abc12345def67890 ;; *) echo token ;; esac\n'
PYTHON = '#!/bin/sh\necho "/site/gpucloud/monitoring/dcgm-counters.csv"\n'
GPUCLOUD = f'#!/bin/sh\necho "gpucloud $*" >> "$CALLS"\nexec {sys.executable} -m gpucloud "$@"\n'  # the real CLI


def function_source(name: str) -> str:
    text = BOOTSTRAP.read_text()
    start = text.index(f"\n{name}() {{") + 1
    return text[start : text.index("\n}\n", start) + 3]


def run(tmp_path: Path, mode: str, *, dcgm_active: bool = True) -> tuple[int, str, Path]:
    stubs, agent, units, conf = tmp_path / "stubs", tmp_path / "agent", tmp_path / "units", tmp_path / "conf"
    for d in (stubs, agent / "venv" / "bin", units):
        d.mkdir(parents=True)
    bodies = {
        "systemctl": RECORD + (f'case "$*" in *is-active*) exit {0 if dcgm_active else 3} ;; esac\n'),
        "node_exporter": RECORD,
        "dcgm-exporter": RECORD,
        "prometheus": RECORD,
        "curl": IMDS_CURL,
        "apt-get": RECORD,
    }
    for name, body in bodies.items():
        (stubs / name).write_text(body)
        (stubs / name).chmod(0o755)
    (agent / "venv" / "bin" / "python").write_text(PYTHON)
    (agent / "venv" / "bin" / "gpucloud").write_text(GPUCLOUD)
    for tool in ("python", "gpucloud"):
        (agent / "venv" / "bin" / tool).chmod(0o755)
    script = "\n".join(
        [
            "set -euo pipefail",
            'log() { echo "LOG: $*"; }',
            f"AGENT_DIR={agent} UNIT_DIR={units} CONF_DIR={conf}",
            f"GPUCLOUD_MONITORING={mode} GPUCLOUD_RETRY_ATTEMPTS=2 GPUCLOUD_CLUSTER=p5 GPUCLOUD_NODE_GROUP=h100",
            "GPUCLOUD_REGION=us-east-1 GPUCLOUD_METRICS_PORT=9401 GPUCLOUD_NODE_EXPORTER_VERSION=1.10.2",
            "GPUCLOUD_PROMETHEUS_VERSION=3.5.0 GPUCLOUD_DCGM_EXPORTER_VERSION=4.4.2-4.7.1",
            "GPUCLOUD_AMP_REMOTE_WRITE_URL=https://aps-workspaces.us-east-1.amazonaws.com/workspaces/ws-1/api/v1/remote_write",
            *(function_source(f) for f in FUNCTIONS),
            "start_exporters",
        ]
    )
    env = {"PATH": f"{stubs}:/usr/bin:/bin", "CALLS": str(tmp_path / "calls"), "HOME": str(tmp_path)}
    proc = subprocess.run(["bash", "-c", script], env=env, capture_output=True, text=True, timeout=30)
    return proc.returncode, proc.stdout + proc.stderr, tmp_path


def exec_start(unit: Path) -> str:
    return next(line for line in unit.read_text().splitlines() if line.startswith("ExecStart="))


def test_off_starts_nothing(tmp_path):
    code, out, root = run(tmp_path, "off")
    assert code == 0, out
    assert not list((root / "units").iterdir())
    assert "monitoring: off" in out


def test_self_hosted_starts_node_and_dcgm_exporters(tmp_path):
    code, out, root = run(tmp_path, "self-hosted")
    assert code == 0, out
    units = root / "units"
    assert sorted(p.name for p in units.iterdir()) == [
        "gpucloud-dcgm-exporter.service",
        "gpucloud-node-exporter.service",
    ]
    node = exec_start(units / "gpucloud-node-exporter.service")
    assert node.endswith("/node_exporter --collector.infiniband --web.listen-address=:9100")
    dcgm = exec_start(units / "gpucloud-dcgm-exporter.service")
    assert "-f /site/gpucloud/monitoring/dcgm-counters.csv -a :9400 -r localhost:5555" in dcgm
    calls = (root / "calls").read_text()
    assert "systemctl enable --now gpucloud-node-exporter.service" in calls


def test_dcgm_exporter_embeds_the_host_engine_when_none_runs(tmp_path):
    code, out, root = run(tmp_path, "self-hosted", dcgm_active=False)
    assert code == 0, out
    assert exec_start(root / "units" / "gpucloud-dcgm-exporter.service").endswith("-a :9400")


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool comes with scripts/setup.sh --test")
def test_managed_adds_a_prometheus_agent_that_promtool_accepts(tmp_path):
    code, out, root = run(tmp_path, "managed")
    assert code == 0, out
    config_path = root / "conf" / "prometheus-agent.yml"
    config = yaml.safe_load(config_path.read_text())
    jobs = {j["job_name"]: j for j in config["scrape_configs"]}
    assert set(jobs) == {"dcgm-exporter", "node-exporter", "gpucloud-agent"}
    assert jobs["gpucloud-agent"]["static_configs"][0]["targets"] == ["127.0.0.1:9401"]
    assert jobs["gpucloud-agent"]["honor_labels"] is True and jobs["node-exporter"]["honor_labels"] is False
    labels = config["global"]["external_labels"]
    assert labels == {"cluster": "p5", "instance_id": "i-0abc12345def67890", "node_group": "h100"}
    assert "monitoring node-config" in (root / "calls").read_text()  # rendered, not written inline
    [remote] = config["remote_write"]
    assert remote["sigv4"] == {"region": "us-east-1"} and remote["url"].endswith("/ws-1/api/v1/remote_write")
    assert "--agent" in exec_start(root / "units" / "gpucloud-prometheus-agent.service")
    check = subprocess.run(
        ["promtool", "check", "config", "--agent", str(config_path)], capture_output=True, text=True, timeout=60
    )
    assert check.returncode == 0, check.stdout + check.stderr


def test_user_data_drops_comment_lines_only():
    script = "#!/usr/bin/env bash\n# a comment\n  #\nx=1  # kept\necho '#not a comment'\n#!!keep\n"
    assert without_comment_lines(script) == "#!/usr/bin/env bash\nx=1  # kept\necho '#not a comment'\n#!!keep\n"


def test_node_user_data_with_monitoring_settings_fits_ec2s_limit():
    settings = {f"GPUCLOUD_SETTING_{i}": "x" * 100 for i in range(20)}  # more than a stack sets
    text = render_user_data(settings)
    assert len(text.encode()) < USER_DATA_LIMIT
    body = text.split("<<'GPUCLOUD_BOOTSTRAP'\n", 1)[1]
    assert "start_exporters" in body and "\n# " not in body


# --- fetching a pinned release on an AMI without it -------------------------------------------------

CURL_FROM_DIR = '#!/bin/sh\nfor last; do :; done\nout=""\nwhile [ $# -gt 0 ]; do [ "$1" = -o ] && out="$2"; shift; done\ncp "$RELEASES/$(basename "$last")" "$out"\n'


def fetch(tmp_path: Path, corrupt: bool = False) -> tuple[int, str, Path]:
    import hashlib
    import tarfile

    releases, stubs, bin_dir = tmp_path / "releases", tmp_path / "stubs", tmp_path / "bin"
    for d in (releases, stubs, bin_dir):
        d.mkdir()
    folder = tmp_path / "node_exporter-1.10.2.linux-amd64"
    folder.mkdir()
    (folder / "node_exporter").write_text("#!/bin/sh\necho node_exporter, version 1.10.2\n")
    tarball = releases / "node_exporter-1.10.2.linux-amd64.tar.gz"
    with tarfile.open(tarball, "w:gz") as tar:
        tar.add(folder, arcname=folder.name)
    digest = hashlib.sha256(tarball.read_bytes()).hexdigest()
    if corrupt:
        digest = "0" * 64
    (releases / "sha256sums.txt").write_text(f"{'1' * 64}  other.tar.gz\n{digest}  {tarball.name}\n")
    (stubs / "curl").write_text(CURL_FROM_DIR)
    (stubs / "curl").chmod(0o755)
    script = "\n".join(
        [
            "set -euo pipefail",
            'log() { echo "LOG: $*"; }',
            f"BIN_DIR={bin_dir} GPUCLOUD_RETRY_ATTEMPTS=1",
            function_source("retry"),
            function_source("ensure_release"),
            "ensure_release node_exporter 1.10.2",
        ]
    )
    env = {"PATH": f"{stubs}:/usr/bin:/bin", "RELEASES": str(releases), "HOME": str(tmp_path)}
    proc = subprocess.run(["bash", "-c", script], env=env, capture_output=True, text=True, timeout=30)
    return proc.returncode, proc.stdout + proc.stderr, bin_dir


def test_a_missing_exporter_is_fetched_and_checked(tmp_path):
    code, out, bin_dir = fetch(tmp_path)
    assert code == 0, out
    installed = bin_dir / "node_exporter"
    assert subprocess.run([str(installed)], capture_output=True, text=True).stdout.startswith("node_exporter, version")


def test_a_release_that_fails_its_checksum_is_not_installed(tmp_path):
    code, out, bin_dir = fetch(tmp_path, corrupt=True)
    assert code != 0
    assert "checksum mismatch" in out and not (bin_dir / "node_exporter").exists()


# --- the monitor's Grafana package ------------------------------------------------------------------

MONITOR = REPO / "scripts" / "monitor-bootstrap.sh"


@pytest.mark.parametrize(
    ("sha_line", "installed"),
    [("{digest}\n", True), ("{digest}  grafana_12.1.1_amd64.deb\n", True), ("{bad}\n", False)],
    ids=["hash-only", "hash-and-name", "mismatch"],
)
def test_monitor_installs_grafana_only_when_its_checksum_matches(tmp_path, sha_line, installed):
    import hashlib

    releases, stubs = tmp_path / "releases", tmp_path / "stubs"
    releases.mkdir()
    stubs.mkdir()
    deb = releases / "grafana_12.1.1_amd64.deb"
    deb.write_bytes(b"not really a deb")
    digest = hashlib.sha256(deb.read_bytes()).hexdigest()
    (releases / f"{deb.name}.sha256").write_text(sha_line.format(digest=digest, bad="0" * 64))
    for name, body in (("curl", CURL_FROM_DIR), ("apt-get", RECORD)):
        (stubs / name).write_text(body)
        (stubs / name).chmod(0o755)
    text = MONITOR.read_text()

    def source(name: str) -> str:
        start = text.index(f"\n{name}() {{") + 1
        return text[start : text.index("\n}\n", start) + 3]

    script = "\n".join(
        [
            "set -euo pipefail",
            'log() { echo "LOG: $*"; }',
            "GPUCLOUD_GRAFANA_VERSION=12.1.1",
            source("retry"),
            source("install_grafana"),
            "install_grafana",
        ]
    )
    env = {"PATH": f"{stubs}:/usr/bin:/bin", "RELEASES": str(releases), "CALLS": str(tmp_path / "calls")}
    proc = subprocess.run(["bash", "-c", script], env=env, capture_output=True, text=True, timeout=30)
    calls = (tmp_path / "calls").read_text() if (tmp_path / "calls").exists() else ""
    assert (proc.returncode == 0) == installed, proc.stdout + proc.stderr
    assert ("grafana_12.1.1_amd64.deb" in calls) == installed
