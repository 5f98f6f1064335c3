"""What a checkpoint holds, as one DCP state dict, and how it is put back.

Layout of the state dict (flattened keys in DCP metadata)::

    model.*            model state (get_state_dict: FQNs without DDP/FSDP wrappers; resharded on load)
    optim.*            optimizer state, keyed by parameter FQN
    meta.step          the completed step
    rng.rank<r>.*      RNG states of rank r (torch CPU, CUDA, python random, numpy)
    extra.rank<r>.*    state_dict() of each extra_state object of rank r (data-loader position, ...)

RNG and extra state are per rank: DCP deduplicates keys that look replicated, which would keep
only one rank's RNG. When the world size changes, rank r takes rank r's entries if they exist and
rank 0's otherwise (exact replay is only possible at the same world size anyway).
"""

from __future__ import annotations

import copy
import random
from typing import Any, Protocol

import torch
from torch.distributed.checkpoint.state_dict import (
    get_model_state_dict,
    get_state_dict,
    set_model_state_dict,
    set_state_dict,
)

_np: Any
try:  # numpy is optional; its global RNG is captured when it is importable
    import numpy as _np
except ImportError:  # pragma: no cover - depends on the environment
    _np = None


class Stateful(Protocol):
    def state_dict(self) -> dict[str, Any]: ...
    def load_state_dict(self, state_dict: dict[str, Any]) -> Any: ...


def rng_state() -> dict[str, Any]:
    state: dict[str, Any] = {"torch": torch.get_rng_state(), "python": random.getstate()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.stack([s for s in torch.cuda.get_rng_state_all()])
    if _np is not None:
        state["numpy"] = _np.random.get_state()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    random.setstate(_as_tuple(state["python"]))
    if "cuda" in state and torch.cuda.is_available():
        saved = list(state["cuda"].unbind(0))
        if len(saved) == torch.cuda.device_count():
            torch.cuda.set_rng_state_all(saved)
    if "numpy" in state and _np is not None:
        _np.random.set_state(state["numpy"])


def _as_tuple(value: Any) -> Any:
    # random.setstate insists on tuples; a pickled state round-trips as tuples already, but be
    # strict about it rather than failing deep inside the random module.
    if isinstance(value, list):
        return tuple(_as_tuple(v) for v in value)
    return value


def capture(
    model: torch.nn.Module, optimizer: torch.optim.Optimizer | None, extra: dict[str, Stateful], *, rank: int, step: int
) -> dict[str, Any]:
    """The live state (tensors are references, not copies) to save at ``step``."""
    if optimizer is not None:
        model_sd, optim_sd = get_state_dict(model, optimizer)
    else:
        model_sd, optim_sd = get_model_state_dict(model), {}
    state: dict[str, Any] = {
        "model": model_sd,
        "meta": {"step": step},
        "rng": {f"rank{rank}": rng_state()},
        "extra": {f"rank{rank}": {name: obj.state_dict() for name, obj in extra.items()}},
    }
    if optimizer is not None:
        state["optim"] = optim_sd
    return state


def template(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer | None,
    extra: dict[str, Stateful],
    *,
    source_rank: int,
    has_extra: bool,
) -> dict[str, Any]:
    """A state dict of the right structure for DCP to load into (values are overwritten)."""
    state = capture(model, optimizer, extra if has_extra else {}, rank=source_rank, step=0)
    if not has_extra:
        state.pop("extra")
    return state


def apply(
    loaded: dict[str, Any],
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer | None,
    extra: dict[str, Stateful],
    *,
    source_rank: int,
) -> int:
    """Put loaded state back into the live objects (RNG included); return the restored step."""
    apply_weights(loaded, model, optimizer, extra, source_rank=source_rank)
    set_rng_state(loaded["rng"][f"rank{source_rank}"])
    return int(loaded["meta"]["step"])


def apply_weights(
    loaded: dict[str, Any],
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer | None,
    extra: dict[str, Stateful],
    *,
    source_rank: int,
) -> None:
    """Put loaded model, optimizer and extra state back into the live objects (not the RNG)."""
    if optimizer is not None:
        set_state_dict(model, optimizer, model_state_dict=loaded["model"], optim_state_dict=loaded["optim"])
    else:
        set_model_state_dict(model, loaded["model"])
    saved_extra = loaded.get("extra", {}).get(f"rank{source_rank}", {})
    for name, obj in extra.items():
        if name in saved_extra:
            obj.load_state_dict(copy.deepcopy(saved_extra[name]))
