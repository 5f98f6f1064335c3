"""Which committed checkpoints to delete: keep the last K, never the protected ones (pure)."""

from __future__ import annotations

from collections.abc import Iterable


def steps_to_delete(committed: Iterable[int], keep_last: int, protected: Iterable[int | None] = ()) -> list[int]:
    """Steps beyond the newest ``keep_last``, minus ``protected`` (what LATEST names, in-flight)."""
    if keep_last < 1:
        raise ValueError(f"keep_last must be >= 1, got {keep_last}")
    keep = set(sorted(set(committed), reverse=True)[:keep_last])
    keep.update(p for p in protected if p is not None)
    return sorted(s for s in set(committed) if s not in keep)
