"""Every shell example in README.md and docs/ runs as printed, or says here why it cannot run offline.

The examples are read from the ```bash / ```sh / ```console blocks (a ``$ `` prompt marks a command
in a block that also shows output; a trailing ``\\`` continues a command). Each one runs with bash from
the repository root, with this environment's ``.venv/bin`` first on PATH and a fresh GPUCLOUD_HOME,
and must exit 0 (or the code its comment promises: ``# exits N``). A command that matches a reason
below is not run; a new example that matches none is run, so a broken one fails here.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
BLOCK = re.compile(r"```(?:bash|sh|console|shell)\n(.*?)```", re.S)
EXITS = re.compile(r"#\s*exits (\d+)")

# What cannot run offline as printed, and why. Checked in order; the first match wins.
NOT_OFFLINE: list[tuple[str, str]] = [
    (r"^scripts/setup\.sh", "sets up .venv: what CI itself runs first (.ci/run)"),
    (r"-m pytest", "the test suite itself"),
    (r"benchmarks/", "benchmarks run for minutes; each writes its report (benchmarks/results/)"),
    (r"\bpulumi (up|preview|stack|config)\b", "needs the pulumi CLI and an AWS account"),
    (r"^aws ", "needs an AWS account"),
    (r"aws://|sqs\.[a-z0-9-]+\.amazonaws\.com|\$Q\b", "names a real AWS queue"),
    (r"catalog refresh", "calls the AWS Pricing and EC2 APIs"),
    (r"gpucloud sweep --region(?!.*# exits)", "lists (and with --delete deletes) resources in an AWS account"),
    (r"gpucloud teardown --stack", "drives the pulumi CLI (Automation API) against a deployed stack"),
    (
        r"gpucloud drill --stack p4d-spot --local --steps 20 --notice-at-step 1 -o json$",
        "the offline drill (a minute): tests/drill/test_drill_local.py runs it as printed and checks its JSON",
    ),
    (
        r"JOB_ID|train\.py|llama-7b|bert-ft|~/my/|\./Pulumi\.mine\.yaml|fresh\.json|us-west-2\.json|broken\.yaml",
        "a placeholder",
    ),
    (r"gpucloud (worker|agent)\b(?!.*--once)", "a node daemon: runs until stopped"),
    (r"gpucloud doctor(?!.*--recorded)", "reads this node's GPUs, EFA and NVMe"),
    (r"gpucloud doctor --recorded /tmp/node-42", "reads a capture made on a node"),
    (r"gpucloud imds-emulator", "a server: runs until stopped (its tests drive it)"),
    (r"\$E/|^E=|^export ", "talks to a running emulator (shown with its start line)"),
    (r"pip wheel", "builds the package into dist/ of the checkout"),
    (r"--device cuda", "needs a GPU host with a CUDA build of torch (docs/gpu.md: what ran on one)"),
]


@dataclass(frozen=True)
class Example:
    doc: str
    line: int
    command: str

    @property
    def reason_not_run(self) -> str | None:
        for pattern, reason in NOT_OFFLINE:
            if re.search(pattern, self.command):
                return reason
        return None


def examples() -> list[Example]:
    found = []
    for doc in DOCS:
        text = doc.read_text(encoding="utf-8")
        for block in BLOCK.finditer(text):
            first_line = text.count("\n", 0, block.start(1)) + 1
            found += _commands(doc.relative_to(REPO).as_posix(), first_line, block.group(1))
    return found


def _commands(doc: str, first_line: int, block: str) -> list[Example]:
    lines = block.splitlines()
    prompted = any(line.startswith("$ ") for line in lines)
    commands, current, start = [], "", 0
    for number, line in enumerate(lines, first_line):
        if current:
            current += "\n" + line
        elif prompted and line.startswith("$ "):
            current, start = line[2:], number
        elif not prompted and line.strip() and not line.lstrip().startswith("#"):
            current, start = line, number
        else:
            continue  # output shown under a prompt, a comment, a blank line
        if not current.rstrip().endswith("\\"):
            commands.append(Example(doc, start, current))
            current = ""
    return commands


ALL = examples()


def test_the_docs_have_examples_and_most_run() -> None:
    run = [e for e in ALL if e.reason_not_run is None]
    assert len(ALL) > 50 and len(run) >= 10, f"{len(run)} of {len(ALL)} examples run"


def run_example(example: Example, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    """Run one example as printed: bash from the repository root, this environment's venv first on
    PATH, a fresh GPUCLOUD_HOME, no queue of the developer's."""
    venv_bin = Path(sys.executable).parent
    env = {
        **os.environ,
        "PATH": f"{venv_bin}{os.pathsep}{os.environ.get('PATH', '')}",
        "GPUCLOUD_HOME": str(tmp_path / "home"),
    }
    for name in ("GPUCLOUD_QUEUE", "GPUCLOUD_REGION", "GPUCLOUD_JOB_TABLE", "GPUCLOUD_JOB_QUEUE_URL"):
        env.pop(name, None)
    command = example.command.replace(".venv/bin/", f"{venv_bin}/")  # this environment's venv
    return subprocess.run(
        ["bash", "-o", "pipefail", "-c", command], cwd=REPO, env=env, capture_output=True, text=True, timeout=300
    )


@pytest.mark.parametrize("example", [e for e in ALL if e.reason_not_run is None], ids=lambda e: f"{e.doc}:{e.line}")
def test_the_example_runs_as_printed(example: Example, tmp_path: Path) -> None:
    expected = int(m.group(1)) if (m := EXITS.search(example.command)) else 0
    ran = run_example(example, tmp_path)
    assert ran.returncode == expected, (
        f"{example.doc}:{example.line}: `{example.command}` exited {ran.returncode}, expected {expected}\n"
        f"{ran.stdout[-2000:]}{ran.stderr[-2000:]}"
    )


def test_the_docs_deploy_with_one_pulumi_stack_command_that_works_the_first_time_and_after() -> None:
    """`stack select` fails before the stack exists and `stack init` once it does; `select --create` works both times."""
    found = [
        (doc.relative_to(REPO).as_posix(), m.group(0))
        for doc in DOCS
        for m in re.finditer(r"pulumi stack (?:select|init)\b[^`\n]*", doc.read_text(encoding="utf-8"))
    ]
    assert found and all(command.startswith("pulumi stack select --create ") for _, command in found), found


def test_the_docs_do_not_call_shipped_features_planned_or_unavailable() -> None:
    """Gangs (`gpucloud agent`) and the aws:// queue ship; docs once said both were still to come."""
    shipped = r"(gang|aws://|SQS|DynamoDB|AWS \(SQS)"
    claim = re.compile(rf"{shipped}[^.]{{0,120}}\b(are|is) (planned|not (yet )?available)", re.I | re.S)
    stale = [(d.name, m.group(0)) for d in DOCS if (m := claim.search(d.read_text(encoding="utf-8")))]
    assert not stale, stale
