"""Does a committed checkpoint fit this model and optimizer? One line naming what differs.

DCP alone is not enough: it loads every key the live state asks for and silently ignores keys the
checkpoint has beyond them, so a model with a layer removed would load "fine"; and when a shape
differs its error is a multi-rank traceback. Comparing DCP's metadata (keys and global shapes,
read without loading a byte of tensor data) with the live state dict names the difference first.
"""

from __future__ import annotations

from typing import Any

from torch.distributed.checkpoint._nested_dict import flatten_state_dict
from torch.distributed.checkpoint.metadata import Metadata, TensorStorageMetadata

# Only the model's and the optimizer's keys must match; RNG, extra_state and meta have their own rules.
CHECKED_SECTIONS = ("model.", "optim.")
_SHOWN = 3  # differences named in the message; the rest are counted


def differences(template: dict[str, Any], metadata: Metadata, *, sections: tuple[str, ...]) -> list[str]:
    """What differs between the live state (``template``, DCP's layout) and the checkpoint, for
    keys under ``sections``: shapes first (the usual mistake: a changed width), then missing keys."""
    flat, _ = flatten_state_dict(template)
    live = {k: v for k, v in flat.items() if k.startswith(sections)}
    saved = {k: v for k, v in metadata.state_dict_metadata.items() if k.startswith(sections)}
    shapes = []
    for key in sorted(live.keys() & saved.keys()):
        here = _shape(live[key])
        there = list(saved[key].size) if isinstance(saved[key], TensorStorageMetadata) else None
        if here != there:
            shapes.append(f"{key} is {_describe(here)} here but {_describe(there)} in the checkpoint")
    missing = [f"{key} is not in the checkpoint" for key in sorted(live.keys() - saved.keys())]
    extra = [f"the checkpoint has {key}, which this {_owner(key)} lacks" for key in sorted(saved.keys() - live.keys())]
    return shapes + missing + extra


def summary(diffs: list[str]) -> str:
    """One line: the first few differences, then how many more."""
    shown = "; ".join(diffs[:_SHOWN])
    more = len(diffs) - _SHOWN
    hint = ""
    if diffs and all(" optim." in f" {d}" for d in diffs):
        hint = " (was it saved with another optimizer or other optimizer settings?)"
    return f"{shown}{f'; and {more} more' if more > 0 else ''}{hint}"


def _shape(value: Any) -> list[int] | None:
    import torch

    return list(value.shape) if isinstance(value, torch.Tensor) else None


def _describe(shape: list[int] | None) -> str:
    return "not a tensor" if shape is None else f"shape {shape}"


def _owner(key: str) -> str:
    return "optimizer" if key.startswith("optim.") else "model"
