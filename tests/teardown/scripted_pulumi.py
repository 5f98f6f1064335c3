"""A scripted stand-in for the pulumi CLI binary, so the real Automation API wrapper
(``infra.automation.AutomationStack``) runs end to end here, where the CLI is not installed.

``install(directory, script)`` writes an executable ``pulumi`` into ``directory`` that answers the
commands the Automation API runs (``version``, ``stack select``, ``stack output``, ``destroy``,
``stack history``, ``stack export``) from ``script`` (a JSON file beside it) and logs each argv.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

PROGRAM = r"""
import json, sys
from pathlib import Path

here = Path(__file__).parent
script = json.loads((here / "script.json").read_text())
args = [a for a in sys.argv[1:] if a != "--non-interactive"]
with open(here / "argv.log", "a") as log:
    log.write(json.dumps(args) + "\n")
stack = args[args.index("--stack") + 1] if "--stack" in args else None
if args[:1] == ["version"]:
    print("v3.272.0")
    sys.exit(0)
if stack not in script["stacks"]:
    sys.stderr.write(f"error: no stack named '{stack}' found\n")
    sys.exit(255)
if args[:2] == ["stack", "select"]:
    sys.exit(0)
if args[:2] == ["stack", "output"]:
    outputs = dict(script["outputs"])
    if "--show-secrets" not in args:
        outputs.update({k: "[secret]" for k in script.get("secret_outputs", [])})
    print(json.dumps(outputs))
    sys.exit(0)
if args[:1] == ["destroy"]:
    destroy = script["destroy"]
    for line in destroy.get("lines", []):
        print(line)
    sys.stdout.flush()
    sys.stderr.write(destroy.get("stderr", ""))
    if destroy.get("code", 0) == 0:
        script["deployment"]["resources"] = script.get("left", [])
        (here / "script.json").write_text(json.dumps(script))
    sys.exit(destroy.get("code", 0))
if args[:2] == ["stack", "history"]:
    print(json.dumps([{"kind": "destroy", "startTime": "2026-11-24T12:00:00.000Z", "message": "",
                       "environment": {}, "config": {}, "result": "succeeded",
                       "endTime": "2026-11-24T12:01:00.000Z", "resourceChanges": {}}]))
    sys.exit(0)
if args[:2] == ["stack", "export"]:
    print(json.dumps({"version": 3, "deployment": script["deployment"]}))
    sys.exit(0)
sys.stderr.write("error: the scripted pulumi does not know " + " ".join(args) + "\n")
sys.exit(2)
"""


def install(directory: Path, script: dict[str, Any]) -> Path:
    """The scripted ``pulumi`` in ``directory`` (put it first on PATH); returns its argv log."""
    directory.mkdir(parents=True, exist_ok=True)
    binary = directory / "pulumi"
    binary.write_text(f"#!{sys.executable}\n{PROGRAM}", encoding="utf-8")
    binary.chmod(0o755)
    (directory / "script.json").write_text(json.dumps(script), encoding="utf-8")
    return directory / "argv.log"


def argvs(log: Path) -> list[list[str]]:
    return [json.loads(line) for line in log.read_text(encoding="utf-8").splitlines()]
