"""Writing a benchmark's JSON report the same way in every script of this folder."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any


def config_of(args: Any, **extra: Any) -> dict[str, Any]:
    """The argparse namespace as JSON-able settings, plus fixed facts of the run."""
    return {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()} | extra


def finish(out: Path, report: dict[str, Any]) -> int:
    """Write ``report`` to ``out``, print its summary and goals; exit status 0 only if every goal was met."""
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")
    goals = report.get("goals_met", {})
    print(json.dumps({"summary": report.get("summary"), "goals_met": goals}, indent=2))
    print(f"wrote {out}", file=sys.stderr)
    return 0 if all(goals.values()) else 1
