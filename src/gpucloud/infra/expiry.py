"""``gpucloud:expires-at`` computed once, not at every run.

Computed from the clock at every run, the tag moved forward at each ``pulumi up``: every tagged
resource was updated and every launch template cut a new version on every deploy, changes that
are not changes. So the first run writes the expiry into an SSM parameter of the stack
(``/gpucloud/<stack>/expires-at``, a free Standard parameter) whose value later runs ignore
(``ignoreChanges``), and every resource is tagged with the parameter's value. The TTL is in the
parameter's name: a new ``gpucloud:ttlHours`` is a new parameter (the old one deleted), created
with a value computed then. A replacement would not do: the engine keeps an ignored input's old
value for the replacement too. https://www.pulumi.com/docs/iac/concepts/options/ignorechanges/
"""

from __future__ import annotations

import pulumi
import pulumi_aws as aws

from gpucloud.cluster.tags import Tagging, expires_at


def parameter_name(stack: str, ttl_hours: float) -> str:
    return f"/gpucloud/{stack}/expires-at/{ttl_hours:g}h"


def stack_expiry(name: str, tagging: Tagging, ttl_hours: float | None) -> pulumi.Output[str] | None:
    """The stack's ``gpucloud:expires-at``: set by the first run with ``ttl_hours``, kept after."""
    first = expires_at(ttl_hours)
    if first is None or ttl_hours is None:
        return None
    anchor = aws.ssm.Parameter(
        f"{name}-{ttl_hours:g}h",
        name=parameter_name(tagging.stack, ttl_hours),
        type="String",
        insecure_value=first,  # not `value`, which the provider marks secret: the tags would be too
        description=f"gpucloud:ttlHours {ttl_hours:g}: when gpucloud sweep --expired may delete this stack",
        # tagged like the rest (the policy pack wants the expiry on every tagged resource), once
        tags=Tagging(tagging.stack, tagging.cluster, tagging.extra, first).tags("expires-at"),
        opts=pulumi.ResourceOptions(ignore_changes=["insecureValue", "tags"]),
    )
    return anchor.insecure_value
