"""A node whose bootstrap fails leaves its group after writing the reason where an operator sees it.

``scripts/node-bootstrap.sh``'s own functions run in bash (its EXIT trap, ``leave_group``, the
agent install that fails); only the commands they call (``aws``, IMDS through ``curl``,
``poweroff``, ``logger``) are stand-ins that record their arguments.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from gpucloud.infra.iam import BOOTSTRAP_FAILED_TAG, NODE_LIFECYCLE_ACTIONS

from .test_agent_package import BOOTSTRAP, function_source

INSTANCE = "i-0123456789abcdef0"
ROLE_POLICY = "aws:iam/rolePolicy:RolePolicy"
STUB_AWS = """#!/bin/sh
echo "aws $*" >> "$CALLS"
case "$2" in
  terminate-instance-in-auto-scaling-group) [ -z "$AT_MIN_SIZE" ] || { echo "ValidationError: at min size" >&2; exit 254; } ;;
  describe-auto-scaling-instances) echo dev-group ;;
esac
"""
STUB_CURL = f"""#!/bin/sh
case "$*" in
  *api/token*) echo token ;;
  *instance-id*) echo {INSTANCE} ;;
esac
"""
RECORD = '#!/bin/sh\necho "$(basename "$0") $*" >> "$CALLS"\n'


def failed_bootstrap(
    tmp_path: Path, *, with_aws: bool = True, at_min_size: bool = False, preinstalled: bool = False
) -> dict:
    """The agent step with nothing to install (no package, no agent on the AMI): it fails."""
    stubs, calls, state = tmp_path / "stubs", tmp_path / "calls", tmp_path / "state"
    stubs.mkdir()
    if preinstalled:
        (tmp_path / "opt" / "venv" / "bin").mkdir(parents=True)
        (tmp_path / "opt" / "venv" / "bin" / "gpucloud").write_text("#!/bin/sh\n")
        (tmp_path / "opt" / "venv" / "bin" / "gpucloud").chmod(0o755)
    bodies = {"curl": STUB_CURL, "poweroff": RECORD, "logger": "#!/bin/sh\n", "sleep": "#!/bin/sh\n"}
    if with_aws:
        bodies["aws"] = STUB_AWS
    for name, body in bodies.items():
        (stubs / name).write_text(body)
        (stubs / name).chmod(0o755)
    text = BOOTSTRAP.read_text()
    prologue = text[text.index("LAST_LOG=") : text.index("trap on_exit EXIT")]
    script = "\n".join(
        [
            "set -euo pipefail",
            "LOG_TAG=gpucloud-bootstrap",
            prologue,
            f"CONSOLE={tmp_path / 'console'} STATE_DIR={state}",
            f"AGENT_DIR={tmp_path / 'opt'} GPUCLOUD_PACKAGE=''",
            "GPUCLOUD_REGION=us-west-2 GPUCLOUD_RETRY_ATTEMPTS=2 GPUCLOUD_LIFECYCLE_HOOK=dev-drain",
            function_source("retry"),
            function_source("install_agent_package"),
            "trap on_exit EXIT",
            "STEP=agent; install_agent_package",
        ]
    )
    env = {"PATH": f"{stubs}:/usr/bin:/bin", "CALLS": str(calls), "AT_MIN_SIZE": "1" if at_min_size else ""}
    proc = subprocess.run(["bash", "-c", script], env=env, capture_output=True, text=True, timeout=60)
    return {
        "code": proc.returncode,
        "out": proc.stdout + proc.stderr,
        "calls": calls.read_text().splitlines() if calls.exists() else [],
        "console": (tmp_path / "console").read_text() if (tmp_path / "console").exists() else "",
        "state": (state / "bootstrap-failed").read_text() if (state / "bootstrap-failed").exists() else "",
    }


REASON = "step agent failed (exit 1): agent: ERROR this AMI has no"


def test_the_node_writes_why_then_terminates_itself_with_a_decrement(tmp_path: Path) -> None:
    done = failed_bootstrap(tmp_path)
    assert done["code"] != 0  # the bootstrap still fails (cloud-init shows it failed)
    assert REASON in done["console"] and done["state"].startswith(REASON)
    tag, terminate, describe, complete = done["calls"]
    assert tag.startswith(
        f"aws ec2 create-tags --region us-west-2 --resources {INSTANCE} --tags Key={BOOTSTRAP_FAILED_TAG},Value={REASON}"
    )
    assert len(tag.split("Value=", 1)[1]) <= 255  # EC2's limit on a tag value
    assert terminate == (
        f"aws autoscaling terminate-instance-in-auto-scaling-group --region us-west-2 --instance-id {INSTANCE} "
        "--should-decrement-desired-capacity"
    )
    assert describe.startswith(
        f"aws autoscaling describe-auto-scaling-instances --region us-west-2 --instance-ids {INSTANCE}"
    )
    assert complete == (
        "aws autoscaling complete-lifecycle-action --region us-west-2 --lifecycle-hook-name dev-drain "
        f"--auto-scaling-group-name dev-group --instance-id {INSTANCE} --lifecycle-action-result CONTINUE"
    )


def test_at_the_groups_minimum_the_node_marks_itself_unhealthy(tmp_path: Path) -> None:
    done = failed_bootstrap(tmp_path, at_min_size=True)
    assert done["calls"][-1] == (
        f"aws autoscaling set-instance-health --region us-west-2 --instance-id {INSTANCE} "
        "--health-status Unhealthy --no-should-respect-grace-period"
    )
    assert not any("poweroff" in c or "complete-lifecycle-action" in c for c in done["calls"])


def test_without_the_aws_cli_the_node_powers_off(tmp_path: Path) -> None:
    done = failed_bootstrap(tmp_path, with_aws=False)
    assert done["calls"] == ["poweroff "]
    assert REASON in done["console"]


def test_a_bootstrap_that_succeeds_stays(tmp_path: Path) -> None:
    done = failed_bootstrap(tmp_path, preinstalled=True)  # the AMI brings the agent: the step passes
    assert (done["code"], done["calls"], done["console"], done["state"]) == (0, [], "", "")


@pytest.mark.parametrize(
    ("command", "action"),
    [
        ("terminate-instance-in-auto-scaling-group", "autoscaling:TerminateInstanceInAutoScalingGroup"),
        ("set-instance-health", "autoscaling:SetInstanceHealth"),
    ],
)
def test_what_the_bootstrap_calls_the_node_role_grants(previews, command: str, action: str) -> None:
    assert f"aws autoscaling {command}" in function_source("leave_group")
    assert action in NODE_LIFECYCLE_ACTIONS
    assert f"BOOTSTRAP_FAILED_TAG={BOOTSTRAP_FAILED_TAG}\n" in BOOTSTRAP.read_text()
    (policy,) = [p for p in previews["dev"].of_type(ROLE_POLICY) if p.name.endswith("-node-access")]
    by_sid = {s["Sid"]: s for s in json.loads(policy.inputs["policy"])["Statement"]}
    assert action in by_sid["NodeLifecycle"]["Action"]
    tag = by_sid["BootstrapFailedTag"]
    assert (tag["Action"], tag["Resource"]) == (["ec2:CreateTags"], ["arn:aws:ec2:us-east-1:123456789012:instance/*"])
    assert tag["Condition"]["ForAllValues:StringEquals"] == {"aws:TagKeys": [BOOTSTRAP_FAILED_TAG]}
