"""The daily report on the self-hosted monitor: the stack's setting, the role's permissions, and the
systemd timer and script the bootstrap writes (run for real in bash, with gpucloud and aws stubbed)."""

from __future__ import annotations

import base64
import json
import shlex
import subprocess
from pathlib import Path

import pulumi

from gpucloud.cluster.tags import Tagging
from gpucloud.infra.monitoring_selfhosted import (
    REPORTS_PREFIX,
    DailyReport,
    SelfHostedMonitor,
    SelfHostedMonitorArgs,
    report_policy_document,
)
from gpucloud.infra.preview import mocked_runtime, recorded_resources

REPO = Path(__file__).resolve().parents[2]
BOOTSTRAP = REPO / "scripts" / "monitor-bootstrap.sh"
TABLE_ARN = "arn:aws:dynamodb:us-east-1:123456789012:table/p5-jobs"
BUCKET_ARN = "arn:aws:s3:::p5-bucket"
QUEUE = "aws://us-east-1?table=p5-jobs&queue=https://sqs.us-east-1.amazonaws.com/123456789012/p5-jobs"
QUEUE_ARN = "arn:aws:sqs:us-east-1:123456789012:p5-jobs"
DLQ_ARN = "arn:aws:sqs:us-east-1:123456789012:p5-jobs-dlq"


def function_source(name: str) -> str:
    text = BOOTSTRAP.read_text()
    start = text.index(f"\n{name}() {{") + 1
    return text[start : text.index("\n}\n", start) + 3]


# ------------------------------------------------------------------------------ the stack side


def monitor(report: DailyReport | None):
    @pulumi.runtime.test
    def run() -> None:
        SelfHostedMonitor(
            "mon",
            SelfHostedMonitorArgs(
                tagging=Tagging(stack="s", cluster="p5"),
                region="us-east-1",
                vpc_id="vpc-1",
                subnet_id="subnet-1",
                node_security_group_id="sg-1",
                bucket_name="p5-bucket",
                bucket_arn=BUCKET_ARN,
                instance_type="t3.medium",
                retention_days=15,
                series=10_000,
                prometheus_version="3.5.0",
                render_files=lambda arn: {"prometheus.yml": "# stand-in\n"},
                topic_name="p5-alerts",
                report=report,
            ),
        )

    with mocked_runtime("s", "us-east-1", "us-east-1a") as (_, recorder):
        run()
    return recorded_resources(recorder)


def monitor_env(resources) -> dict[str, str]:
    [instance] = [r for r in resources if r.type == "aws:ec2/instance:Instance"]
    script = base64.b64decode(instance.inputs["userDataBase64"]).decode()
    body = script.split("<<'GPUCLOUD_ENV'\n", 1)[1].split("\nGPUCLOUD_ENV\n", 1)[0]
    return {name: shlex.split(value)[0] for name, value in (line.split("=", 1) for line in body.splitlines())}


def role_policies(resources) -> dict[str, dict]:
    return {r.name: json.loads(r.inputs["policy"]) for r in resources if r.type == "aws:iam/rolePolicy:RolePolicy"}


def test_the_report_setting_tells_the_bootstrap_and_grants_only_what_the_report_needs():
    resources = monitor(
        DailyReport(
            queue_uri=QUEUE,
            table_arn=TABLE_ARN,
            package="s3://p5-bucket/agent/",
            queue_arn=QUEUE_ARN,
            dead_letter_queue_arn=DLQ_ARN,
        )
    )
    env = monitor_env(resources)
    assert env["GPUCLOUD_REPORT_SCHEDULE"] == "daily"
    assert env["GPUCLOUD_QUEUE"] == QUEUE
    assert env["GPUCLOUD_REPORTS"] == f"s3://p5-bucket/{REPORTS_PREFIX}"
    assert env["GPUCLOUD_REPORT_PACKAGE"] == "s3://p5-bucket/agent/"
    assert env["GPUCLOUD_ALERT_TOPIC_ARN"] == "arn:aws:sns:us-east-1:123456789012:p5-alerts"  # the topic it creates
    policies = role_policies(resources)
    assert policies["mon-report"] == report_policy_document(
        BUCKET_ARN, TABLE_ARN, QUEUE_ARN, DLQ_ARN, "s3://p5-bucket/agent/"
    )
    statements = {s["Sid"]: s for s in policies["mon-report"]["Statement"]}
    assert statements["ReadJobTable"]["Action"] == ["dynamodb:GetItem", "dynamodb:Query"]  # read only
    assert statements["ReadJobTable"]["Resource"] == [TABLE_ARN, f"{TABLE_ARN}/index/*"]
    assert statements["WriteReports"] == {
        "Sid": "WriteReports",
        "Effect": "Allow",
        "Action": ["s3:PutObject"],
        "Resource": [f"{BUCKET_ARN}/reports/*"],
    }
    # The summary goes to the alert topic with the monitor's existing permission.
    access = {s["Sid"]: s for s in policies["mon-access"]["Statement"]}
    assert access["PublishAlerts"]["Action"] == ["sns:Publish"]


def test_without_the_setting_there_is_no_report_and_no_extra_permission():
    resources = monitor(None)
    assert "GPUCLOUD_REPORT_SCHEDULE" not in monitor_env(resources)
    assert set(role_policies(resources)) == {"mon-access"}


# ------------------------------------------------------------------------------ the monitor side

GPUCLOUD_STUB = """#!/bin/bash
echo "gpucloud $*" >> "$CALLS"
out=""; prev=""
for arg in "$@"; do [[ "$prev" == --out ]] && out="$arg"; prev="$arg"; done
if [[ "$out" == s3://* ]]; then exit 0; fi
printf 'gpucloud report A .. B\\njobs: 3   GPU-hours: 48.00   cost: $300.00\\nwaste rate: 12.0%%\\n\\njob\\tstate\\nj1\\tfinished\\n' > "$out"
"""
AWS_STUB = """#!/bin/bash
echo "aws $*" >> "$CALLS"
for arg in "$@"; do [[ "$arg" == file://* ]] && cat "${arg#file://}" > "$MESSAGE"; done
exit 0
"""


def bootstrap_run(tmp_path: Path, body: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    stubs = tmp_path / "stubs"
    stubs.mkdir(exist_ok=True)
    for name, text in {
        "gpucloud": GPUCLOUD_STUB,
        "aws": AWS_STUB,
        "systemctl": '#!/bin/sh\necho "systemctl $*" >> "$CALLS"\n',
    }.items():
        (stubs / name).write_text(text)
        (stubs / name).chmod(0o755)
    script = "\n".join(
        [
            "set -euo pipefail",
            'log() { echo "LOG: $*"; }',
            "ENV_FILE=/etc/gpucloud/monitor.env",
            function_source("write_report_units"),
            function_source("install_daily_report"),
            body,
        ]
    )
    full_env = {
        "PATH": f"{stubs}:/usr/bin:/bin",
        "CALLS": str(tmp_path / "calls"),
        "MESSAGE": str(tmp_path / "message"),
        "HOME": str(tmp_path),
        **env,
    }
    return subprocess.run(["bash", "-c", script], env=full_env, capture_output=True, text=True, timeout=60)


def test_the_timer_runs_the_report_daily_and_the_script_publishes_the_summary(tmp_path: Path):
    units, script = tmp_path / "units", tmp_path / "gpucloud-daily-report"
    units.mkdir()
    done = bootstrap_run(tmp_path, f"write_report_units {units} {script} {tmp_path / 'stubs' / 'gpucloud'}", {})
    assert done.returncode == 0, done.stderr
    timer = (units / "gpucloud-report.timer").read_text()
    assert "OnCalendar=*-*-* 06:00:00 UTC" in timer and "Persistent=true" in timer
    assert "WantedBy=timers.target" in timer
    service = (units / "gpucloud-report.service").read_text()
    assert "Type=oneshot" in service and f"ExecStart={script}" in service
    assert "EnvironmentFile=/etc/gpucloud/monitor.env" in service
    assert f"Environment=GPUCLOUD_BIN={tmp_path / 'stubs' / 'gpucloud'}" in service
    # The script as the timer runs it, with the monitor's settings.
    settings = {
        "GPUCLOUD_BIN": str(tmp_path / "stubs" / "gpucloud"),
        "GPUCLOUD_QUEUE": QUEUE,
        "GPUCLOUD_REPORTS": "s3://p5-bucket/reports/",
        "GPUCLOUD_REGION": "us-east-1",
        "GPUCLOUD_ALERT_TOPIC_ARN": "arn:aws:sns:us-east-1:123456789012:p5-alerts",
        "PATH": f"{tmp_path / 'stubs'}:/usr/bin:/bin",
        "CALLS": str(tmp_path / "calls"),
        "MESSAGE": str(tmp_path / "message"),
    }
    ran = subprocess.run([str(script)], env=settings, capture_output=True, text=True, timeout=60)
    assert ran.returncode == 0, ran.stderr
    day = subprocess.run(["date", "-u", "+%F"], capture_output=True, text=True).stdout.strip()
    calls = (tmp_path / "calls").read_text().splitlines()
    common = f"--queue {QUEUE} --prometheus http://localhost:9090 --since 24h"
    assert calls[0] == f"gpucloud report {common} --output html --out s3://p5-bucket/reports/{day}.html"
    assert calls[1].startswith(f"gpucloud report {common} --output table --out ")
    assert calls[2].startswith(
        "aws sns publish --region us-east-1 --topic-arn arn:aws:sns:us-east-1:123456789012:p5-alerts "
        f"--subject gpucloud daily report {day} --message file://"
    )
    message = (tmp_path / "message").read_text()
    assert message.startswith("gpucloud report A .. B\njobs: 3")
    assert "j1\tfinished" not in message  # the summary only: the tables are in the page
    assert message.rstrip().endswith(f"report: s3://p5-bucket/reports/{day}.html")


def test_the_bootstrap_installs_nothing_without_the_setting(tmp_path: Path):
    done = bootstrap_run(tmp_path, "install_daily_report", {})
    assert done.returncode == 0, done.stderr
    assert "LOG: daily report: off" in done.stdout
    assert not (tmp_path / "calls").exists()


def test_the_bootstrap_refuses_a_daily_report_without_its_settings(tmp_path: Path):
    done = bootstrap_run(tmp_path, "install_daily_report", {"GPUCLOUD_REPORT_SCHEDULE": "daily"})
    assert done.returncode != 0 and "GPUCLOUD_QUEUE: missing in /etc/gpucloud/monitor.env" in done.stderr


PYTHON3_STUB = """#!/bin/bash
echo "python3 $*" >> "$CALLS"
if [[ "$1 $2" == "-m venv" ]]; then
  mkdir -p "$3/bin"
  printf '#!/bin/bash\\necho "pip $*" >> "$CALLS"\\n' > "$3/bin/pip"
  chmod 0755 "$3/bin/pip"
fi
"""


def install_report(tmp_path: Path, package: str) -> list[str]:
    """install_daily_report as the monitor runs it, with apt-get, python3 (its venv's pip), aws and
    systemctl stubbed: the calls it makes, REPORT_DIR shown as $DIR."""
    stubs = tmp_path / "stubs"
    stubs.mkdir()
    for name, text in {"python3": PYTHON3_STUB, "apt-get": '#!/bin/sh\necho "apt-get $*" >> "$CALLS"\n'}.items():
        (stubs / name).write_text(text)
        (stubs / name).chmod(0o755)
    report_dir, units = tmp_path / "report", tmp_path / "units"
    units.mkdir()
    body = "\n".join(
        [
            'retry() { "$@"; }',
            f"REPORT_DIR={report_dir} REPORT_SCRIPT={tmp_path / 'daily-report'} UNIT_DIR={units}",
            "install_daily_report",
        ]
    )
    settings = {
        "GPUCLOUD_REPORT_SCHEDULE": "daily",
        "GPUCLOUD_QUEUE": QUEUE,
        "GPUCLOUD_REPORTS": "s3://p5-bucket/reports/",
        "GPUCLOUD_ALERT_TOPIC_ARN": "arn:aws:sns:us-east-1:123456789012:p5-alerts",
        "GPUCLOUD_REPORT_PACKAGE": package,
        "GPUCLOUD_REGION": "us-east-1",
    }
    done = bootstrap_run(tmp_path, body, settings)
    assert done.returncode == 0, done.stderr
    assert (units / "gpucloud-report.timer").exists()
    return (tmp_path / "calls").read_text().replace(str(report_dir), "$DIR").splitlines()


def test_the_monitor_installs_the_stacks_agent_wheel_with_the_report_extra(tmp_path: Path):
    # the shipped stacks' agent.package: one wheel, fetched as node-bootstrap.sh fetches it (file name kept)
    calls = install_report(tmp_path, "s3://my-artifacts/wheels/gpucloud-0.1.0-py3-none-any.whl")
    wheel = "$DIR/wheels/gpucloud-0.1.0-py3-none-any.whl"
    assert (
        "aws s3 cp --only-show-errors --region us-east-1 "
        f"s3://my-artifacts/wheels/gpucloud-0.1.0-py3-none-any.whl {wheel}" in calls
    )
    assert f"pip install --quiet {wheel}[report]" in calls
    assert "systemctl enable --now gpucloud-report.timer" in calls


def test_the_monitor_installs_from_a_wheelhouse_folder(tmp_path: Path):
    calls = install_report(tmp_path, "s3://my-artifacts/wheelhouse/")
    assert (
        "aws s3 cp --recursive --only-show-errors --region us-east-1 s3://my-artifacts/wheelhouse/ $DIR/wheelhouse/"
        in calls
    )
    assert "pip install --quiet --find-links $DIR/wheelhouse gpucloud[report]" in calls
