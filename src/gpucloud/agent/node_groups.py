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
from gpucloud.lifecycle.model import GROUP_NAME_RE, GROUP_NAME_RULE, JobSpec

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


@dataclasses.dataclass(frozen=True)
class JobGroups:
    """The group fields of a job as ``gpucloud submit`` resolved them (``JobSpec`` keywords)."""

    group: str | None
    fallback_group: str | None
    fallback_after_minutes: float | None


def resolve_job_groups(
    group: str | None,
    fallback_group: str | None,
    fallback_after: str | None,
    *,
    cluster: NodeGroups,
    registered: frozenset[str] = frozenset(),
) -> JobGroups:
    """Check ``--group``, ``--fallback-group`` and ``--fallback-after`` against the cluster's groups.

    The groups are ``cluster.names`` (``GPUCLOUD_NODE_GROUPS``, on a node) or else those the
    queue's agents registered with (``registered``; no order, so no default is known). A job with
    no ``--group`` gets the default group when it is known; else it stays unnamed and the default
    group's agents take it. Every mistake is one ``UserError`` line naming the flag and what is allowed.
    """
    known = cluster.names or tuple(sorted(registered))
    after = _minutes(fallback_after)
    if after is not None and fallback_group is None:
        raise UserError("--fallback-after needs --fallback-group (the group that takes the job after that wait)")
    for flag, name in (("--group", group), ("--fallback-group", fallback_group)):
        if name is None:
            continue
        if not known:
            raise UserError(
                f"{flag} {name[:40]!r}: this queue's node groups are unknown (no agent has registered and "
                f"{GROUPS_ENV} is not set); set {GROUPS_ENV} to the stack's groups, first = default, e.g. dev,p4d-spot"
            )
        if name not in known:
            raise UserError(
                f"{flag} {name[:40]!r} is not a node group of this cluster (its groups: {', '.join(known)})"
            )
    own = group or cluster.default
    if fallback_group is not None and fallback_group == own:
        others = ", ".join(n for n in known if n != own) or "none"
        raise UserError(f"--fallback-group {fallback_group!r} is the job's own group; name another group ({others})")
    return JobGroups(group=own, fallback_group=fallback_group, fallback_after_minutes=after)


def _minutes(text: str | None) -> float | None:
    if text is None:
        return None
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not (0 <= value < float("inf")):
        raise UserError(f"--fallback-after {text[:40]!r} is not a number of minutes >= 0 (e.g. 10)")
    return value
