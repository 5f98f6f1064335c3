"""Pure planning for a node group's autoscaling (no Pulumi import): the scale-out steps and the
capacity-block wind-down time. ``infra/scaling.py`` turns them into resources; the validators in
``spec/rules.py`` use the same functions, so what is checked is what gets built.

Why step scaling, not target tracking. Target tracking sets ``desired = current * metric / target``:
with a per-instance backlog metric (AWS's "scaling based on Amazon SQS" recipe) the divisor is the
in-service count, which is 0 exactly when a group scaled to zero has work again, and 0 times
anything stays 0. A step policy adds a number of nodes, which works from zero. Its alarm watches
the shortfall ``busy + unclaimed - desired`` (the metric math below); the steps add exactly that
shortfall (one step per node count, up to the quota), so the group converges on
``desired = busy + unclaimed``. Desired capacity already counts nodes that are still booting, so
a backlog that stays unclaimed while they boot is not bought twice. AWS clamps every adjustment to
``maxNodes``.

Scale-in is never done by the policy: there is no low alarm and every step adds nodes. Idle agents
terminate their own node with a decrement (only they know they are idle), and busy nodes hold
scale-in protection, so neither the policy nor a lower desired capacity can take a node mid-job.

The alarm's metric math, and why it scales out from zero. ``unclaimed`` must not depend on a node
being up: a group at 0 nodes has no agent to publish ``UnclaimedSlots``. The job queue carries one
SQS message per unclaimed gang slot (a slot held by a waiting or running member is in flight, so
invisible), so AWS's own ``AWS/SQS ApproximateNumberOfMessagesVisible`` of the job queue is an
unclaimed-slot count that nobody has to publish. The agents' count, when there is one, can be
higher: it counts a slot as unclaimed as soon as its claim is gone, while the slot's message may stay
invisible until its visibility timeout ends. So the alarm takes the larger of the two each minute::

    agents    = FILL(agent_unclaimed, REPEAT)      gpucloud UnclaimedSlots, Maximum, 60 s
    queued    = FILL(queued_slots, REPEAT)         AWS/SQS ApproximateNumberOfMessagesVisible
    shortfall = FILL(busy_nodes, REPEAT) + IF(agents > queued, agents, queued)
                - FILL(desired, REPEAT)            AWS/AutoScaling GroupDesiredCapacity

CloudWatch semantics this relies on (CloudWatch User Guide, "Using metric math"):

- Arithmetic treats a missing value as 0, and a comparison between two series treats the missing
  side as 0; so a series with no data at all (no agent has ever published) counts as 0 nodes/slots.
- ``IF(cond, a, b)`` is evaluated separately for every timestamp: a pointwise maximum. ``MAX([..])``
  would also be pointwise over an array, but AWS advises against ``MAX`` in alarms, so it is not used.
- ``FILL(x, REPEAT)`` carries the last value over a minute whose datapoint is late. ``FILL(x, 0)``
  would turn a late datapoint into 0 at the newest minute, which AWS documents as keeping an alarm
  stuck in OK; a late ``desired`` read as 0 would instead buy the whole group again.

Several node groups. The job queue is one for the cluster, so its visible messages are every
group's unclaimed slots together: a group whose alarm counted them would scale out for the others'
jobs and idle back in, over and over. So only a cluster of one group counts them as above
(``QueueTerm.COUNT``). With several groups every agent publishes every group's counts (a group
with no node is published for by the others: ``agent/backlog_metric.py``), and the queue only
*wakes* the cluster when no agent is up at all: the first group with scaling (``QueueTerm.WAKE``)
adds one node while slot messages are visible and no ``LiveAgents`` datapoint exists; that node's
agent then publishes every group's real counts. The other groups' alarms read only their own
counts (``QueueTerm.NONE``)::

    waiting   = IF(queued > 0, 1, 0)
    wake      = IF(waiting > live_agents, 1, 0)           gpucloud LiveAgents, Maximum, 60 s
    shortfall = FILL(busy_nodes, REPEAT) + IF(agents > wake, agents, wake) - FILL(desired, REPEAT)

A fallback group with no agent anywhere. A job with ``--fallback-group`` counts for its fallback
group once it has waited ``--fallback-after``; if by then every node is gone (a spot group lost all
its nodes and AWS has no spot capacity), no agent publishes that count, and the first group's wake
only asks the spot group again. So the agents forecast it: every publication carries, under the
fallback group's dimension, the slots of each queued job whose fallback is not yet due, timestamped
at the minutes it falls due (``FallbackDueSlots``, ``agent/backlog_metric.py``). Every alarm of a
several-group cluster reads the forecast, and only while no agent is up (no ``LiveAgents``
datapoint: nobody can have claimed the job since), so the fallback group adds the gang's nodes when
the wait is over::

    fallback_waiting = IF(FILL(fallback_due, 0) > 0, 1, 0)
    fallback  = IF(fallback_waiting > live_agents, FILL(fallback_due, 0), 0)
    shortfall = FILL(busy_nodes, REPEAT) + max(agents, wake, fallback) - FILL(desired, REPEAT)

(``max`` written as two pointwise ``IF``s; the first group's alarm has the ``wake`` term, the others
not). The forecast comes from the last agent that saw the job queued: an agent stopping for a
notice publishes once more after its attempt is requeued. One killed without any chance to publish
leaves no forecast; the job then waits for a node of its own group or a submit's wake.

The cost of waking one node of the first group for another group's job on an empty cluster is
that node's boot and idle minutes; a gang of that group's own waits one boot more than with the
count. Group B at 0 nodes beside a busy group A scales out within a minute of the submit.

Lag of a scale-out from zero (nothing running, a job submitted): SQS publishes its metrics once a
minute while the queue is active, that is, for six hours after it last held a message or served
any call (agents long-poll it while any node runs). Within that window the submitted slots show
in the next minute's datapoint and the alarm, which evaluates every minute, starts the scale-out
1-3 minutes after the submit. A queue idle for more than six hours is inactive and SQS stops
publishing; the submit's SendMessage reactivates it, and AWS says its metrics then resume with a
delay of up to 15 minutes, so the first scale-out after a quiet night can take up to ~15 minutes
plus the minute above. Instance boot and the bootstrap come on top in both cases.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import enum
import math

# EC2 Auto Scaling quota: step adjustments per step scaling policy.
MAX_STEP_ADJUSTMENTS = 20
# AWS starts terminating a Capacity Block's instances this long before the block's end time.
CAPACITY_BLOCK_RECLAIM_MINUTES = 30
WIND_DOWN_MARGIN_MINUTES = 5  # slack between our drain deadline and AWS's reclaim

# The backlog alarm's metric math (ids must start with a lower-case letter). ``infra/scaling.py``
# wires these into the alarm; the tests read the same names.
BUSY_NODES_ID = "busy_nodes"  # gpucloud BusyNodes, published by the agents
AGENT_UNCLAIMED_ID = "agent_unclaimed"  # gpucloud UnclaimedSlots, published by the agents
QUEUED_SLOTS_ID = "queued_slots"  # AWS/SQS ApproximateNumberOfMessagesVisible of the job queue
DESIRED_ID = "desired"  # AWS/AutoScaling GroupDesiredCapacity of the group
AGENTS_ID = "agents"
QUEUED_ID = "queued"
SHORTFALL_ID = "shortfall"
AGENTS_EXPRESSION = f"FILL({AGENT_UNCLAIMED_ID}, REPEAT)"
QUEUED_EXPRESSION = f"FILL({QUEUED_SLOTS_ID}, REPEAT)"
UNCLAIMED_EXPRESSION = f"IF({AGENTS_ID} > {QUEUED_ID}, {AGENTS_ID}, {QUEUED_ID})"  # pointwise maximum
SHORTFALL_EXPRESSION = f"FILL({BUSY_NODES_ID}, REPEAT) + {UNCLAIMED_EXPRESSION} - FILL({DESIRED_ID}, REPEAT)"
# Several groups (see the module docstring): the first scaling group wakes an empty cluster.
LIVE_AGENTS_ID = "live_agents"  # gpucloud LiveAgents (cluster dimension), published by every agent
WAITING_ID = "waiting"
WAKE_ID = "wake"
WAITING_EXPRESSION = f"IF({QUEUED_ID} > 0, 1, 0)"
WAKE_EXPRESSION = f"IF({WAITING_ID} > {LIVE_AGENTS_ID}, 1, 0)"  # a missing live_agents compares as 0
# Several groups: the fallback forecast, read only while no agent is up (see the module docstring).
FALLBACK_DUE_ID = "fallback_due"  # gpucloud FallbackDueSlots (group dimension), forecast by the agents
FALLBACK_WAITING_ID = "fallback_waiting"
FALLBACK_ID = "fallback"
LATE_ID = "late"  # the larger of the wake and fallback terms (first group only)
FALLBACK_WAITING_EXPRESSION = f"IF(FILL({FALLBACK_DUE_ID}, 0) > 0, 1, 0)"
FALLBACK_EXPRESSION = f"IF({FALLBACK_WAITING_ID} > {LIVE_AGENTS_ID}, FILL({FALLBACK_DUE_ID}, 0), 0)"
LATE_EXPRESSION = f"IF({WAKE_ID} > {FALLBACK_ID}, {WAKE_ID}, {FALLBACK_ID})"
WAKE_SHORTFALL_EXPRESSION = (
    f"FILL({BUSY_NODES_ID}, REPEAT) + IF({AGENTS_ID} > {LATE_ID}, {AGENTS_ID}, {LATE_ID}) - FILL({DESIRED_ID}, REPEAT)"
)
OWN_SHORTFALL_EXPRESSION = (
    f"FILL({BUSY_NODES_ID}, REPEAT) + IF({AGENTS_ID} > {FALLBACK_ID}, {AGENTS_ID}, {FALLBACK_ID})"
    f" - FILL({DESIRED_ID}, REPEAT)"
)
# PutMetricAlarm: at most 10 queries that fetch a metric and 10 expressions per alarm
# (CloudWatch API Reference, MetricDataQuery).
MAX_ALARM_METRICS = 10
MAX_ALARM_EXPRESSIONS = 10


class QueueTerm(str, enum.Enum):
    """How a group's alarm reads the cluster's job queue (one queue for every group)."""

    COUNT = "count"  # the only group: every visible slot message is its unclaimed slot
    WAKE = "wake"  # the first scaling group of several: one node when no agent is up to publish
    NONE = "none"  # another group: only the counts the agents publish for it


def queue_terms(groups: list[tuple[str, bool]]) -> dict[str, QueueTerm]:
    """Each scaling group's ``QueueTerm``, from the stack's groups in order as (name, scaling on)."""
    scaling = [name for name, enabled in groups if enabled]
    if len(groups) == 1:
        return {name: QueueTerm.COUNT for name in scaling}
    return {name: QueueTerm.WAKE if i == 0 else QueueTerm.NONE for i, name in enumerate(scaling)}


def shortfall(
    term: QueueTerm,
    *,
    busy: int,
    agents_unclaimed: int,
    queued_visible: int,
    live_agents: int,
    desired: int,
    fallback_due: int = 0,
) -> int:
    """The alarm's value at one minute with every input present (the expressions above, in Python):
    how many nodes the policy adds when positive."""
    if term is QueueTerm.COUNT:
        return busy + max(agents_unclaimed, queued_visible) - desired
    fallback = fallback_due if (1 if fallback_due > 0 else 0) > live_agents else 0
    if term is QueueTerm.WAKE:
        wake = 1 if (1 if queued_visible > 0 else 0) > live_agents else 0
        return busy + max(agents_unclaimed, wake, fallback) - desired
    return busy + max(agents_unclaimed, fallback) - desired


QUEUE_NAMESPACE = "AWS/SQS"
QUEUE_VISIBLE_METRIC = "ApproximateNumberOfMessagesVisible"
QUEUE_DIMENSION = "QueueName"


@dataclasses.dataclass(frozen=True)
class ScaleOutStep:
    """Add ``add`` nodes while the shortfall is in ``[lower, upper)`` (``upper`` None: no bound).

    Bounds are relative to the alarm threshold, which is 0, so they are shortfall values.
    """

    lower: int
    upper: int | None
    add: int


def scale_out_steps(max_nodes: int) -> list[ScaleOutStep]:
    """One step per shortfall of 1..N nodes (N = min(maxNodes, quota)); the last is open-ended.

    The first step starts at 0 so it also catches a shortfall averaged below 1 and adds one node
    (AWS requires the steps to leave no gap above the threshold). A shortfall above the quota adds
    N now; the alarm fires again each minute it stays breached, so the rest follows.
    """
    if max_nodes < 1:
        raise ValueError(f"max_nodes must be at least 1, got {max_nodes}")
    top = min(max_nodes, MAX_STEP_ADJUSTMENTS)
    steps = [ScaleOutStep(lower=0, upper=2 if top > 1 else None, add=1)]
    for nodes in range(2, top + 1):
        steps.append(ScaleOutStep(lower=nodes, upper=nodes + 1 if nodes < top else None, add=nodes))
    return steps


def minimum_lead_minutes(drain_timeout_seconds: int) -> int:
    """Scale to 0 at least this long before a block ends: AWS reclaims nodes 30 min before the
    end, and a node told to stop at our scale-down may take the drain timeout to checkpoint."""
    return CAPACITY_BLOCK_RECLAIM_MINUTES + math.ceil(drain_timeout_seconds / 60)


def default_lead_minutes(drain_timeout_seconds: int) -> int:
    return minimum_lead_minutes(drain_timeout_seconds) + WIND_DOWN_MARGIN_MINUTES


def wind_down_time(block_end: dt.datetime, lead_minutes: int) -> dt.datetime:
    """When the scheduled action sets the group to 0 nodes: ``lead_minutes`` before the end, UTC,
    whole seconds (the format scheduled actions take)."""
    if block_end.tzinfo is None:
        raise ValueError("block_end must be timezone-aware")
    return (block_end - dt.timedelta(minutes=lead_minutes)).astimezone(dt.timezone.utc).replace(microsecond=0)


def schedule_timestamp(moment: dt.datetime) -> str:
    """``2026-12-01T10:55:00Z``: the ISO 8601 UTC form Auto Scaling's ``StartTime`` expects."""
    return moment.astimezone(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
