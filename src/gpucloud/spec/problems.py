"""A validation problem: which key, which value, what is allowed. Rendered as one line."""

from __future__ import annotations

import dataclasses
from typing import Any

_MISSING = object()


@dataclasses.dataclass(frozen=True)
class Problem:
    key: str  # config key path as the user writes it: gpucloud:nodeGroups[1].capacity.reservationId
    message: str  # what is wrong and what is allowed
    value: Any = _MISSING  # the offending value, when there is one

    def render(self, source: str) -> str:
        shown = "" if self.value is _MISSING else f" = {_short(self.value)}"
        return f"{source}: {self.key}{shown}: {self.message}"


def key_path(*parts: str | int) -> str:
    """``("nodeGroups", 1, "capacity")`` -> ``gpucloud:nodeGroups[1].capacity`` (region is aws:)."""
    out = ""
    for part in parts:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else part
    if out == "region":
        return "aws:region"
    return f"gpucloud:{out}"


def _short(value: Any, limit: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."
