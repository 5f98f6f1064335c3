"""Canned AWS FIS replies for the drill's Stubber tests (shapes from botocore's FIS model)."""

from __future__ import annotations

from typing import Any

TEMPLATE_ID = "EXT1a2b3c4d5e6f7"
EXPERIMENT_ID = "EXP7g8h9i0j1k2l3"


def experiment(status: str, reason: str | None = None, *, code: str | None = None, **extra: Any) -> dict[str, Any]:
    """A GetExperiment/StartExperiment/StopExperiment reply in ``status``; ``extra``: more experiment fields."""
    state: dict[str, Any] = {"status": status}
    if reason is not None:
        state["reason"] = reason
    if code is not None:
        state["error"] = {"code": code}
    return {"experiment": {"id": EXPERIMENT_ID, "experimentTemplateId": TEMPLATE_ID, "state": state, **extra}}
