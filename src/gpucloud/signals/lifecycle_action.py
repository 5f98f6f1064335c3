"""The identity of one ASG termination lifecycle action, as carried in a ``Notice`` payload.

The events queue puts the token, hook and group names into ``Notice.payload`` under the keys AWS
uses; the handler reads them back with ``lifecycle_action_of`` to complete the action after the
commit (``asg.AutoScaling.complete_termination``).
"""

from __future__ import annotations

import dataclasses

from gpucloud.aws_ids import check_hook_name, check_instance_id, check_name, check_token
from gpucloud.signals.events import Notice

TOKEN = "LifecycleActionToken"
GROUP = "AutoScalingGroupName"
HOOK = "LifecycleHookName"
INSTANCE = "EC2InstanceId"
TRANSITION = "LifecycleTransition"

TERMINATING = "autoscaling:EC2_INSTANCE_TERMINATING"
LAUNCHING = "autoscaling:EC2_INSTANCE_LAUNCHING"


@dataclasses.dataclass(frozen=True)
class LifecycleAction:
    asg_name: str
    hook_name: str
    instance_id: str
    token: str | None = None  # None: identify the action by instance id (the IMDS path has no token)

    def __post_init__(self) -> None:
        check_name(self.asg_name, "Auto Scaling group name")
        check_hook_name(self.hook_name)
        check_instance_id(self.instance_id)
        if self.token is not None:
            check_token(self.token)

    def to_payload(self) -> dict[str, str]:
        payload = {GROUP: self.asg_name, HOOK: self.hook_name, INSTANCE: self.instance_id, TRANSITION: TERMINATING}
        if self.token is not None:
            payload[TOKEN] = self.token
        return payload


def lifecycle_action_of(notice: Notice) -> LifecycleAction | None:
    """The lifecycle action an ``asg-terminate`` notice from the events queue names; None otherwise."""
    payload = notice.payload
    if notice.kind != "asg-terminate" or not all(isinstance(payload.get(k), str) for k in (GROUP, HOOK, INSTANCE)):
        return None
    return LifecycleAction(
        asg_name=payload[GROUP], hook_name=payload[HOOK], instance_id=payload[INSTANCE], token=payload.get(TOKEN)
    )
