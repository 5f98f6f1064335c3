"""``gpucloud:drill: true``: an AWS FIS experiment template that interrupts one spot node, for
``gpucloud drill`` (docs/drill.md, "The experiment template").

- The action ``aws:ec2:send-spot-instance-interruptions`` sends the instance the real spot
  interruption notice (IMDS ``spot/instance-action`` and the EventBridge warning the job plane
  already routes), then interrupts it ``durationBeforeInterruption`` later (2 to 15 minutes, ISO
  8601; PT2M is what a real reclaim gives):
  https://docs.aws.amazon.com/fis/latest/userguide/fis-actions-reference.html#send-spot-instance-interruptions
- Its one target (resource type ``aws:ec2:spot-instance``, the only type the action takes) selects
  by tag: the cluster tag *and* ``drill.contract.TARGET_TAG``, which ``gpucloud drill`` puts on the
  one node it wants interrupted; ``State.Name = running``, ``COUNT(1)``. Target syntax, filters and
  selection modes: https://docs.aws.amazon.com/fis/latest/userguide/targets.html
  ``emptyTargetResolutionMode: fail``: with no tagged instance the experiment fails instead of
  "completing" without interrupting anything, which would let a drill pass vacuously.
- The stop condition is a CloudWatch alarm (``aws:cloudwatch:alarm`` with the alarm ARN,
  https://docs.aws.amazon.com/fis/latest/userguide/stop-conditions.html); ``stop_alarm_args`` says
  why it watches the job dead-letter queue.
- The role FIS assumes: trusted by ``fis.amazonaws.com`` for this account's experiments in this
  region only (``aws:SourceAccount``/``aws:SourceArn``, the confused-deputy guard FIS documents:
  https://docs.aws.amazon.com/fis/latest/userguide/getting-started-iam-service-role.html). It may
  send interruptions only to instances tagged with this cluster *and* the drill target tag, and
  describe instances (how FIS resolves a tag target; Describe* takes no resource ARN). These are the
  two EC2 permissions the actions reference lists for the action, as in AWS's managed
  AWSFaultInjectionSimulatorEC2Access, narrowed by tag.
- No experiment logging: ``gpucloud drill`` follows the experiment with GetExperiment and writes its
  own verdict; FIS logs to CloudWatch Logs need ``logs:CreateLogDelivery`` and resource-policy
  rights on ``*`` for the role, more than a 2-minute drill is worth.

Idle, the template and role cost nothing; the alarm is one standard CloudWatch alarm. FIS bills per
action-minute while an experiment runs (https://aws.amazon.com/fis/pricing/), not by the hour.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import pulumi
import pulumi_aws as aws

from gpucloud.cluster.drill_contract import LEAD_PARAMETER, SPOT_ACTION_ID, TARGET_TAG, TARGET_VALUE
from gpucloud.cluster.tags import CLUSTER_TAG, Tagging

ACTION_NAME = "interrupt-one-spot-node"
ACTION_TARGET_KEY = "SpotInstances"  # the action's name for its target (actions reference)
TARGET_NAME = "drill-target"
TARGET_RESOURCE_TYPE = "aws:ec2:spot-instance"
SELECTION_MODE = "COUNT(1)"
RUNNING = ("State.Name", ("running",))  # a stopped or terminating instance cannot be interrupted
# durationBeforeInterruption: the lead of a real spot reclaim; AWS allows PT2M..PT15M
NOTICE_LEAD = "PT2M"
FIS_PRINCIPAL = "fis.amazonaws.com"
STOP_CONDITION_SOURCE = "aws:cloudwatch:alarm"
EMPTY_TARGET_MODE = "fail"


def stop_alarm_name(cluster: str) -> str:
    return f"{cluster}-drill-stop"


def target_tags(cluster: str) -> dict[str, str]:
    """What an instance must carry to be the drill's target (and what the role may interrupt)."""
    return {CLUSTER_TAG: cluster, TARGET_TAG: TARGET_VALUE}


def fis_trust_document(partition: str, region: str, account: str) -> dict[str, Any]:
    return {
        "Version": "2012-10-17",
        "Statement": [
            {
                "Effect": "Allow",
                "Principal": {"Service": FIS_PRINCIPAL},
                "Action": "sts:AssumeRole",
                "Condition": {
                    "StringEquals": {"aws:SourceAccount": account},
                    "ArnLike": {"aws:SourceArn": f"arn:{partition}:fis:{region}:{account}:experiment/*"},
                },
            }
        ],
    }


def fis_role_policy_document(partition: str, region: str, account: str, cluster: str) -> dict[str, Any]:
    """Interrupt only this cluster's drill target; describe instances to resolve the target."""
    return {
        "Version": "2012-10-17",
        "Statement": [
            {
                "Sid": "InterruptDrillTarget",
                "Effect": "Allow",
                "Action": ["ec2:SendSpotInstanceInterruptions"],
                "Resource": [f"arn:{partition}:ec2:{region}:{account}:instance/*"],
                "Condition": {"StringEquals": {f"aws:ResourceTag/{k}": v for k, v in target_tags(cluster).items()}},
            },
            {"Sid": "ResolveTargets", "Effect": "Allow", "Action": ["ec2:DescribeInstances"], "Resource": ["*"]},
        ],
    }


def stop_alarm_args(cluster: str, dead_letter_queue_name: pulumi.Input[str]) -> dict[str, Any]:
    """The stop condition: any slot message on the job dead-letter queue.

    A slot lands there after ``jobPlane.maxReceiveCount`` receives without completing: a job that
    keeps failing on restart. The drill's promise is the opposite (one requeue, resume at the
    committed step), so a dead-lettered job while it runs means the interruption hurt more than one
    step, and FIS stops the experiment. A queue already holding dead letters is no steady state to
    drill from either: the alarm is then in ALARM and ``gpucloud drill`` should refuse to start
    (inspect the poisoned jobs first). SQS publishes the metric each minute while the queue is
    active; an empty, untouched DLQ goes quiet, hence ``notBreaching``:
    https://docs.aws.amazon.com/AWSSimpleQueueService/latest/SQSDeveloperGuide/sqs-available-cloudwatch-metrics.html
    """
    return {
        "name": stop_alarm_name(cluster),
        "alarm_description": (
            f"gpucloud {cluster}: a job slot reached the dead-letter queue; stops a running FIS drill (docs/drill.md)"
        ),
        "namespace": "AWS/SQS",
        "metric_name": "ApproximateNumberOfMessagesVisible",
        "dimensions": {"QueueName": dead_letter_queue_name},
        "statistic": "Maximum",
        "period": 60,
        "evaluation_periods": 1,
        "threshold": 0,
        "comparison_operator": "GreaterThanThreshold",
        "treat_missing_data": "notBreaching",
    }


@dataclasses.dataclass
class SpotDrillArgs:
    tagging: Tagging
    region: str
    partition: pulumi.Input[str]
    account: pulumi.Input[str]
    dead_letter_queue_name: pulumi.Input[str]  # the job plane's dead-letter queue (the stop condition)


class SpotDrill(pulumi.ComponentResource):
    role: aws.iam.Role
    role_policy: aws.iam.RolePolicy
    stop_alarm: aws.cloudwatch.MetricAlarm
    template: aws.fis.ExperimentTemplate

    def __init__(self, name: str, args: SpotDrillArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("gpucloud:drill:SpotDrill", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        t, region = args.tagging, args.region
        ids = pulumi.Output.all(args.partition, args.account)

        self.role = aws.iam.Role(
            f"{name}-fis",
            description=f"gpucloud {t.cluster}: AWS FIS interrupts the drill's target spot node",
            assume_role_policy=ids.apply(lambda v: json.dumps(fis_trust_document(v[0], region, v[1]))),
            tags=t.tags("drill-fis"),
            opts=child,
        )
        self.role_policy = aws.iam.RolePolicy(
            f"{name}-fis",
            role=self.role.name,
            policy=ids.apply(lambda v: json.dumps(fis_role_policy_document(v[0], region, v[1], t.cluster))),
            opts=child,
        )
        self.stop_alarm = aws.cloudwatch.MetricAlarm(
            f"{name}-stop",
            **stop_alarm_args(t.cluster, args.dead_letter_queue_name),
            tags=t.tags("drill-stop"),
            opts=child,
        )
        path, values = RUNNING
        self.template = aws.fis.ExperimentTemplate(
            f"{name}-template",
            description=f"gpucloud {t.cluster}: interrupt the one spot node gpucloud drill tagged {TARGET_TAG}",
            role_arn=self.role.arn,
            actions=[
                aws.fis.ExperimentTemplateActionArgs(
                    name=ACTION_NAME,
                    action_id=SPOT_ACTION_ID,
                    description="the 2-minute spot interruption notice, then the interruption",
                    parameters=[aws.fis.ExperimentTemplateActionParameterArgs(key=LEAD_PARAMETER, value=NOTICE_LEAD)],
                    target=aws.fis.ExperimentTemplateActionTargetArgs(key=ACTION_TARGET_KEY, value=TARGET_NAME),
                )
            ],
            targets=[
                aws.fis.ExperimentTemplateTargetArgs(
                    name=TARGET_NAME,
                    resource_type=TARGET_RESOURCE_TYPE,
                    selection_mode=SELECTION_MODE,
                    resource_tags=[
                        aws.fis.ExperimentTemplateTargetResourceTagArgs(key=k, value=v)
                        for k, v in target_tags(t.cluster).items()
                    ],
                    filters=[aws.fis.ExperimentTemplateTargetFilterArgs(path=path, values=list(values))],
                )
            ],
            stop_conditions=[
                aws.fis.ExperimentTemplateStopConditionArgs(source=STOP_CONDITION_SOURCE, value=self.stop_alarm.arn)
            ],
            experiment_options=aws.fis.ExperimentTemplateExperimentOptionsArgs(
                account_targeting="single-account", empty_target_resolution_mode=EMPTY_TARGET_MODE
            ),
            tags=t.tags("drill"),
            # the role's permissions exist before anyone can start the template
            opts=pulumi.ResourceOptions(parent=self, depends_on=[self.role_policy]),
        )
        self.register_outputs(self.output())

    def output(self) -> dict[str, pulumi.Output[str]]:
        """The ``drill`` stack output (``drill.contract.STACK_OUTPUT``) that ``gpucloud drill`` reads."""
        return {
            "experimentTemplateId": self.template.id,
            "roleArn": self.role.arn,
            "stopAlarmName": self.stop_alarm.name,
        }
