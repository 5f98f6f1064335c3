"""Checkpointing for spot-safe training.

``TrainingSession`` (needs torch) is the training-side API, ``load`` reads a job's committed
checkpoint outside any job (evaluation, inference); ``store.latest_committed`` and the
layout/manifest modules work without torch (the supervisor uses them).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from gpucloud.checkpoint.loading import load
    from gpucloud.checkpoint.session import TrainingSession

__all__ = ["TrainingSession", "load"]


def __getattr__(name: str) -> Any:
    # Lazy so that `import gpucloud.checkpoint.store` does not import torch.
    if name == "TrainingSession":
        from gpucloud.checkpoint.session import TrainingSession

        return TrainingSession
    if name == "load":
        from gpucloud.checkpoint.loading import load

        return load
    raise AttributeError(f"module 'gpucloud.checkpoint' has no attribute {name!r}")
