"""What the stack and the node agent agree on: CloudWatch metric names and dimensions, the node
settings the stack writes to ``/etc/gpucloud/node.env``, and the tags agents put on instances and
groups (the stack's IAM allows exactly those).

The agent publishes the backlog metrics (``agent/backlog_metric.py``) and the stack's alarms and
scaling policies read them (``infra/scaling.py``); both take the names from here, so neither
imports the other.
"""

from __future__ import annotations

# CloudWatch: the backlog metrics every agent publishes and the autoscaling alarms read
NAMESPACE = "gpucloud"
UNCLAIMED_SLOTS = "UnclaimedSlots"
BUSY_NODES = "BusyNodes"
LIVE_AGENTS = "LiveAgents"  # 1 from every running agent: someone publishes the groups' counts
FALLBACK_DUE_SLOTS = "FallbackDueSlots"  # forecast: slots falling due for a fallback group, by minute
CLUSTER_DIMENSION = "ClusterName"
NODE_GROUP_DIMENSION = "NodeGroup"
STATISTIC = "Maximum"
PERIOD_SECONDS = 60  # standard resolution: one datapoint per minute is all the alarm evaluates

# Node settings for the agent's own scale-in (written to /etc/gpucloud/node.env by the stack).
IDLE_MINUTES_ENV = "GPUCLOUD_IDLE_MINUTES"  # terminate this node, decrementing desired, after this idle time
SCALE_IN_ENV = "GPUCLOUD_SCALE_IN"  # "1": idle agents scale in; "0": the group keeps its size

# AWS Budgets: set by the stack only with onExceeded: stop-scale-out; the agents' budget gate reads them
BUDGET_NAME_ENV = "GPUCLOUD_BUDGET_NAME"
ACCOUNT_ID_ENV = "GPUCLOUD_ACCOUNT_ID"  # DescribeBudget takes the account explicitly
# The EC2 Auto Scaling process an agent suspends on its groups while the budget is exceeded: the backlog
# alarm's scaling policies stop launching nodes; running jobs and interrupted-node replacements go on
ALARM_PROCESS = "AlarmNotification"

# The job an instance runs, tagged by its agent while the attempt lasts (cost allocation, the console)
JOB_TAG = "gpucloud:job-id"

# On a group whose capacity block is ending: "<reservation id> <deadline, epoch seconds>". The group's
# agents stop taking work until the deadline; after it the tag is stale (the block is over), so a
# later block in the same group is not stopped by it.
BLOCK_ENDING_TAG = "gpucloud:block-ending"


def cluster_dimensions(cluster: str) -> list[dict[str, str]]:
    """``LiveAgents``' dimension: the cluster alone (any agent of any group counts)."""
    return [{"Name": CLUSTER_DIMENSION, "Value": cluster}]


def dimensions(cluster: str, node_group: str) -> list[dict[str, str]]:
    """The metric's dimensions, in the ``[{"Name", "Value"}]`` form CloudWatch APIs take."""
    return [{"Name": CLUSTER_DIMENSION, "Value": cluster}, {"Name": NODE_GROUP_DIMENSION, "Value": node_group}]
