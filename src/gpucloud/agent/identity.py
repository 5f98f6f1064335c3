"""Who this node is: from IMDS on EC2 (or an emulator), from the host offline."""

from __future__ import annotations

import dataclasses
import os
import socket

from gpucloud.signals.imds import ImdsClient, ImdsUnavailable


@dataclasses.dataclass(frozen=True)
class NodeIdentity:
    worker: str  # the agent's id in the queue (slot claims, node records)
    address: str  # the private address gang members reach this node on
    instance_id: str | None = None
    instance_type: str | None = None
    lifecycle: str | None = None  # spot | on-demand
    availability_zone: str | None = None  # placement/availability-zone: what a spot price is quoted for
    region: str | None = None  # placement/region

    def placement(self) -> dict[str, str | None]:
        """What each attempt records about the node it ran on (the ``started`` event's ``node``),
        from which ``cost/job_cost.py`` prices the attempt."""
        return {
            "instance_id": self.instance_id,
            "instance_type": self.instance_type,
            "lifecycle": self.lifecycle,
            "availability_zone": self.availability_zone,
            "region": self.region,
        }


def discover(imds_endpoint: str | None, *, address: str | None = None, give_up_early: bool = False) -> NodeIdentity:
    """Read instance id, type, life cycle, AZ, region and private address from IMDS; ``address`` overrides
    the private address (several agents on one host). Without IMDS: the host name and 127.0.0.1.
    ``give_up_early``: no IMDS answer for the instance id means no IMDS (a laptop), so ask no more
    (one connect timeout, not one per fact: ``spot-train`` and ``worker`` off EC2)."""
    facts: dict[str, str | None] = {}
    if imds_endpoint is not None:
        client = ImdsClient(imds_endpoint, connect_timeout=1.0, read_timeout=2.0)
        for name, path in (
            ("instance_id", "instance-id"),
            ("instance_type", "instance-type"),
            ("lifecycle", "instance-life-cycle"),
            ("private_ip", "local-ipv4"),
            # https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/instancedata-data-categories.html
            ("availability_zone", "placement/availability-zone"),
            ("region", "placement/region"),
        ):
            try:
                facts[name] = client.get_text(f"/latest/meta-data/{path}")
            except ImdsUnavailable:
                facts[name] = None
                if give_up_early and name == "instance_id":
                    break
    host = socket.gethostname()
    node = facts.get("instance_id") or host
    return NodeIdentity(
        worker=f"{node}:{os.getpid()}",
        address=address or facts.get("private_ip") or "127.0.0.1",
        instance_id=facts.get("instance_id"),
        instance_type=facts.get("instance_type"),
        lifecycle=facts.get("lifecycle"),
        availability_zone=facts.get("availability_zone"),
        region=facts.get("region"),
    )


@dataclasses.dataclass(frozen=True)
class NodeLabels:
    """The node's labels: on every series (``instance_id``, ``node_group``) and on the info gauge."""

    instance_id: str  # the EC2 instance id; the agent's worker id off EC2
    node_group: str  # the group the agent serves; "" (no label) off a cluster
    instance_type: str = ""
    lifecycle: str = ""  # spot | on-demand
    worker: str = ""

    @classmethod
    def of(cls, identity: NodeIdentity, node_group: str | None) -> NodeLabels:
        return cls(
            instance_id=identity.instance_id or identity.worker,
            node_group=node_group or "",
            instance_type=identity.instance_type or "",
            lifecycle=identity.lifecycle or "",
            worker=identity.worker,
        )
