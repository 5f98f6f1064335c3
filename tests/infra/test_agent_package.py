"""Where a node gets its gpucloud agent: the stack's ``agent.package`` (an s3:// wheel the node
copies with its instance role, or a pip requirement), the IAM read of exactly that object, the user
data that carries it, and what ``scripts/node-bootstrap.sh`` does with it.

The bootstrap's ``install_agent_package`` runs for real in bash; only the commands it calls
(``aws``, ``python3 -m venv`` and the venv's ``pip``) are stand-ins that record their arguments.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from gpucloud.errors import UserError
from gpucloud.infra.preview import StackPreview, preview_stack
from gpucloud.policy.pack import POLICIES
from gpucloud.policy.runner import run_policies
from gpucloud.spec import spec_from_config

from .test_scaling import user_data_env

REPO = Path(__file__).resolve().parents[2]
BOOTSTRAP = REPO / "scripts" / "node-bootstrap.sh"
WHEEL = "s3://wheels-bucket/agents/gpucloud-0.1.0-py3-none-any.whl"
ROLE_POLICY = "aws:iam/rolePolicy:RolePolicy"


def config(**extra: object) -> dict:
    return {
        "aws:region": "us-west-2",
        "gpucloud:availabilityZone": "us-west-2b",
        "gpucloud:nodeGroups": [{"name": "dev", "instanceType": "g6.xlarge", "maxNodes": 2}],
        **extra,
    }


def preview(**extra: object) -> StackPreview:
    return preview_stack(spec_from_config(config(**extra), "generated"), "agentpkg")


def statements(p: StackPreview) -> dict[str, dict]:
    (role_policy,) = p.of_type(ROLE_POLICY)
    return {s["Sid"]: s for s in json.loads(role_policy.inputs["policy"])["Statement"]}


# --- the setting -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "package",
    [
        WHEEL,
        "s3://wheels.example-bucket/gpucloud-0.2.0-py3-none-any.whl",
        "gpucloud==0.1.0",
        "gpucloud[train]>=0.1,<0.2",
        "gpucloud @ https://example.com/dist/gpucloud-0.1.0-py3-none-any.whl",
        "gpucloud @ git+https://github.com/example/gpucloud@v0.1.0",
    ],
)
def test_accepted_forms(package: str) -> None:
    assert spec_from_config(config(**{"gpucloud:agent": {"package": package}}), "f").agent.package == package


@pytest.mark.parametrize("ami", [{"parameter": "/gpucloud/images/ami-id"}, {"id": "ami-0123456789abcdef0"}])
def test_an_ami_of_our_own_may_bring_the_agent(ami: dict) -> None:
    spec = spec_from_config(config(**{"gpucloud:ami": ami}), "f")
    assert spec.agent.package is None and spec.agent.s3_wheel is None


def test_the_s3_uri_splits_into_bucket_and_key() -> None:
    wheel = spec_from_config(config(**{"gpucloud:agent": {"package": WHEEL}}), "f").agent.s3_wheel
    assert wheel is not None
    assert (wheel.bucket, wheel.key, wheel.file_name) == (
        "wheels-bucket",
        "agents/gpucloud-0.1.0-py3-none-any.whl",
        "gpucloud-0.1.0-py3-none-any.whl",
    )


# --- the stack ---------------------------------------------------------------------------------


def test_an_s3_wheel_is_readable_by_the_nodes_and_nothing_more() -> None:
    p = preview(**{"gpucloud:agent": {"package": WHEEL}})
    assert statements(p)["AgentPackage"] == {
        "Sid": "AgentPackage",
        "Effect": "Allow",
        "Action": ["s3:GetObject"],
        "Resource": ["arn:aws:s3:::wheels-bucket/agents/gpucloud-0.1.0-py3-none-any.whl"],
    }
    assert user_data_env(p, "dev")["GPUCLOUD_PACKAGE"] == WHEEL
    assert [v.describe() for v in run_policies(p.resources, stack="agentpkg", policies=POLICIES)] == []


def test_a_pip_requirement_needs_no_s3_read() -> None:
    p = preview(**{"gpucloud:agent": {"package": "gpucloud @ https://example.com/gpucloud-0.1.0-py3-none-any.whl"}})
    assert "AgentPackage" not in statements(p)
    # shell-quoted in node.env: the bootstrap sources the file
    assert (
        user_data_env(p, "dev")["GPUCLOUD_PACKAGE"]
        == "'gpucloud @ https://example.com/gpucloud-0.1.0-py3-none-any.whl'"
    )


def test_without_a_package_the_user_data_says_so() -> None:
    p = preview(**{"gpucloud:ami": {"parameter": "/gpucloud/images/ami-id"}})
    assert user_data_env(p, "dev")["GPUCLOUD_PACKAGE"] == "''"
    assert "AgentPackage" not in statements(p)


# --- the node bootstrap ------------------------------------------------------------------------

STUB_AWS = """#!/bin/sh
echo "aws $*" >> "$CALLS"
echo x >> "$CALLS.aws"
# fail AWS_FAIL times (403: the role's grant not visible yet, or never there)
[ "$(wc -l < "$CALLS.aws")" -gt "${AWS_FAIL:-0}" ] || { echo "fatal error: An error occurred (403) when calling the HeadObject operation: Forbidden" >&2; exit 1; }
for last; do :; done
case "$last" in
  */) mkdir -p "$last" && echo wheel > "${last}gpucloud-0.1.0-py3-none-any.whl" ;;  # cp --recursive into a folder
  *) echo wheel > "$last" ;;
esac
"""
STUB_PYTHON = """#!/bin/sh
echo "python3 $*" >> "$CALLS"
mkdir -p "$3/bin" && cp "$STUBS/pip" "$3/bin/pip"
"""
STUB_SLEEP = """#!/bin/sh
echo "sleep $*" >> "$CALLS"
"""
STUB_PIP = """#!/bin/sh
echo "pip $*" >> "$CALLS"
echo x >> "$CALLS.pip"
[ "$(wc -l < "$CALLS.pip")" -gt "${PIP_FAIL:-0}" ] || { echo "ERROR: Could not find a version (connection reset)" >&2; exit 1; }
touch "$(dirname "$0")/gpucloud" && chmod +x "$(dirname "$0")/gpucloud"
"""


def function_source(name: str) -> str:
    text = BOOTSTRAP.read_text()
    start = text.index(f"\n{name}() {{\n") + 1
    return text[start : text.index("\n}\n", start) + 3]


def bootstrap(
    tmp_path: Path,
    package: str,
    *,
    with_aws: bool = True,
    aws_fails: int = 0,
    pip_fails: int = 0,
    preinstalled: bool = False,
) -> tuple[int, str, list[str]]:
    stubs, agent_dir, calls = tmp_path / "stubs", tmp_path / "opt-gpucloud", tmp_path / "calls"
    stubs.mkdir()
    for name, body in (("aws", STUB_AWS), ("python3", STUB_PYTHON), ("pip", STUB_PIP), ("sleep", STUB_SLEEP)):
        if name != "aws" or with_aws:
            (stubs / name).write_text(body)
            (stubs / name).chmod(0o755)
    if preinstalled:
        (agent_dir / "venv" / "bin").mkdir(parents=True)
        (agent_dir / "venv" / "bin" / "gpucloud").write_text("#!/bin/sh\n")
        (agent_dir / "venv" / "bin" / "gpucloud").chmod(0o755)
    script = "\n".join(
        [
            "set -euo pipefail",
            'log() { echo "LOG: $*"; }',
            f"AGENT_DIR={agent_dir}",
            f"GPUCLOUD_PACKAGE='{package}'",
            "GPUCLOUD_REGION=us-west-2",
            "GPUCLOUD_RETRY_ATTEMPTS=4",
            function_source("retry"),
            function_source("install_agent_package"),
            "install_agent_package",
        ]
    )
    env = {
        "PATH": f"{stubs}:/usr/bin:/bin",
        "CALLS": str(calls),
        "STUBS": str(stubs),
        "AWS_FAIL": str(aws_fails),
        "PIP_FAIL": str(pip_fails),
        "HOME": str(tmp_path),
    }
    proc = subprocess.run(["bash", "-c", script], env=env, capture_output=True, text=True, timeout=30)
    lines = calls.read_text().splitlines() if calls.exists() else []
    return proc.returncode, proc.stdout + proc.stderr, [line.replace(str(agent_dir), "AGENT_DIR") for line in lines]


def test_bootstrap_copies_an_s3_wheel_with_its_file_name_then_installs_it(tmp_path: Path) -> None:
    code, out, calls = bootstrap(tmp_path, WHEEL)
    assert code == 0, out
    local = "AGENT_DIR/wheels/gpucloud-0.1.0-py3-none-any.whl"
    assert calls == [
        f"aws s3 cp --only-show-errors --region us-west-2 {WHEEL} {local}",
        "python3 -m venv AGENT_DIR/venv",
        # with the train extra: the DLAMI's venv has no PyTorch, and the jobs' python is this venv's,
        # so the README's training path runs on a node without --setup
        f"pip install --quiet {local}[train]",
    ]
    assert (tmp_path / "opt-gpucloud" / "wheels" / "gpucloud-0.1.0-py3-none-any.whl").is_file()


def test_bootstrap_installs_a_requirement_as_given(tmp_path: Path) -> None:
    code, out, calls = bootstrap(tmp_path, "gpucloud @ https://example.com/gpucloud-0.1.0-py3-none-any.whl")
    assert code == 0, out
    assert calls == [
        "python3 -m venv AGENT_DIR/venv",
        "pip install --quiet gpucloud @ https://example.com/gpucloud-0.1.0-py3-none-any.whl",
    ]


def test_bootstrap_keeps_the_agent_the_image_brings(tmp_path: Path) -> None:
    code, out, calls = bootstrap(tmp_path, "", preinstalled=True)
    assert (code, calls) == (0, [])
    assert "gpucloud already installed" in out


def test_bootstrap_stops_when_there_is_nothing_to_install(tmp_path: Path) -> None:
    code, out, calls = bootstrap(tmp_path, "")
    assert (code, calls) == (1, [])
    assert "sets no gpucloud:agent.package" in out


def test_bootstrap_stops_when_the_wheel_cannot_be_copied(tmp_path: Path) -> None:
    code, out, calls = bootstrap(tmp_path, WHEEL, aws_fails=99)
    assert code != 0 and "403" in out and "gave up after 4 attempts: aws s3" in out
    # four tries with backoff, then no venv, no pip: the node is not half set up
    assert [c.split()[0] for c in calls] == ["aws", "sleep", "aws", "sleep", "aws", "sleep", "aws"]


def test_bootstrap_retries_the_wheel_download_with_backoff(tmp_path: Path) -> None:
    code, out, calls = bootstrap(tmp_path, WHEEL, aws_fails=2, pip_fails=1)
    assert code == 0, out
    assert [c for c in calls if c.startswith("sleep")] == ["sleep 2", "sleep 4", "sleep 2"]
    assert [c.split()[0] for c in calls] == ["aws", "sleep", "aws", "sleep", "aws", "python3", "pip", "sleep", "pip"]
    assert "attempt 1 of 4 failed: aws s3; retrying in 2s" in out


def test_backoff_doubles_up_to_a_minute(tmp_path: Path) -> None:
    stub = tmp_path / "sleep"
    stub.write_text('#!/bin/sh\necho "$1" >> "$0.log"\n')
    stub.chmod(0o755)
    script = "\n".join(["log() { :; }", "GPUCLOUD_RETRY_ATTEMPTS=8", function_source("retry"), "retry false"])
    proc = subprocess.run(["bash", "-c", script], env={"PATH": f"{tmp_path}:/usr/bin:/bin"}, timeout=30)
    assert proc.returncode == 1
    assert (tmp_path / "sleep.log").read_text().split() == ["2", "4", "8", "16", "32", "60", "60"]


def test_bootstrap_needs_the_aws_cli_for_an_s3_wheel(tmp_path: Path) -> None:
    if any(Path(d, "aws").exists() for d in ("/usr/bin", "/bin")):
        pytest.skip("this machine has an AWS CLI on the stubs' PATH")
    code, out, calls = bootstrap(tmp_path, WHEEL, with_aws=False)
    assert (code, calls) == (1, [])
    assert "the AWS CLI" in out and "is not installed" in out


HOUSE = "s3://wheels-bucket/wheelhouse/gpucloud-0.1.0/"


def test_bootstrap_installs_a_wheelhouse_without_an_index(tmp_path: Path) -> None:
    code, out, calls = bootstrap(tmp_path, HOUSE)
    assert code == 0, out
    assert calls == [
        f"aws s3 cp --recursive --only-show-errors --region us-west-2 {HOUSE} AGENT_DIR/wheelhouse/",
        "python3 -m venv AGENT_DIR/venv",
        "pip install --quiet --no-index --find-links AGENT_DIR/wheelhouse gpucloud",
    ]


def test_a_wheelhouse_is_listed_and_read_under_its_folder_only() -> None:
    p = preview(**{"gpucloud:agent": {"package": HOUSE}})
    by_sid = statements(p)
    assert "AgentPackage" not in by_sid
    assert by_sid["AgentWheelhouseList"] == {
        "Sid": "AgentWheelhouseList",
        "Effect": "Allow",
        "Action": ["s3:ListBucket"],
        "Resource": ["arn:aws:s3:::wheels-bucket"],
        "Condition": {"StringLike": {"s3:prefix": ["wheelhouse/gpucloud-0.1.0/*"]}},
    }
    assert by_sid["AgentWheelhouse"]["Resource"] == ["arn:aws:s3:::wheels-bucket/wheelhouse/gpucloud-0.1.0/*"]
    assert [v.describe() for v in run_policies(p.resources, stack="agentpkg", policies=POLICIES)] == []


@pytest.mark.parametrize("package", ["s3://wheels-bucket/wheel*/", "s3://Bad_Bucket/house/"])
def test_a_bad_wheelhouse_uri_is_one_line(package: str) -> None:
    with pytest.raises(UserError) as refused:
        spec_from_config(config(**{"gpucloud:agent": {"package": package}}), "Pulumi.f.yaml")
    assert "\n" not in str(refused.value) and "gpucloud:agent.package" in str(refused.value)


def test_the_agent_and_its_jobs_find_the_agent_venvs_python_first(tmp_path: Path) -> None:
    """systemd starts the agent with a bare PATH, where `python` is /usr/bin's (no torch on the image):
    agent-start puts the venv first, so a job's `python train.py` or `torchrun` is the venv's."""
    text = BOOTSTRAP.read_text()
    start = text.index("<<'START'\n") + len("<<'START'\n")
    agent_start = text[start : text.index("\nSTART\n", start)].replace("/opt/gpucloud/venv", str(tmp_path / "venv"))
    bin_dir = tmp_path / "venv" / "bin"
    bin_dir.mkdir(parents=True)
    for name, body in (("python", "#!/bin/sh\n"), ("gpucloud", '#!/bin/sh\ncommand -v python; echo "$@"\n')):
        (bin_dir / name).write_text(body)
        (bin_dir / name).chmod(0o755)
    (tmp_path / "agent-start").write_text(agent_start + "\n")
    done = subprocess.run(
        ["bash", str(tmp_path / "agent-start")],
        env={"PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [str(bin_dir / "python"), "agent --run-dir /var/lib/gpucloud/run"]
