"""Pure scaling decisions: how many nodes the group should have, and when an idle node leaves.

No I/O: the queue state comes in as numbers, a decision comes out; the agent or a controller
applies it (``asg.AutoScaling.set_desired_capacity`` / ``scale_in_self``).

Rules:

- **Desired capacity** = busy nodes + the unclaimed slots of the waiting gangs that fit, clamped to
  [min, max]. Gangs are taken in queue order; the first one that does not fit under ``max_size``
  stops the count (a smaller job behind it would otherwise keep overtaking it forever), and a gang
  larger than ``max_size`` can never form: it is reported as unschedulable and not counted.
  Busy nodes are never scaled in: desired never drops below them (and they hold scale-in
  protection besides). Idle and launching nodes count toward what is there, so nodes already on
  their way are not asked for twice.
- **Idle scale-in**: an agent idle for ``idle_seconds`` or more, with nothing waiting in the queue
  and desired capacity above the group's minimum, terminates itself with a decrement.
- **Capacity Block window**: EC2 starts terminating the instances of a Capacity Block 30 minutes
  before the block ends (it announces this with an EventBridge warning 40 minutes before the end,
  "will begin to terminate in 10 minutes"). Work still running then is killed without a spot-style
  notice, so the group scales to 0 at least 30 minutes before the end (``stop_lead``), and holds 0
  before the block starts, when no instance can launch into it.
"""

from __future__ import annotations

import dataclasses

from gpucloud.errors import UserError

CAPACITY_BLOCK_MIN_LEAD = 30 * 60.0  # EC2 begins terminating Capacity Block instances 30 min before the end


def _whole(name: str, value: object, low: int = 0) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise UserError(f"{name} {value!r} is not a whole number >= {low}")
    return value


@dataclasses.dataclass(frozen=True)
class GroupBounds:
    min_size: int
    max_size: int

    def __post_init__(self) -> None:
        _whole("min_size", self.min_size)
        _whole("max_size", self.max_size)
        if self.min_size > self.max_size:
            raise UserError(f"min_size {self.min_size} is above max_size {self.max_size}")


@dataclasses.dataclass(frozen=True)
class WaitingGang:
    """A queued job attempt: ``nodes`` in its gang, ``unclaimed`` of them not yet taken by a node."""

    nodes: int
    unclaimed: int

    def __post_init__(self) -> None:
        _whole("gang nodes", self.nodes, 1)
        _whole("gang unclaimed slots", self.unclaimed)
        if self.unclaimed > self.nodes:
            raise UserError(f"gang has {self.unclaimed} unclaimed slots but only {self.nodes} nodes")


@dataclasses.dataclass(frozen=True)
class FleetState:
    waiting: tuple[WaitingGang, ...]  # in queue order
    busy_nodes: int  # holding a slot (running an attempt or forming a gang)
    idle_nodes: int  # in service, nothing to do
    launching_nodes: int  # asked for, not yet taking work

    def __post_init__(self) -> None:
        _whole("busy_nodes", self.busy_nodes)
        _whole("idle_nodes", self.idle_nodes)
        _whole("launching_nodes", self.launching_nodes)
        for gang in self.waiting:
            if not isinstance(gang, WaitingGang):
                raise UserError(f"waiting gang {gang!r} is not a WaitingGang(nodes, unclaimed)")

    @property
    def present(self) -> int:
        return self.busy_nodes + self.idle_nodes + self.launching_nodes


@dataclasses.dataclass(frozen=True)
class CapacityBlockWindow:
    start: float  # epoch seconds the block becomes active
    end: float  # epoch seconds the block ends
    stop_lead: float = CAPACITY_BLOCK_MIN_LEAD  # scale to 0 this long before the end

    def __post_init__(self) -> None:
        if not self.end > self.start:
            raise UserError(f"capacity block end {self.end} is not after its start {self.start}")
        if self.stop_lead < CAPACITY_BLOCK_MIN_LEAD:
            raise UserError(
                f"capacity block stop lead {self.stop_lead:.0f}s is under {CAPACITY_BLOCK_MIN_LEAD:.0f}s: "
                "EC2 starts terminating block instances 30 minutes before the end"
            )

    @property
    def cutoff(self) -> float:
        return self.end - self.stop_lead

    def open_at(self, now: float) -> bool:
        return self.start <= now < self.cutoff


@dataclasses.dataclass(frozen=True)
class ScaleDecision:
    desired: int
    launch: int  # nodes the group must add beyond those present or launching
    surplus: int  # idle or launching nodes beyond the need (idle agents scale themselves in)
    slots_planned: int  # unclaimed slots the desired capacity covers
    unschedulable: tuple[int, ...]  # queue positions of gangs larger than max_size
    reason: str


def plan_slots(waiting: tuple[WaitingGang, ...], busy: int, max_size: int) -> tuple[int, tuple[int, ...], int | None]:
    """(slots to provision, positions of unschedulable gangs, position of the gang that stopped the count)."""
    planned = 0
    unschedulable: list[int] = []
    blocked_at: int | None = None
    for position, gang in enumerate(waiting):
        if gang.nodes > max_size:
            unschedulable.append(position)
            continue
        if blocked_at is not None or gang.unclaimed == 0:
            continue
        if busy + planned + gang.unclaimed > max_size:
            blocked_at = position
            continue
        planned += gang.unclaimed
    return planned, tuple(unschedulable), blocked_at


def desired_capacity(
    state: FleetState, bounds: GroupBounds, *, now: float | None = None, block: CapacityBlockWindow | None = None
) -> ScaleDecision:
    if block is not None:
        if bounds.min_size != 0:
            raise UserError(
                f"a Capacity Block group needs min_size 0 to scale to 0 before the block ends, got {bounds.min_size}"
            )
        if now is None:
            raise UserError("a Capacity Block decision needs the current time (now)")
        if not block.open_at(now):
            when = "has not started" if now < block.start else f"ends in {max(0.0, block.end - now) / 60:.0f} min"
            return ScaleDecision(
                0, 0, state.idle_nodes + state.launching_nodes, 0, (), f"capacity block {when}: 0 nodes"
            )
    planned, unschedulable, blocked_at = plan_slots(state.waiting, state.busy_nodes, bounds.max_size)
    need = state.busy_nodes + planned
    desired = min(max(need, bounds.min_size), bounds.max_size)
    reason = f"{state.busy_nodes} busy + {planned} unclaimed slots"
    if desired != need:
        reason += f", clamped to [{bounds.min_size}, {bounds.max_size}]"
    if blocked_at is not None:
        reason += f"; gang #{blocked_at} waits for nodes to free up"
    if unschedulable:
        reason += f"; {len(unschedulable)} gang(s) larger than max_size {bounds.max_size} cannot run"
    return ScaleDecision(
        desired=desired,
        launch=max(0, desired - state.present),
        surplus=max(0, min(state.present - desired, state.idle_nodes + state.launching_nodes)),
        slots_planned=planned,
        unschedulable=unschedulable,
        reason=reason,
    )


@dataclasses.dataclass(frozen=True)
class IdleDecision:
    terminate: bool
    reason: str


def idle_scale_in(
    idle_for: float, *, idle_seconds: float, desired: int, min_size: int, unclaimed_slots: int
) -> IdleDecision:
    """Should an idle agent terminate itself (TerminateInstanceInAutoScalingGroup, decrement)?"""
    if idle_seconds <= 0:
        raise UserError(f"idle_seconds must be positive, got {idle_seconds}")
    if idle_for < 0:
        raise UserError(f"idle time must be >= 0 seconds, got {idle_for}")
    _whole("desired", desired)
    _whole("min_size", min_size)
    _whole("unclaimed_slots", unclaimed_slots)
    if unclaimed_slots > 0:
        return IdleDecision(False, f"{unclaimed_slots} slot(s) waiting: take work instead")
    if idle_for < idle_seconds:
        return IdleDecision(False, f"idle {idle_for:.0f}s of {idle_seconds:.0f}s")
    if desired <= min_size:
        return IdleDecision(False, f"desired {desired} is at min_size {min_size}: stay")
    return IdleDecision(
        True, f"idle {idle_for:.0f}s >= {idle_seconds:.0f}s and desired {desired} > min_size {min_size}"
    )
