"""Which node group an agent serves, and which groups a cluster has (pure, from the node env).

The stack writes both into every node's ``/etc/gpucloud/node.env`` (``infra/program.py``):
``GPUCLOUD_NODE_GROUP`` (this node's group) and ``GPUCLOUD_NODE_GROUPS`` (every group of the
stack, comma-separated, in the stack file's order; the first is the default group of a job
submitted without ``--group``). Agents claim, count and publish per group with it; ``gpucloud
submit`` checks ``--group`` and ``--fallback-group`` against it.

Off a cluster neither is set: the agent serves every job, as before groups existed.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping

from gpucloud.errors import UserError
from gpucloud.jobs.model import GROUP_NAME_RE, GROUP_NAME_RULE, JobSpec

GROUP_ENV = "GPUCLOUD_NODE_GROUP"
GROUPS_ENV = "GPUCLOUD_NODE_GROUPS"


@dataclasses.dataclass(frozen=True)
class NodeGroups:
    """This agent's group (None: serves every group) and the cluster's groups, first = default."""

    own: str | None = None
    names: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        for name in (*self.names, *([self.own] if self.own else [])):
            if not GROUP_NAME_RE.fullmatch(name):
                raise UserError(f"node group {name[:40]!r} is not a node group name ({GROUP_NAME_RULE})")
        if len(set(self.names)) != len(self.names):
            raise UserError(f"{GROUPS_ENV} names a group twice: {','.join(self.names)[:200]}")
        if self.own is not None and self.names and self.own not in self.names:
            raise UserError(f"{GROUP_ENV}={self.own!r} is not one of {GROUPS_ENV}={','.join(self.names)[:200]}")

    @property
    def default(self) -> str | None:
        """The group a job without ``--group`` belongs to: the stack's first (None: unknown)."""
        return self.names[0] if self.names else None

    def takes(self, spec: JobSpec, *, queued_for: float) -> bool:
        """May this agent take a job of ``spec`` that has been queued for ``queued_for`` seconds?"""
        return spec.runs_on(self.own, queued_for=queued_for, default_group=self.default)

    def serves(self, group: str | None) -> bool:
        """Is a node record of ``group`` one of this agent's group's nodes (for the busy count)?"""
        return self.own is None or group == self.own

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> NodeGroups:
        env = os.environ if env is None else env
        listed = env.get(GROUPS_ENV, "")
        names = tuple(n.strip() for n in listed.split(",")) if listed.strip() else ()
        if any(not n for n in names):
            raise UserError(f"{GROUPS_ENV}={listed[:200]!r} has an empty name; use NAME,NAME,... (first = default)")
        return cls(own=env.get(GROUP_ENV) or None, names=names)
