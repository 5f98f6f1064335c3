"""The fleet as the scaling decision sees it, read from the queue backend (the I/O half of
``gpucloud.agent.scaling``, which stays pure).

Waiting gangs are the QUEUED jobs in queue order, each with the slots of its current attempt that
no live claim holds. Busy and idle nodes are the agents' own records, counted only when reported
within ``node_lease`` (a killed agent's record stays behind). Instances the group is still
launching have no record yet: only the Auto Scaling group knows them, so ``launching`` is the
caller's to supply.

With ``groups`` (the agent's ``NodeGroups``) everything is counted for that agent's node group
only: the jobs its group may take now (``JobSpec.runs_on``, fallbacks included) and the nodes
whose records name the group. Each group's alarm reads its own counts, so an idle group is not
scaled out for another group's running or waiting jobs.
"""

from __future__ import annotations

import dataclasses
import time

from gpucloud.agent.backlog_metric import forecast_minutes
from gpucloud.agent.node_groups import NodeGroups
from gpucloud.agent.scaling import FleetState, WaitingGang
from gpucloud.lifecycle.model import JobState, NodeState
from gpucloud.queue import gang
from gpucloud.queue.gang import GangQueue

BUSY_STATES = (NodeState.WAITING, NodeState.RUNNING)


def waiting_gangs(queue: GangQueue, *, now: float, groups: NodeGroups | None = None) -> tuple[WaitingGang, ...]:
    """Every QUEUED job attempt (that ``groups``' agents may take), oldest first, with its
    unclaimed slots at ``now``."""
    return tuple(
        WaitingGang(
            nodes=job.spec.nodes,
            unclaimed=len(gang.view(queue.slot_claims(job.id, job.attempt), job.spec.nodes, now).free_slots),
        )
        for job in queue.list_jobs([JobState.QUEUED])
        if groups is None or groups.takes(job.spec, queued_for=gang.queued_for(job, now))
    )


def fleet_state(
    queue: GangQueue,
    *,
    node_lease: float,
    launching: int = 0,
    now: float | None = None,
    groups: NodeGroups | None = None,
) -> FleetState:
    """Waiting gangs plus the busy and idle agents that reported within ``node_lease`` seconds
    (of ``groups``' own node group only, when given)."""
    now = time.time() if now is None else now
    live = [n for n in queue.nodes() if now - n.updated_at <= node_lease and (groups is None or groups.serves(n.group))]
    return FleetState(
        waiting=waiting_gangs(queue, now=now, groups=groups),
        busy_nodes=sum(1 for n in live if n.state in BUSY_STATES),
        idle_nodes=sum(1 for n in live if n.state is NodeState.IDLE),
        launching_nodes=launching,
    )


@dataclasses.dataclass(frozen=True)
class Backlog:
    """What an agent publishes for the groups' alarms (``backlog_metric``), from one read of the table."""

    counts: dict[str, tuple[int, int]]  # group -> (unclaimed slots, busy nodes)
    fallback_due: dict[tuple[str, float], int]  # (fallback group, minute start, epoch s) -> slots due then


def group_backlog(queue: GangQueue, *, node_lease: float, groups: NodeGroups, now: float | None = None) -> Backlog:
    """(unclaimed slots, busy nodes) of every group in ``groups.names``, and the fallback forecast.

    A waiting job counts for one group only (``JobSpec.backlog_group``): its own, or its fallback
    group once the wait is over. A job whose fallback is not yet due is forecast under its fallback
    group from the minute it falls due (``backlog_metric.forecast_minutes``)."""
    now = time.time() if now is None else now
    queued = [
        (job, len(gang.view(queue.slot_claims(job.id, job.attempt), job.spec.nodes, now).free_slots))
        for job in queue.list_jobs([JobState.QUEUED])
    ]
    live = [n for n in queue.nodes() if now - n.updated_at <= node_lease and n.state in BUSY_STATES]
    unclaimed = dict.fromkeys(groups.names, 0)
    due: dict[tuple[str, float], int] = {}
    for job, free in queued:
        waited = gang.queued_for(job, now)
        name = job.spec.backlog_group(queued_for=waited, default_group=groups.default)
        if name in unclaimed:
            unclaimed[name] += free
        fallback = job.spec.fallback_group
        if fallback in unclaimed and name != fallback and free:
            for minute in forecast_minutes(now + job.spec.fallback_after_seconds() - waited, now):
                due[(fallback, minute)] = due.get((fallback, minute), 0) + free
    counts = {name: (unclaimed[name], sum(1 for n in live if n.group == name)) for name in groups.names}
    return Backlog(counts=counts, fallback_due=due)
