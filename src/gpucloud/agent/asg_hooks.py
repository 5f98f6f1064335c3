"""What the agent tells the Auto Scaling group, and when (the I/O around ``fleet.asg``).

On a cluster node (an instance id from IMDS that is a member of an ASG) the agent:

* protects itself from scale-in while it holds a slot, and lifts that when idle;
* at a stop notice, asks for its replacement at once (``request_replacement``: detach without
  decrement), so the lost node's successor boots while the gang is still saving;
* completes the termination lifecycle action (CONTINUE) only after the checkpoint is committed;
* publishes the backlog metric (``backlog_metric``) and, idle past ``GPUCLOUD_IDLE_MINUTES`` with
  ``GPUCLOUD_SCALE_IN=1``, terminates itself with a decrement (``fleet.scaling.idle_scale_in``) and
  completes its own lifecycle action (CONTINUE: nothing to save);
* while running an attempt, watches its group for a wind-down (``wind_down_notice``): a capacity
  block's scheduled action sets min, max and desired to 0, but Auto Scaling never scale-in
  terminates a protected instance, so a busy node would run on until EC2 reclaims the block,
  unsaved. The agent treats it as its own stop notice (save, requeue), then ``leave``s: protection
  lifted, terminated without decrement, its lifecycle action completed.

Off EC2, or on an instance in no group, ``OfflineHooks`` does nothing: that is how a laptop and the
fleet simulation run the same agent.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import logging
import os
import time
from collections.abc import Callable
from typing import Any, Protocol

from gpucloud.agent.asg import AutoScaling, ScaleIn
from gpucloud.agent.backlog_metric import (
    FallbackDue,
    GroupBacklog,
    put_metric_data_request,
)
from gpucloud.agent.budget_gate import AlarmSwitch, BudgetGate, gate_from_env, held
from gpucloud.agent.scaling import idle_scale_in
from gpucloud.cluster.agent_contract import BLOCK_ENDING_TAG, IDLE_MINUTES_ENV, SCALE_IN_ENV
from gpucloud.errors import UserError
from gpucloud.signals.eventbridge import CAPACITY_BLOCK_ACTION
from gpucloud.signals.events import Notice, event_id_for
from gpucloud.signals.lifecycle_action import LifecycleAction

log = logging.getLogger("gpucloud.agent")

LIFECYCLE_HOOK_ENV = "GPUCLOUD_LIFECYCLE_HOOK"
REGION_ENV = "GPUCLOUD_REGION"
CLUSTER_ENV = "GPUCLOUD_CLUSTER"
NODE_GROUP_ENV = "GPUCLOUD_NODE_GROUP"
LIFECYCLE_TIMEOUT_ENV = "GPUCLOUD_LIFECYCLE_TIMEOUT"  # the drain hook's heartbeat timeout (s)
WIND_DOWN = "wind-down"  # Notice.action of a group wind-down seen by this node's agent
# After TerminateInstanceInAutoScalingGroup the instance moves to Terminating:Wait and only then has
# a lifecycle action to complete; retry "no active action" for this long, this often.
OWN_ACTION_WAIT = 60.0
OWN_ACTION_INTERVAL = 2.0


class FleetHooks(Protocol):
    """What the agent asks of the group. ``noticed`` and ``committed`` act on this node, or with
    ``instance_id`` on another node of the fleet (the events-queue handler, for a node whose agent
    is dead); ``committed`` completes the lifecycle action ``action`` names when one is given."""

    def busy(self, busy: bool) -> None: ...
    def noticed(self, instance_id: str | None = None) -> str: ...
    def committed(self, instance_id: str | None = None, action: LifecycleAction | None = None) -> bool: ...
    def publish_backlog(
        self,
        *,
        unclaimed_slots: int,
        busy_nodes: int,
        other_groups: dict[str, tuple[int, int]] | None = None,
        fallback_due: dict[tuple[str, float], int] | None = None,
    ) -> None: ...
    def scale_in(self, *, idle_for: float, unclaimed_slots: int) -> bool: ...
    def group_ending(self) -> Notice | None: ...
    def leave(self) -> str: ...
    def mark_block_ending(self, instance_ids: list[str], reservation_id: str, deadline: float) -> str: ...


class OfflineHooks:
    """No Auto Scaling group: nothing to protect, replace, complete or publish."""

    def busy(self, busy: bool) -> None:
        return None

    def noticed(self, instance_id: str | None = None) -> str:
        return "no Auto Scaling group: nothing to replace"

    def committed(self, instance_id: str | None = None, action: LifecycleAction | None = None) -> bool:
        return False

    def publish_backlog(
        self,
        *,
        unclaimed_slots: int,
        busy_nodes: int,
        other_groups: dict[str, tuple[int, int]] | None = None,
        fallback_due: dict[tuple[str, float], int] | None = None,
    ) -> None:
        return None

    def scale_in(self, *, idle_for: float, unclaimed_slots: int) -> bool:
        return False

    def group_ending(self) -> Notice | None:
        return None

    def leave(self) -> str:
        return "no Auto Scaling group: nothing to leave"

    def mark_block_ending(self, instance_ids: list[str], reservation_id: str, deadline: float) -> str:
        return "no Auto Scaling group: nothing to mark"


@dataclasses.dataclass(frozen=True)
class NodeSettings:
    """The node env the stack writes (``/etc/gpucloud/node.env``) that the hooks use."""

    cluster: str | None
    node_group: str | None
    lifecycle_hook: str | None
    scale_in: bool
    idle_seconds: float
    drain_seconds: float = 600.0  # the drain hook's heartbeat timeout: a wound-down node's time to save

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None) -> NodeSettings:
        env = dict(os.environ if env is None else env)
        raw_minutes = env.get(IDLE_MINUTES_ENV, "10")
        try:
            minutes = float(raw_minutes)
        except ValueError:
            raise UserError(f"{IDLE_MINUTES_ENV}={raw_minutes!r} is not a number of minutes (e.g. 10)") from None
        if minutes <= 0:
            raise UserError(f"{IDLE_MINUTES_ENV}={raw_minutes!r} must be more than 0 minutes")
        scale_in = env.get(SCALE_IN_ENV, "0")
        if scale_in not in ("0", "1"):
            raise UserError(
                f"{SCALE_IN_ENV}={scale_in!r} must be 1 (idle nodes scale in) or 0 (the group keeps its size)"
            )
        raw_drain = env.get(LIFECYCLE_TIMEOUT_ENV) or "600"
        try:
            drain = float(raw_drain)
        except ValueError:
            drain = -1.0
        if not 30 <= drain <= 7200:
            raise UserError(f"{LIFECYCLE_TIMEOUT_ENV}={raw_drain!r} is not a number of seconds from 30 to 7200")
        return cls(
            cluster=env.get(CLUSTER_ENV) or None,
            node_group=env.get(NODE_GROUP_ENV) or None,
            lifecycle_hook=env.get(LIFECYCLE_HOOK_ENV) or None,
            scale_in=scale_in == "1",
            idle_seconds=minutes * 60,
            drain_seconds=drain,
        )


class AsgHooks:
    """The hooks for instance ``instance_id`` of group ``asg_name`` (clients injected: tests stub them)."""

    def __init__(
        self, *, autoscaling: Any, cloudwatch: Any, instance_id: str, asg_name: str, settings: NodeSettings
    ) -> None:
        self._client = autoscaling
        self.asg = AutoScaling(autoscaling)
        self._cloudwatch = cloudwatch
        self.instance_id, self.asg_name, self.settings = instance_id, asg_name, settings
        self._protected: bool | None = None
        self.sleep: Callable[[float], None] = time.sleep  # between completion attempts (tests skip it)
        self.clock: Callable[[], float] = time.monotonic
        self.budget: BudgetGate | None = None  # budget.onExceeded stop-scale-out (agent/budget_gate.py)
        self.alarm_switch = AlarmSwitch(autoscaling, asg_name, settings.cluster)

    def busy(self, busy: bool) -> None:
        if self._protected == busy:
            return
        self.asg.protect(self.instance_id, self.asg_name, busy)
        self._protected = busy

    def noticed(self, instance_id: str | None = None) -> str:
        instance, group = self._member(instance_id)
        if group is None:
            return f"{instance} is in no Auto Scaling group: nothing to replace"
        return self.asg.request_replacement(instance, group).value

    def committed(self, instance_id: str | None = None, action: LifecycleAction | None = None) -> bool:
        if action is not None:  # the events queue's lifecycle action: group, hook and token are its own
            return self.asg.complete(action, "CONTINUE")
        if self.settings.lifecycle_hook is None:
            return False
        instance, group = self._member(instance_id)
        if group is None:
            return False
        return self.asg.complete_termination(group, self.settings.lifecycle_hook, instance)

    def _member(self, instance_id: str | None) -> tuple[str, str | None]:
        """(instance, its group): this node's own, or another node's looked up (it may be in
        another of the cluster's groups, or already out of every group)."""
        if instance_id is None or instance_id == self.instance_id:
            return self.instance_id, self.asg_name
        return instance_id, group_of(self._client, instance_id)

    def publish_backlog(
        self,
        *,
        unclaimed_slots: int,
        busy_nodes: int,
        other_groups: dict[str, tuple[int, int]] | None = None,
        fallback_due: dict[tuple[str, float], int] | None = None,
    ) -> None:
        """This group's counts, and ``other_groups``' ({group: (unclaimed, busy)}): every agent publishes
        every group's, so a group with no node of its own still has its backlog published.
        ``fallback_due`` ({(group, minute start): slots}) is the fallback forecast (``backlog_metric``);
        over budget it is not sent, like the unclaimed slots."""
        cluster = self.settings.cluster
        if not (cluster and self.settings.node_group):
            return
        backlogs = [GroupBacklog(cluster, self.settings.node_group, unclaimed_slots, busy_nodes)]
        backlogs += [GroupBacklog(cluster, g, u, b) for g, (u, b) in (other_groups or {}).items()]
        exceeded = self.budget is not None and self.budget.exceeded()
        forecasts = [
            FallbackDue(cluster, group, dt.datetime.fromtimestamp(minute, dt.timezone.utc), slots)
            for (group, minute), slots in (fallback_due or {}).items()
            if not exceeded
        ]
        self._cloudwatch.put_metric_data(
            **put_metric_data_request(held(backlogs, exceeded), dt.datetime.now(dt.timezone.utc), forecasts)
        )
        if self.budget is not None:
            self.alarm_switch.apply(exceeded)

    def scale_in(self, *, idle_for: float, unclaimed_slots: int) -> bool:
        if not self.settings.scale_in or unclaimed_slots > 0 or idle_for < self.settings.idle_seconds:
            return False  # decided without asking the group (this runs every idle poll)
        groups = self._client.describe_auto_scaling_groups(AutoScalingGroupNames=[self.asg_name])["AutoScalingGroups"]
        if not groups:
            return False
        group = groups[0]
        decision = idle_scale_in(
            idle_for,
            idle_seconds=self.settings.idle_seconds,
            desired=group["DesiredCapacity"],
            min_size=group["MinSize"],
            unclaimed_slots=unclaimed_slots,
        )
        if not decision.terminate:
            return False
        self.busy(False)
        log.info("scaling in: %s", decision.reason)
        if self.asg.scale_in_self(self.instance_id) is not ScaleIn.TERMINATING:
            return False
        self.complete_own_action("idle: nothing to save")
        return True

    def group_ending(self) -> Notice | None:
        """A stop notice for this node when its group has been wound down (see ``wind_down_notice``).
        Also where the budget gate reaches the group every minute, whatever the agent publishes."""
        if self.budget is not None:
            self.alarm_switch.apply(self.budget.exceeded())  # never raises; the gate fails open
        groups = self._client.describe_auto_scaling_groups(AutoScalingGroupNames=[self.asg_name])["AutoScalingGroups"]
        if not groups:
            return None
        now = time.time()
        return wind_down_notice(
            groups[0], self.instance_id, now=now, drain_seconds=self.settings.drain_seconds
        ) or block_ending_notice(groups[0], self.instance_id, now=now)

    def mark_block_ending(self, instance_ids: list[str], reservation_id: str, deadline: float) -> str:
        """Tag the groups of a capacity block's instances (``BLOCK_ENDING_TAG``), so every agent in
        them, idle ones included, stops taking work at its next group check (``block_ending_notice``):
        the events queue hands the warning to one agent, and an idle node of the block would
        otherwise claim a just-requeued attempt and be killed with it minutes later, unsaved."""
        names = sorted({g for g in (group_of(self._client, i) for i in instance_ids) if g is not None})
        value = f"{reservation_id} {deadline:.0f}"
        for name in names:
            self._client.create_or_update_tags(
                Tags=[
                    {
                        "ResourceId": name,
                        "ResourceType": "auto-scaling-group",
                        "Key": BLOCK_ENDING_TAG,
                        "Value": value,
                        "PropagateAtLaunch": False,
                    }
                ]
            )
        return f"marked {', '.join(names) or 'no group'} with {BLOCK_ENDING_TAG}={value}"

    def leave(self) -> str:
        """After a wind-down's save: lift protection, terminate this instance without decrement (the
        group's desired capacity is already 0) and complete its lifecycle action (nothing left to save)."""
        self._protected = None  # ask again whatever we believe: the lift is what lets the node go
        self.busy(False)
        outcome = self.asg.scale_in_self(self.instance_id, decrement=False)
        if outcome is not ScaleIn.TERMINATING:
            return outcome.value
        completed = self.complete_own_action("the group wound down; the attempt was saved and requeued")
        return outcome.value + ("; lifecycle action completed" if completed else "")

    def complete_own_action(self, why: str) -> bool:
        """CONTINUE this node's own termination lifecycle action, once it exists.

        An agent that terminated itself is the only one who knows there is nothing to save; if it
        does not complete the action, the instance sits in Terminating:Wait (billed) until the
        hook's heartbeat timeout. The action is created when the instance enters Terminating:Wait,
        a moment after the terminate call, so "no active lifecycle action" is retried briefly.
        https://docs.aws.amazon.com/autoscaling/ec2/userguide/completing-lifecycle-hooks.html
        https://docs.aws.amazon.com/autoscaling/ec2/userguide/lifecycle-hooks-overview.html
        """
        hook = self.settings.lifecycle_hook
        if hook is None:
            return False
        give_up = self.clock() + OWN_ACTION_WAIT
        while True:
            try:
                if self.asg.complete_termination(self.asg_name, hook, self.instance_id):
                    log.info("lifecycle action of %s completed (CONTINUE): %s", self.instance_id, why)
                    return True
            except UserError as err:  # AsgError: the hook's timeout still ends the wait
                log.warning("completing the lifecycle action of %s failed: %s", self.instance_id, err)
                return False
            if self.clock() >= give_up:
                log.warning(
                    "no lifecycle action of %s appeared within %.0fs; the hook's timeout ends the wait",
                    self.instance_id,
                    OWN_ACTION_WAIT,
                )
                return False
            self.sleep(OWN_ACTION_INTERVAL)


def wind_down_notice(group: dict[str, Any], instance_id: str, *, now: float, drain_seconds: float) -> Notice | None:
    """A stop notice when ``group`` (a DescribeAutoScalingGroups entry) can hold no node at all:
    MaxSize and DesiredCapacity 0, as the capacity block's scheduled wind-down sets them.

    Scale-in never terminates an instance protected from scale-in, so a busy node would stay until
    EC2 reclaims the block's instances (from 30 minutes before its end), with no save:
    https://docs.aws.amazon.com/autoscaling/ec2/userguide/ec2-auto-scaling-instance-protection.html
    https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/capacity-blocks-monitor.html
    The wind-down is scheduled the drain timeout plus a margin before that reclaim, so the node has
    ``drain_seconds`` to save: the notice's deadline.
    """
    if group.get("MaxSize") != 0 or group.get("DesiredCapacity") != 0:
        return None
    name = str(group.get("AutoScalingGroupName", "?"))
    key = {"instance-id": instance_id, "group": name, "wind-down": True}
    return Notice(
        kind="asg-terminate",
        source="asg",
        deadline=now + drain_seconds,
        received_at=now,
        event_id=event_id_for("asg-terminate", key),
        action=WIND_DOWN,
        payload={
            "instance-id": instance_id,
            "AutoScalingGroupName": name,
            "reason": f"group {name} was wound down to 0 nodes (min/max/desired 0) while this node was busy",
        },
    )


def block_ending_notice(group: dict[str, Any], instance_id: str, *, now: float) -> Notice | None:
    """This node's stop notice when ``group`` (a DescribeAutoScalingGroups entry) carries a current
    ``BLOCK_ENDING_TAG``: its capacity block ends and EC2 terminates its instances at the deadline."""
    value = next((t.get("Value", "") for t in group.get("Tags", []) if t.get("Key") == BLOCK_ENDING_TAG), None)
    if value is None:
        return None
    reservation, _, when = str(value).partition(" ")
    try:
        deadline = float(when)
    except ValueError:
        log.warning("ignoring %s=%r: not '<reservation> <epoch seconds>'", BLOCK_ENDING_TAG, str(value)[:80])
        return None
    if not now < deadline:
        return None  # a past block's mark
    name = str(group.get("AutoScalingGroupName", "?"))
    return Notice(
        kind="asg-terminate",
        source="asg",
        deadline=deadline,
        received_at=now,
        event_id=event_id_for("asg-terminate", {"instance-id": instance_id, "block-ending": str(value)}),
        action=CAPACITY_BLOCK_ACTION,
        payload={
            "instance-id": instance_id,
            "AutoScalingGroupName": name,
            "capacity-reservation-id": reservation,
            "reason": f"capacity block {reservation} of group {name} ends: EC2 terminates its instances",
        },
    )


def group_of(autoscaling: Any, instance_id: str) -> str | None:
    """The ASG ``instance_id`` belongs to (DescribeAutoScalingInstances), None when in none."""
    found = autoscaling.describe_auto_scaling_instances(InstanceIds=[instance_id]).get("AutoScalingInstances", [])
    return found[0]["AutoScalingGroupName"] if found else None


def hooks_for(instance_id: str | None, *, region: str | None = None) -> FleetHooks:
    """``AsgHooks`` on an ASG member with a region; ``OfflineHooks`` anywhere else."""
    region = region or os.environ.get(REGION_ENV)
    if instance_id is None or region is None:
        return OfflineHooks()
    import boto3

    session = boto3.session.Session(region_name=region)
    autoscaling = session.client("autoscaling")
    asg_name = group_of(autoscaling, instance_id)
    if asg_name is None:
        return OfflineHooks()
    hooks = AsgHooks(
        autoscaling=autoscaling,
        cloudwatch=session.client("cloudwatch"),
        instance_id=instance_id,
        asg_name=asg_name,
        settings=NodeSettings.from_env(),
    )
    hooks.budget = gate_from_env(session)
    return hooks
