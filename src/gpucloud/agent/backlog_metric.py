"""The backlog metric: the one contract between the stack's scale-out alarm and the publishers.

The stack (``infra/scaling.py``) alarms on these names; the node agents send them with
``put_metric_data_request``. Both import this module, so a renamed metric or dimension cannot
leave the alarm watching nothing. A group with no node has no publisher: the alarm then reads the
job queue's own ``AWS/SQS ApproximateNumberOfMessagesVisible`` (one message per unclaimed slot),
which SQS publishes by itself (see ``infra/scaling_plan.py``).

Per node group and minute, two group-wide counts:

- ``UnclaimedSlots``: slots of queued gangs for this group that no node has claimed;
- ``BusyNodes``: nodes of this group that hold a slot (running or forming a gang).

The alarm computes ``BusyNodes + UnclaimedSlots - GroupDesiredCapacity`` and adds that many nodes,
so the group converges on ``desired = busy + unclaimed`` (bounded by ``maxNodes``). Every publisher
sends the same group-wide counts, so the alarm reads the ``Maximum`` of each minute: duplicates
from several agents collapse instead of adding up (``Sum`` would multiply the backlog).

Counts are per node group: a group's jobs (``submit --group``; its fallback jobs once they waited
long enough) and the nodes whose agents serve it. Every agent publishes the counts of *every*
group of the cluster (each reads the same job table), so a group at 0 nodes still gets its backlog
published by the others, and an idle group's datapoints say 0 while another group is busy.
``LiveAgents`` (cluster dimension only) tells the wake-up term of the alarms that some agent is up
and publishing, so the job queue's own metric is not needed then (``infra/scaling_plan.py``).

No AWS import here: the agents build the request without pulling in the stack's dependencies.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from typing import Any

NAMESPACE = "gpucloud"
UNCLAIMED_SLOTS = "UnclaimedSlots"
BUSY_NODES = "BusyNodes"
LIVE_AGENTS = "LiveAgents"  # 1 from every running agent: someone publishes the groups' counts
CLUSTER_DIMENSION = "ClusterName"
NODE_GROUP_DIMENSION = "NodeGroup"
STATISTIC = "Maximum"
PERIOD_SECONDS = 60  # standard resolution: one datapoint per minute is all the alarm evaluates
UNIT = "Count"

# Node settings for the agent's own scale-in (written to /etc/gpucloud/node.env by the stack).
IDLE_MINUTES_ENV = "GPUCLOUD_IDLE_MINUTES"  # terminate this node, decrementing desired, after this idle time
SCALE_IN_ENV = "GPUCLOUD_SCALE_IN"  # "1": idle agents scale in; "0": the group keeps its size


def cluster_dimensions(cluster: str) -> list[dict[str, str]]:
    """``LiveAgents``' dimension: the cluster alone (any agent of any group counts)."""
    return [{"Name": CLUSTER_DIMENSION, "Value": cluster}]


def dimensions(cluster: str, node_group: str) -> list[dict[str, str]]:
    """The metric's dimensions, in the ``[{"Name", "Value"}]`` form CloudWatch APIs take."""
    return [{"Name": CLUSTER_DIMENSION, "Value": cluster}, {"Name": NODE_GROUP_DIMENSION, "Value": node_group}]


@dataclasses.dataclass(frozen=True)
class GroupBacklog:
    """What one publisher knows about one node group at one moment."""

    cluster: str
    node_group: str
    unclaimed_slots: int
    busy_nodes: int

    def __post_init__(self) -> None:
        for name in ("cluster", "node_group"):
            if not getattr(self, name):
                raise ValueError(f"{name} must not be empty")
        for name in ("unclaimed_slots", "busy_nodes"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"{name} must be a count (an int >= 0), got {value!r}")

    @property
    def wanted_nodes(self) -> int:
        """The group size the scale-out alarm steers towards."""
        return self.busy_nodes + self.unclaimed_slots


def put_metric_data_request(backlogs: list[GroupBacklog], timestamp: dt.datetime) -> dict[str, Any]:
    """Keyword arguments for CloudWatch ``PutMetricData``: both counts of every given group.

    Both metrics go in one call with one timestamp so the alarm's expression never sees one
    without the other (a missing term would make the whole expression empty for that minute),
    with one ``LiveAgents`` datapoint per cluster named.
    """
    if not backlogs:
        raise ValueError("no node group backlog to publish")
    if timestamp.tzinfo is None:
        raise ValueError("timestamp must be timezone-aware (UTC)")
    data: list[dict[str, Any]] = [
        {
            "MetricName": LIVE_AGENTS,
            "Dimensions": cluster_dimensions(cluster),
            "Timestamp": timestamp,
            "Value": 1.0,
            "Unit": UNIT,
        }
        for cluster in dict.fromkeys(b.cluster for b in backlogs)
    ]
    for backlog in backlogs:
        dims = dimensions(backlog.cluster, backlog.node_group)
        for name, value in ((UNCLAIMED_SLOTS, backlog.unclaimed_slots), (BUSY_NODES, backlog.busy_nodes)):
            data.append(
                {"MetricName": name, "Dimensions": dims, "Timestamp": timestamp, "Value": float(value), "Unit": UNIT}
            )
    return {"Namespace": NAMESPACE, "MetricData": data}
