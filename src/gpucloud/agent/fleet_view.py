"""The fleet as the scaling decision sees it, read from the queue backend (the I/O half of
``gpucloud.agent.scaling``, which stays pure).

Waiting gangs are the QUEUED jobs in queue order, each with the slots of its current attempt that
no live claim holds. Busy and idle nodes are the agents' own records, counted only when reported
within ``node_lease`` (a killed agent's record stays behind). Instances the group is still
launching have no record yet: only the Auto Scaling group knows them, so ``launching`` is the
caller's to supply.
"""

from __future__ import annotations

import time

from gpucloud.agent.scaling import FleetState, WaitingGang
from gpucloud.jobs.model import JobState, NodeState
from gpucloud.queue import gang
from gpucloud.queue.gang import GangQueue

BUSY_STATES = (NodeState.WAITING, NodeState.RUNNING)


def waiting_gangs(queue: GangQueue, *, now: float) -> tuple[WaitingGang, ...]:
    """Every QUEUED job attempt, oldest first, with its unclaimed slots at ``now``."""
    return tuple(
        WaitingGang(
            nodes=job.spec.nodes,
            unclaimed=len(gang.view(queue.slot_claims(job.id, job.attempt), job.spec.nodes, now).free_slots),
        )
        for job in queue.list_jobs([JobState.QUEUED])
    )


def fleet_state(queue: GangQueue, *, node_lease: float, launching: int = 0, now: float | None = None) -> FleetState:
    """Waiting gangs plus the busy and idle agents that reported within ``node_lease`` seconds."""
    now = time.time() if now is None else now
    live = [n for n in queue.nodes() if now - n.updated_at <= node_lease]
    return FleetState(
        waiting=waiting_gangs(queue, now=now),
        busy_nodes=sum(1 for n in live if n.state in BUSY_STATES),
        idle_nodes=sum(1 for n in live if n.state is NodeState.IDLE),
        launching_nodes=launching,
    )
