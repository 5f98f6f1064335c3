"""One sweep: list, decide, and (with ``delete``) delete in order, reporting each resource on the way."""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Callable
from typing import Any

from gpucloud.teardown.delete import Deleter
from gpucloud.teardown.discover import Discovery, created_times
from gpucloud.teardown.hourly_cost import hourly_usd
from gpucloud.teardown.plan import Decision, Selection, plan_sweep


@dataclasses.dataclass(frozen=True)
class Outcome:
    decision: Decision
    action: str  # "delete", "would delete" (dry run) or "skip"
    result: str  # "deleted", "already gone", "dry run", "skipped: <why>", "failed: ..."
    usd_per_hour: float | None

    def to_json(self) -> dict[str, Any]:
        f = self.decision.found
        expires = f.expires_at
        return {
            "arn": f.arn,
            "type": f.kind,
            "stack": f.stack,
            "created": f.created.isoformat() if f.created else None,
            "expires_at": expires.isoformat().replace("+00:00", "Z") if expires else None,
            "action": self.action,
            "result": self.result,
            "usd_per_hour": self.usd_per_hour,
        }


def sweep(
    client: Callable[[str], Any],
    region: str,
    selection: Selection,
    *,
    delete: bool,
    now: dt.datetime,
    progress: Callable[[str], None] = lambda line: None,
    deleter: Deleter | None = None,
) -> list[Outcome]:
    account = client("sts").get_caller_identity()["Account"]
    progress(f"listing resources tagged gpucloud:stack in {region} (and IAM)...")
    found = created_times(client, Discovery(client, region, account).run(selection.stack))
    decisions = plan_sweep(found, selection, now)
    chosen = [d for d in decisions if d.delete]
    progress(f"found {len(decisions)}, {len(chosen)} to delete" + ("" if delete else " (dry run: add --delete)"))
    deleter = deleter or Deleter(client)
    outcomes = []
    for d in decisions:
        cost = hourly_usd(d.found, region)
        if not d.delete:
            outcomes.append(Outcome(d, "skip", f"skipped: {d.reason}", cost))
        elif not delete:
            outcomes.append(Outcome(d, "would delete", "dry run", cost))
        else:
            progress(f"deleting {d.found.kind} {d.found.ident}")
            outcomes.append(Outcome(d, "delete", deleter.delete(d.found), cost))
    return outcomes
