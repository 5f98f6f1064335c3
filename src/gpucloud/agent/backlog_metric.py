"""The backlog metric: the one contract between the stack's scale-out alarm and the publishers.

The stack (``infra/scaling.py``) alarms on these names; the node agents send them with
``put_metric_data_request``. Both import this module, so a renamed metric or dimension cannot
leave the alarm watching nothing. A group with no node has no publisher: the alarm then reads the
job queue's own ``AWS/SQS ApproximateNumberOfMessagesVisible`` (one message per unclaimed slot),
which SQS publishes by itself (see ``cluster/scaling_plan.py``).

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
and publishing, so the job queue's own metric is not needed then (``cluster/scaling_plan.py``).

Busy agents publish too (at most once a period), not only idle ones: with every node busy, a
missing ``BusyNodes`` would read as 0 and the alarm would compute ``0 + queued - desired``, a
shortfall below zero while a gang waits.

``FallbackDueSlots``: a forecast, the one metric published with timestamps in the future. A job
with ``--fallback-group`` becomes its fallback group's backlog only once its attempt has waited
``--fallback-after``; if by then no agent is up (the spot group lost every node and AWS has no spot
capacity to replace them), nobody would publish that backlog. So every publication also carries,
for each queued job whose fallback is not yet due, its unclaimed slots under the fallback group's
dimension at each minute of ``FORECAST_MINUTES`` from the moment it falls due. CloudWatch accepts
datapoints up to two hours ahead (``MAX_FORECAST_SECONDS``; CloudWatch User Guide, "Metrics
concepts", Time stamps). The fallback group's alarm reads the forecast only while no
``LiveAgents`` datapoint exists: then no agent could have claimed the job meanwhile, so the
forecast is still the truth; with an agent up, the published counts already say it.

No AWS import here: the agents build the request without pulling in the stack's dependencies.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from typing import Any

from gpucloud.cluster.agent_contract import (
    BUSY_NODES,
    FALLBACK_DUE_SLOTS,
    LIVE_AGENTS,
    NAMESPACE,
    PERIOD_SECONDS,
    UNCLAIMED_SLOTS,
    cluster_dimensions,
    dimensions,
)

FORECAST_MINUTES = 15  # each forecast covers this many minutes from its due time (late alarm evaluations)
MAX_FORECAST_SECONDS = 2 * 3600  # CloudWatch refuses datapoints more than two hours in the future
MAX_DATUMS = 1000  # PutMetricData: at most 1000 metric datums per request
UNIT = "Count"


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


@dataclasses.dataclass(frozen=True)
class FallbackDue:
    """Slots of queued jobs that fall due for ``node_group`` (their fallback group) at ``at``."""

    cluster: str
    node_group: str
    at: dt.datetime  # the start of a minute, in the future
    slots: int

    def __post_init__(self) -> None:
        if self.at.tzinfo is None:
            raise ValueError("a forecast's time must be timezone-aware (UTC)")
        if isinstance(self.slots, bool) or not isinstance(self.slots, int) or self.slots < 0:
            raise ValueError(f"slots must be a count (an int >= 0), got {self.slots!r}")


def forecast_minutes(due_at: float, now: float) -> list[float]:
    """The minute starts (epoch seconds) a job falling due at ``due_at`` is forecast for: from the
    first whole minute at or after it, ``FORECAST_MINUTES`` of them, none past CloudWatch's limit."""
    first = -(-due_at // PERIOD_SECONDS) * PERIOD_SECONDS
    return [
        m
        for m in (first + i * PERIOD_SECONDS for i in range(FORECAST_MINUTES))
        if now < m <= now + MAX_FORECAST_SECONDS
    ]


def put_metric_data_request(
    backlogs: list[GroupBacklog], timestamp: dt.datetime, forecasts: list[FallbackDue] | None = None
) -> dict[str, Any]:
    """Keyword arguments for CloudWatch ``PutMetricData``: both counts of every given group.

    Both metrics go in one call with one timestamp so the alarm's expression never sees one
    without the other (a missing term would make the whole expression empty for that minute),
    with one ``LiveAgents`` datapoint per cluster named, then the fallback forecasts (the soonest
    first, as many as fit in one request).
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
    for due in sorted(forecasts or [], key=lambda f: f.at)[: max(0, MAX_DATUMS - len(data))]:
        data.append(
            {
                "MetricName": FALLBACK_DUE_SLOTS,
                "Dimensions": dimensions(due.cluster, due.node_group),
                "Timestamp": due.at,
                "Value": float(due.slots),
                "Unit": UNIT,
            }
        )
    return {"Namespace": NAMESPACE, "MetricData": data}
