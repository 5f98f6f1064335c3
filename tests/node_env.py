"""The environment that ties a process to one queue, node or IMDS (its own module: several test
folders have a ``conftest`` of their own, so ``from conftest import`` is ambiguous).

The tuple is the offline drill's (``offline/local_fleet.py``): its agents, like an agent or command under
test, must use the queue and emulators they are given, never a developer's own queue or cluster."""

from __future__ import annotations

from gpucloud.offline.local_fleet import NODE_ENV

__all__ = ["NODE_ENV"]
