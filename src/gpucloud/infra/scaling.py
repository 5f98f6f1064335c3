"""Autoscaling of one node group: scale out on the backlog, wind a capacity block down in time.

- ``BacklogScaling``: a CloudWatch alarm on the shortfall ``busy + unclaimed - desired`` and a
  step scaling policy that adds that many nodes. ``unclaimed`` is the larger of the agents'
  ``UnclaimedSlots`` (names from ``gpucloud.agent.backlog_metric``, the agents' side of the contract) and
  the job queue's visible messages, which SQS publishes itself, so a group at 0 nodes still scales
  out. With several node groups the queue (one for all of them) only wakes an empty cluster, from
  the first scaling group's alarm; each group otherwise reads its own counts (``QueueTerm``). The
  metric math, its CloudWatch semantics and the scale-from-zero lag, why step scaling and why it
  never scales in: ``scaling_plan``'s docstring.
- ``CapacityBlockWindDown``: a one-time scheduled action that sets the group to 0 nodes (min, max
  and desired, so the backlog alarm cannot launch into the dying block) ahead of the block's end.

Neither has tags in AWS (policies and scheduled actions are settings of the group); the alarm does.
"""

from __future__ import annotations

import dataclasses
import datetime as dt

import pulumi
import pulumi_aws as aws

from gpucloud.cluster import agent_contract as metric
from gpucloud.cluster import scaling_plan as plan
from gpucloud.cluster.scaling_plan import QueueTerm, scale_out_steps, schedule_timestamp, wind_down_time
from gpucloud.cluster.tags import Tagging

# The ASG's own group metrics the alarm reads (collected at 1-minute granularity, free of charge);
# the others are for operators' dashboards.
GROUP_METRICS = (
    "GroupDesiredCapacity",
    "GroupInServiceInstances",
    "GroupPendingInstances",
    "GroupTerminatingInstances",
)


def shortfall_queries(
    cluster: str,
    node_group: str,
    asg_name: pulumi.Input[str],
    job_queue_name: pulumi.Input[str],
    queue_term: QueueTerm = QueueTerm.COUNT,
) -> list[aws.cloudwatch.MetricAlarmMetricQueryArgs]:
    """The alarm's metric math: nodes wanted (busy + unclaimed) minus nodes already asked for.
    ``queue_term``: how the cluster's one job queue counts for this group (``scaling_plan``)."""

    def stat(query_id: str, namespace: str, name: str, dims: dict) -> aws.cloudwatch.MetricAlarmMetricQueryArgs:
        return aws.cloudwatch.MetricAlarmMetricQueryArgs(
            id=query_id,
            return_data=False,
            metric=aws.cloudwatch.MetricAlarmMetricQueryMetricArgs(
                namespace=namespace,
                metric_name=name,
                dimensions=dims,
                stat=metric.STATISTIC,
                period=metric.PERIOD_SECONDS,
            ),
        )

    def expression(
        query_id: str, text: str, label: str, result: bool = False
    ) -> aws.cloudwatch.MetricAlarmMetricQueryArgs:
        return aws.cloudwatch.MetricAlarmMetricQueryArgs(id=query_id, expression=text, label=label, return_data=result)

    group_dims = {d["Name"]: d["Value"] for d in metric.dimensions(cluster, node_group)}
    own = [
        stat(plan.BUSY_NODES_ID, metric.NAMESPACE, metric.BUSY_NODES, group_dims),
        stat(plan.AGENT_UNCLAIMED_ID, metric.NAMESPACE, metric.UNCLAIMED_SLOTS, group_dims),
    ]
    desired = stat(plan.DESIRED_ID, "AWS/AutoScaling", "GroupDesiredCapacity", {"AutoScalingGroupName": asg_name})
    agents = expression(plan.AGENTS_ID, plan.AGENTS_EXPRESSION, "Unclaimed slots the agents count")
    short = "Nodes short of busy + unclaimed"
    cluster_dims = {d["Name"]: d["Value"] for d in metric.cluster_dimensions(cluster)}
    live = stat(plan.LIVE_AGENTS_ID, metric.NAMESPACE, metric.LIVE_AGENTS, cluster_dims)
    # Several groups: a job's fallback falling due while no agent is up (the agents' forecast).
    fallback = [
        stat(plan.FALLBACK_DUE_ID, metric.NAMESPACE, metric.FALLBACK_DUE_SLOTS, group_dims),
        expression(plan.FALLBACK_WAITING_ID, plan.FALLBACK_WAITING_EXPRESSION, "Fallback slots due (1) or none (0)"),
        expression(plan.FALLBACK_ID, plan.FALLBACK_EXPRESSION, "Fallback slots due while no agent is up"),
    ]
    if queue_term is QueueTerm.NONE:  # another group's slots share the queue: its own counts only
        return [
            *own,
            live,
            desired,
            agents,
            *fallback,
            expression(plan.SHORTFALL_ID, plan.OWN_SHORTFALL_EXPRESSION, short, True),
        ]
    # One message per unclaimed gang slot; SQS publishes it with no node up.
    queued = [
        stat(
            plan.QUEUED_SLOTS_ID,
            plan.QUEUE_NAMESPACE,
            plan.QUEUE_VISIBLE_METRIC,
            {plan.QUEUE_DIMENSION: job_queue_name},
        ),
    ]
    queued_expr = expression(plan.QUEUED_ID, plan.QUEUED_EXPRESSION, "Slot messages visible in the job queue")
    if queue_term is QueueTerm.COUNT:
        return [
            *own,
            *queued,
            desired,
            agents,
            queued_expr,
            expression(plan.SHORTFALL_ID, plan.SHORTFALL_EXPRESSION, short, result=True),
        ]
    return [
        *own,
        *queued,
        live,
        desired,
        agents,
        queued_expr,
        expression(plan.WAITING_ID, plan.WAITING_EXPRESSION, "Any slot message visible (1) or none (0)"),
        expression(plan.WAKE_ID, plan.WAKE_EXPRESSION, "One node when slots wait and no agent is up"),
        *fallback,
        expression(plan.LATE_ID, plan.LATE_EXPRESSION, "Wake or fallback nodes with no agent up"),
        expression(plan.SHORTFALL_ID, plan.WAKE_SHORTFALL_EXPRESSION, short, result=True),
    ]


@dataclasses.dataclass
class BacklogScalingArgs:
    tagging: Tagging
    node_group: str
    asg_name: pulumi.Input[str]
    job_queue_name: pulumi.Input[str]  # the cluster's job queue: its visible messages are unclaimed slots
    max_nodes: int
    instance_warmup_seconds: int
    queue_term: QueueTerm = QueueTerm.COUNT  # several groups: WAKE for the first scaling group, else NONE


class BacklogScaling(pulumi.ComponentResource):
    policy: aws.autoscaling.Policy
    alarm: aws.cloudwatch.MetricAlarm

    def __init__(self, name: str, args: BacklogScalingArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("gpucloud:scaling:BacklogScaling", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        self.policy = aws.autoscaling.Policy(
            f"{name}-out",
            autoscaling_group_name=args.asg_name,
            policy_type="StepScaling",
            adjustment_type="ChangeInCapacity",
            metric_aggregation_type=metric.STATISTIC,
            estimated_instance_warmup=args.instance_warmup_seconds,
            # Only positive steps and no low alarm: this policy never scales in. Idle agents
            # terminate their own nodes; busy nodes are protected from scale-in.
            step_adjustments=[
                aws.autoscaling.PolicyStepAdjustmentArgs(
                    scaling_adjustment=step.add,
                    metric_interval_lower_bound=str(step.lower),
                    metric_interval_upper_bound=None if step.upper is None else str(step.upper),
                )
                for step in scale_out_steps(args.max_nodes)
            ],
            opts=child,
        )
        self.alarm = aws.cloudwatch.MetricAlarm(
            f"{name}-backlog",
            alarm_description=(
                f"gpucloud {args.tagging.cluster} {args.node_group}: gangs wait for nodes; "
                "adds busy + unclaimed - desired nodes"
            ),
            comparison_operator="GreaterThanThreshold",
            threshold=0,
            evaluation_periods=1,
            datapoints_to_alarm=1,
            metric_queries=shortfall_queries(
                args.tagging.cluster, args.node_group, args.asg_name, args.job_queue_name, args.queue_term
            ),
            # The shortfall has data whenever any input has (missing terms count as 0), and the
            # group's own GroupDesiredCapacity is published every minute: it is empty only when
            # AWS publishes nothing at all, which is no evidence of a backlog.
            treat_missing_data="notBreaching",
            alarm_actions=[self.policy.arn],
            tags=args.tagging.tags(f"{args.node_group}-backlog"),
            opts=child,
        )
        self.register_outputs({"policyArn": self.policy.arn, "alarmName": self.alarm.name})


@dataclasses.dataclass
class CapacityBlockWindDownArgs:
    asg_name: pulumi.Input[str]
    block_end: dt.datetime
    lead_minutes: int


class CapacityBlockWindDown(pulumi.ComponentResource):
    schedule: aws.autoscaling.Schedule
    scale_down_at: str  # ISO 8601 UTC

    def __init__(self, name: str, args: CapacityBlockWindDownArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("gpucloud:scaling:CapacityBlockWindDown", name, None, opts)
        self.scale_down_at = schedule_timestamp(wind_down_time(args.block_end, args.lead_minutes))
        self.schedule = aws.autoscaling.Schedule(
            f"{name}-end",
            autoscaling_group_name=args.asg_name,
            scheduled_action_name=f"gpucloud-capacity-block-end-{args.block_end.astimezone(dt.timezone.utc):%Y%m%dT%H%MZ}",
            start_time=self.scale_down_at,  # one-time: no recurrence
            min_size=0,
            max_size=0,
            desired_capacity=0,
            opts=pulumi.ResourceOptions(parent=self),
        )
        self.register_outputs({"scaleDownAt": self.scale_down_at})
