"""The Auto Scaling calls a node makes during an interruption and when it idles.

A thin wrapper over an injected boto3 ``autoscaling`` client: botocore validates every request
against the service model; this module validates the identifiers first, turns the documented
"already done" answers into return values (every call is safe to repeat) and every other failure
into one ``AsgError`` line naming the call, the instance, the group and AWS's reason.

Where each call sits in the interruption flow:

1. notice (spot warning)  -> ``request_replacement``: the replacement is asked for now, not after
   the node dies (see below).
2. ASG lifecycle action   -> ``heartbeat`` (or ``LifecycleHeartbeat``) while the checkpoint is
   written, so the hook's heartbeat timeout does not run out first.
3. commit of the checkpoint -> ``complete_termination(..., "CONTINUE")``: only then may the ASG
   terminate the instance.
4. busy / idle            -> ``protect(True)`` while an attempt runs, ``protect(False)`` after;
   an agent idle past its limit calls ``scale_in_self`` (terminate with decrement).

Replacement strategy: ``DetachInstances(ShouldDecrementDesiredCapacity=False)``. The group's
desired capacity stays, the noticed instance stops counting, so the ASG launches the replacement at
once; the instance itself keeps running (outside the group) until EC2 reclaims it, so the
checkpoint is not disturbed. The alternative, ``SetDesiredCapacity(desired + 1)``, is worse on
three counts: read-modify-write races between nodes noticed together (two reads of N, two writes
of N+1: one replacement for two lost nodes); when the noticed node dies the group is below its new
desired capacity and launches a *second* node; and with Capacity Rebalancing on (our spot groups)
the ASG also launches its own replacement on the 2-minute notice, a third node. Detaching composes
with Capacity Rebalancing: if the ASG acted first, the instance is already ``Terminating`` and the
detach is refused ("not in InService or Standby"), which is reported as ``ALREADY_LEAVING`` (the
ASG is already replacing it); if the detach wins, the instance is no longer a member and the ASG
does not replace it twice. A detached instance gets no termination lifecycle action, which loses
nothing for spot: a lifecycle hook cannot delay a spot interruption past its 2 minutes anyway.
Use it for spot warnings only: on a rebalance recommendation Capacity Rebalancing already
launches the replacement, and on an ASG termination (scale-in, health) the group decided itself.
"""

from __future__ import annotations

import dataclasses
import enum
import logging
import threading
import time
from collections.abc import Callable
from typing import Any, Literal

from botocore.exceptions import ClientError

from gpucloud.aws_ids import check_hook_name, check_instance_id, check_name, check_token
from gpucloud.errors import UserError
from gpucloud.signals.lifecycle_action import LifecycleAction

log = logging.getLogger("gpucloud.agent")

LifecycleResult = Literal["CONTINUE", "ABANDON"]
LIFECYCLE_RESULTS: tuple[str, ...] = ("CONTINUE", "ABANDON")

# Answers that mean "try again shortly": another update to the group is in flight.
_CONTENTION = frozenset({"ResourceContention", "ScalingActivityInProgress"})


class AsgError(UserError):
    """An Auto Scaling call failed; ``str()`` is one line: call, instance, group, AWS code and reason."""

    def __init__(self, operation: str, subject: str, code: str, message: str) -> None:
        self.operation = operation
        self.code = code
        self.aws_message = message
        reason = f"{code}: {message}" if message else code
        super().__init__(f"autoscaling {operation} for {subject} failed: {reason}")


class InstanceNotInGroup(AsgError):
    """The instance is not (or no longer) a member of the group."""


class Replacement(enum.Enum):
    DETACHED = "detached; the group launches a replacement now"
    ALREADY_LEAVING = "already terminating or detaching; the group is replacing or removing it"
    NOT_IN_GROUP = "not a member of the group (already left)"


class ScaleIn(enum.Enum):
    TERMINATING = "terminating with desired capacity decremented"
    AT_MIN_SIZE = "refused: the group is at its minimum size, so this node stays"
    NOT_IN_GROUP = "not managed by any group (already left)"


@dataclasses.dataclass(frozen=True)
class ContentionRetry:
    """How often to retry a call AWS refused because another update to the group was in flight."""

    attempts: int = 4
    first_delay: float = 0.5  # seconds; doubles each time

    def __post_init__(self) -> None:
        if self.attempts < 1:
            raise UserError(f"retry attempts must be at least 1, got {self.attempts}")
        if self.first_delay < 0:
            raise UserError(f"retry delay must be >= 0 seconds, got {self.first_delay}")


def _error(err: ClientError) -> tuple[str, str]:
    info = err.response.get("Error", {})
    return str(info.get("Code", "Unknown")), " ".join(str(info.get("Message", "")).split())


def _says(message: str, *fragments: str) -> bool:
    lowered = message.lower()
    return any(fragment.lower() in lowered for fragment in fragments)


# The documented ValidationError texts this module relies on (matched case-insensitively).
_NO_ACTIVE_ACTION = "No active Lifecycle Action found"
_NOT_IN_GROUP = ("is not part of Auto Scaling group", "No managed instance found for instance ID")
_NOT_IN_SERVICE = "is not in InService or Standby"
_AT_MIN_SIZE = "violate group's min size constraint"


class AutoScaling:
    def __init__(
        self,
        client: Any,
        *,
        retry: ContentionRetry = ContentionRetry(),
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self._client = client
        self._retry = retry
        self._sleep = sleep

    # -- lifecycle actions ---------------------------------------------------------------------
    def complete_termination(
        self,
        asg_name: str,
        hook_name: str,
        instance_id: str,
        token: str | None = None,
        result: LifecycleResult = "CONTINUE",
    ) -> bool:
        """CompleteLifecycleAction; call it only after the checkpoint is committed.

        True when completed now; False when no such action is active (completed before, timed
        out, or the instance was detached), which makes a repeated completion harmless.
        """
        if result not in LIFECYCLE_RESULTS:
            raise UserError(f"lifecycle action result {result!r} is not one of {', '.join(LIFECYCLE_RESULTS)}")
        request = self._lifecycle_request(asg_name, hook_name, instance_id, token)
        request["LifecycleActionResult"] = result
        return self._lifecycle_call("complete_lifecycle_action", "CompleteLifecycleAction", request)

    def complete(self, action: LifecycleAction, result: LifecycleResult = "CONTINUE") -> bool:
        return self.complete_termination(action.asg_name, action.hook_name, action.instance_id, action.token, result)

    def heartbeat(self, asg_name: str, hook_name: str, instance_id: str, token: str | None = None) -> bool:
        """RecordLifecycleActionHeartbeat: restart the hook's heartbeat timeout.

        False when the action is no longer active (ValidationError): stop heartbeating, as NTH does.
        """
        request = self._lifecycle_request(asg_name, hook_name, instance_id, token)
        return self._lifecycle_call("record_lifecycle_action_heartbeat", "RecordLifecycleActionHeartbeat", request)

    # -- membership and capacity ---------------------------------------------------------------
    def protect(self, instance_id: str, asg_name: str, protected: bool) -> None:
        """SetInstanceProtection: keep a busy node out of scale-in (True), release it when idle (False).

        Removing protection from an instance that already left the group is a no-op; protecting
        one that is not a member raises ``InstanceNotInGroup`` (a detached node must not take work).
        """
        check_instance_id(instance_id)
        check_name(asg_name, "Auto Scaling group name")
        request = {"InstanceIds": [instance_id], "AutoScalingGroupName": asg_name, "ProtectedFromScaleIn": protected}
        try:
            self._call("set_instance_protection", "SetInstanceProtection", request, f"{instance_id} in {asg_name}")
        except InstanceNotInGroup:
            if protected:
                raise

    def request_replacement(self, instance_id: str, asg_name: str) -> Replacement:
        """DetachInstances without decrement at a spot warning: the replacement launches now."""
        check_instance_id(instance_id)
        check_name(asg_name, "Auto Scaling group name")
        request = {
            "InstanceIds": [instance_id],
            "AutoScalingGroupName": asg_name,
            "ShouldDecrementDesiredCapacity": False,
        }
        try:
            self._call("detach_instances", "DetachInstances", request, f"{instance_id} in {asg_name}")
        except InstanceNotInGroup:
            return Replacement.NOT_IN_GROUP
        except AsgError as err:
            if err.code == "ValidationError" and _says(err.aws_message, _NOT_IN_SERVICE):
                return Replacement.ALREADY_LEAVING
            raise
        return Replacement.DETACHED

    def scale_in_self(self, instance_id: str, *, decrement: bool = True) -> ScaleIn:
        """TerminateInstanceInAutoScalingGroup: with decrement for an agent idle past its limit;
        without, for a node leaving a group whose desired capacity is already 0 (a capacity block's
        wind-down), where a decrement would go below the minimum and be refused.
        https://docs.aws.amazon.com/autoscaling/ec2/APIReference/API_TerminateInstanceInAutoScalingGroup.html
        """
        check_instance_id(instance_id)
        request = {"InstanceId": instance_id, "ShouldDecrementDesiredCapacity": decrement}
        try:
            self._call(
                "terminate_instance_in_auto_scaling_group", "TerminateInstanceInAutoScalingGroup", request, instance_id
            )
        except InstanceNotInGroup:
            return ScaleIn.NOT_IN_GROUP
        except AsgError as err:
            if err.code == "ValidationError" and _says(err.aws_message, _AT_MIN_SIZE):
                return ScaleIn.AT_MIN_SIZE
            raise
        return ScaleIn.TERMINATING

    def set_desired_capacity(self, asg_name: str, desired: int) -> None:
        """SetDesiredCapacity without honouring the cooldown (the decision is already rate-limited)."""
        check_name(asg_name, "Auto Scaling group name")
        if isinstance(desired, bool) or not isinstance(desired, int) or desired < 0:
            raise UserError(f"desired capacity {desired!r} is not a whole number >= 0")
        request = {"AutoScalingGroupName": asg_name, "DesiredCapacity": desired, "HonorCooldown": False}
        self._call("set_desired_capacity", "SetDesiredCapacity", request, asg_name)

    # -- plumbing ------------------------------------------------------------------------------
    @staticmethod
    def _lifecycle_request(asg_name: str, hook_name: str, instance_id: str, token: str | None) -> dict[str, Any]:
        check_name(asg_name, "Auto Scaling group name")
        check_hook_name(hook_name)
        check_instance_id(instance_id)
        request: dict[str, Any] = {
            "LifecycleHookName": hook_name,
            "AutoScalingGroupName": asg_name,
            "InstanceId": instance_id,
        }
        if token is not None:
            request["LifecycleActionToken"] = check_token(token)
        return request

    def _lifecycle_call(self, method: str, operation: str, request: dict[str, Any]) -> bool:
        subject = f"{request['InstanceId']} in {request['AutoScalingGroupName']} (hook {request['LifecycleHookName']})"
        try:
            self._call(method, operation, request, subject)
        except AsgError as err:
            if err.code == "ValidationError" and _says(err.aws_message, _NO_ACTIVE_ACTION):
                log.info("%s: no active lifecycle action for %s; nothing to do", operation, subject)
                return False
            raise
        return True

    def _call(self, method: str, operation: str, request: dict[str, Any], subject: str) -> dict[str, Any]:
        delay = self._retry.first_delay
        for attempt in range(1, self._retry.attempts + 1):
            try:
                return getattr(self._client, method)(**request)
            except ClientError as err:
                code, message = _error(err)
                if code in _CONTENTION and attempt < self._retry.attempts:
                    log.info("%s for %s: %s, retry %d in %.1fs", operation, subject, code, attempt, delay)
                    self._sleep(delay)
                    delay *= 2
                    continue
                if code == "ValidationError" and _says(message, *_NOT_IN_GROUP):
                    raise InstanceNotInGroup(operation, subject, code, message) from None
                raise AsgError(operation, subject, code, message) from None
        raise AssertionError("unreachable: the last attempt returns or raises")


class LifecycleHeartbeat:
    """Record heartbeats for one lifecycle action every ``interval`` seconds while the checkpoint is
    written; stops by itself on any ValidationError (the action is gone, or the group or hook is
    wrong: retrying cannot help) and on ``stop()``.

    Other failures (throttling, a network error surfaced by botocore) are logged and retried at the
    next interval: one lost heartbeat must not end the wait, the hook's timeout is several intervals.
    """

    def __init__(self, asg: AutoScaling, action: LifecycleAction, *, interval: float) -> None:
        if interval <= 0:
            raise UserError(f"heartbeat interval must be positive seconds, got {interval}")
        self._asg = asg
        self._action = action
        self._interval = interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"lifecycle-heartbeat-{action.instance_id}", daemon=True)
        self.beats = 0  # heartbeats AWS accepted
        self.ended_by_aws = False  # True once AWS said the action is no longer active

    def start(self) -> LifecycleHeartbeat:
        self._thread.start()
        return self

    def stop(self, timeout: float | None = None) -> None:
        self._stop.set()
        self._thread.join(timeout)

    def wait(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for the loop to end by itself; True when it has."""
        self._thread.join(timeout)
        return not self._thread.is_alive()

    def is_running(self) -> bool:
        return self._thread.is_alive()

    def _run(self) -> None:
        a = self._action
        while not self._stop.is_set():
            try:
                if not self._asg.heartbeat(a.asg_name, a.hook_name, a.instance_id, a.token):
                    self.ended_by_aws = True
                    return
                self.beats += 1
            except AsgError as err:
                if err.code == "ValidationError":  # will never succeed (wrong group or hook): stop, as NTH does
                    log.error("%s; heartbeats stopped", err)
                    self.ended_by_aws = True
                    return
                log.warning("%s; retrying at the next interval", err)
            self._stop.wait(self._interval)
