"""``gpucloud:budget``: an AWS Budgets monthly cost budget over the stack's tagged resources, its
notifications, and (``onExceeded: stop-scale-out``) what lets the agents stop scale-out (docs/cost.md).

- The budget filters cost by the stack tag: ``TagKeyValue`` ``user:gpucloud:stack$<stack>`` (the
  ``user:`` prefix marks a user-defined cost allocation tag; the tag counts only once it is
  activated in Billing, see docs/cost.md). COST, MONTHLY, in USD; one notification per
  ``alertAtPercent`` (ACTUAL cost GREATER_THAN that % of the limit).
- Its own SNS topic ``<cluster>-budget``, not the monitoring alert topic: the self-hosted alert topic
  is encrypted with the AWS-managed ``aws/sns`` key, whose key policy cannot be changed to let the
  ``budgets.amazonaws.com`` principal encrypt, and the managed one's key and policy belong to the
  Prometheus alert manager. This topic has a customer managed key that Budgets may use, and a topic
  policy that lets Budgets publish for this account's budgets only (aws:SourceAccount, and
  aws:SourceArn as AWS's guide gives it:
  https://docs.aws.amazon.com/cost-management/latest/userguide/budgets-sns-policy.html). Its
  subscribers are ``budget.alertEmails`` and ``monitoring.alertEmails``.
- stop-scale-out (``agent/budget_gate.py`` says why the agents do it): the nodes may read this one
  budget (``budgets:ViewBudget``, what ``DescribeBudget`` needs, on the budget's ARN
  ``arn:<partition>:budgets::<account>:budget/<name>``) and suspend or resume their groups'
  ``AlarmNotification`` process (this stack's groups only, by tag). An EventBridge Scheduler
  schedule per scaling group resumes it at 00:05 UTC on the 1st of each month, when the monthly
  budget starts again at 0, so an empty cluster left suspended scales out again.
- stop-scale-out with no node running: no agent is there to read the budget, and the next submit
  would launch a node. So the topic also invokes a Lambda function (``budget_stop_lambda.py``, its
  whole code) that reads the budget and, over it, suspends ``AlarmNotification`` on every scaling
  group; a notification at 100 % is always sent to the topic for it. Its role may read this budget,
  suspend (not resume) these groups, and write its own log group.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping, Sequence
from typing import Any

import pulumi
import pulumi_aws as aws

from gpucloud.cluster.agent_contract import ACCOUNT_ID_ENV, ALARM_PROCESS, BUDGET_NAME_ENV
from gpucloud.cluster.tags import STACK_TAG, Tagging
from gpucloud.infra import budget_stop_lambda as stop_lambda
from gpucloud.infra.iam import GroupScope
from gpucloud.infra.monitoring_iam import publisher_key_policy_document
from gpucloud.spec.model import Budget

BUDGETS_PRINCIPAL = "budgets.amazonaws.com"
SCHEDULER_PRINCIPAL = "scheduler.amazonaws.com"
LAMBDA_PRINCIPAL = "lambda.amazonaws.com"
SNS_PRINCIPAL = "sns.amazonaws.com"
# at 00:05 UTC on the 1st: the monthly budget's new period (Budgets' periods are UTC calendar months)
MONTHLY_RESUME = "cron(5 0 1 * ? *)"
SWITCH_ACTIONS = ["autoscaling:SuspendProcesses", "autoscaling:ResumeProcesses"]


def budget_name(stack: str) -> str:
    return f"gpucloud-{stack}"


def budget_topic_name(cluster: str) -> str:
    return f"{cluster}-budget"


def stack_cost_filter(stack: str) -> aws.budgets.BudgetCostFilterArgs:
    """Cost of resources tagged ``gpucloud:stack=<stack>`` (format: ``user:<key>$<value>``, as in
    the pulumi-aws budgets example "Create a cost filter using resource tags")."""
    return aws.budgets.BudgetCostFilterArgs(name="TagKeyValue", values=[f"user:{STACK_TAG}${stack}"])


def notifications(percents: Sequence[float], topic_arn: pulumi.Input[str]) -> list[aws.budgets.BudgetNotificationArgs]:
    return [
        aws.budgets.BudgetNotificationArgs(
            notification_type="ACTUAL",
            comparison_operator="GREATER_THAN",
            threshold=float(percent),
            threshold_type="PERCENTAGE",
            subscriber_sns_topic_arns=[topic_arn],
        )
        for percent in percents
    ]


def thresholds(budget: Budget) -> list[float]:
    """The notifications' percentages: the alerts, and with stop-scale-out always 100 (the Lambda
    function that stops an empty cluster's scale-out is invoked by one)."""
    percents = list(budget.alert_at_percent)
    if budget.on_exceeded == "stop-scale-out" and 100 not in percents:
        percents.append(100.0)
    return percents


def stop_function_name(cluster: str) -> str:
    return f"{cluster}-budget-stop"


def lambda_trust_document(account: str) -> dict[str, Any]:
    return {
        "Version": "2012-10-17",
        "Statement": [
            {
                "Effect": "Allow",
                "Principal": {"Service": LAMBDA_PRINCIPAL},
                "Action": "sts:AssumeRole",
                "Condition": {"StringEquals": {"aws:SourceAccount": account}},
            }
        ],
    }


def stop_policy_document(the_budget_arn: str, group_arns: Sequence[str], log_group_arn: str) -> dict[str, Any]:
    """What the stop function calls, and nothing else."""
    return {
        "Version": "2012-10-17",
        "Statement": [
            {"Sid": "ReadBudget", "Effect": "Allow", "Action": ["budgets:ViewBudget"], "Resource": [the_budget_arn]},
            {
                "Sid": "StopScaleOut",
                "Effect": "Allow",
                "Action": ["autoscaling:SuspendProcesses"],
                "Resource": list(group_arns),
            },
            {
                "Sid": "OwnLog",
                "Effect": "Allow",
                "Action": ["logs:CreateLogStream", "logs:PutLogEvents"],
                "Resource": [f"{log_group_arn}:*"],
            },
        ],
    }


def stop_function_code() -> str:
    """``budget_stop_lambda.py`` as it ships in this package: the function's ``index.py``."""
    from importlib import resources

    return resources.files("gpucloud.infra").joinpath("budget_stop_lambda.py").read_text(encoding="utf-8")


def budget_arn(partition: str, account: str, name: str) -> str:
    return f"arn:{partition}:budgets::{account}:budget/{name}"


def budget_topic_policy_document(topic_arn: str, partition: str, account: str) -> dict[str, Any]:
    return {
        "Version": "2012-10-17",
        "Statement": [
            {
                "Sid": "BudgetsPublish",
                "Effect": "Allow",
                "Principal": {"Service": BUDGETS_PRINCIPAL},
                "Action": "SNS:Publish",
                "Resource": topic_arn,
                "Condition": {
                    "StringEquals": {"aws:SourceAccount": account},
                    "ArnLike": {"aws:SourceArn": f"arn:{partition}:budgets::{account}:*"},
                },
            }
        ],
    }


def budget_node_policy_document(the_budget_arn: str, groups: GroupScope) -> dict[str, Any]:
    """stop-scale-out: what the agents' budget gate calls, and nothing else."""
    return {
        "Version": "2012-10-17",
        "Statement": [
            {"Sid": "ReadBudget", "Effect": "Allow", "Action": ["budgets:ViewBudget"], "Resource": [the_budget_arn]},
            {
                "Sid": "SwitchGroupScaleOut",
                "Effect": "Allow",
                "Action": list(SWITCH_ACTIONS),
                "Resource": [groups.group_arn_pattern],
                "Condition": groups.condition(),
            },
        ],
    }


def scheduler_trust_document(account: str) -> dict[str, Any]:
    return {
        "Version": "2012-10-17",
        "Statement": [
            {
                "Effect": "Allow",
                "Principal": {"Service": SCHEDULER_PRINCIPAL},
                "Action": "sts:AssumeRole",
                "Condition": {"StringEquals": {"aws:SourceAccount": account}},
            }
        ],
    }


def resume_policy_document(group_arns: Sequence[str]) -> dict[str, Any]:
    return {
        "Version": "2012-10-17",
        "Statement": [
            {
                "Sid": "ResumeScaleOut",
                "Effect": "Allow",
                "Action": ["autoscaling:ResumeProcesses"],
                "Resource": list(group_arns),
            }
        ],
    }


def budget_node_settings(stack: str, account: pulumi.Input[str], budget: Budget | None) -> dict[str, pulumi.Input[str]]:
    """What the agents read (``agent/budget_gate.gate_from_env``): only with stop-scale-out."""
    if budget is None or budget.on_exceeded != "stop-scale-out":
        return {}
    return {BUDGET_NAME_ENV: budget_name(stack), ACCOUNT_ID_ENV: account}


def budget_summary(budget: Budget | None) -> str | None:
    """One line for ``gpucloud plan``."""
    if budget is None:
        return None
    alerts = ", ".join(f"{p:g}%" for p in budget.alert_at_percent) or "none"
    return f"{budget.monthly_usd:,.2f} USD/month; alerts at {alerts}; at 100%: {budget.on_exceeded}"


def budget_json(budget: Budget | None) -> dict[str, Any] | None:
    """``gpucloud plan -o json``'s ``budget``."""
    if budget is None:
        return None
    return {
        "monthly_usd": budget.monthly_usd,
        "alert_at_percent": list(budget.alert_at_percent),
        "on_exceeded": budget.on_exceeded,
        "summary": budget_summary(budget),
    }


class BudgetNodeAccess(pulumi.ComponentResource):
    """stop-scale-out: the node role's budget policy. Created before the groups (it names the groups
    by tag, not ARN), so the first agent can already read the budget."""

    policy: aws.iam.RolePolicy

    def __init__(
        self,
        name: str,
        *,
        role_name: pulumi.Input[str],
        region: str,
        stack: str,
        cluster: str,
        partition: pulumi.Input[str],
        account: pulumi.Input[str],
        opts: pulumi.ResourceOptions | None = None,
    ):
        super().__init__("gpucloud:budget:BudgetNodeAccess", name, None, opts)

        def render(v: list[str]) -> str:
            part, acct = v
            scope = GroupScope(
                f"arn:{part}:autoscaling:{region}:{acct}:autoScalingGroup:*:autoScalingGroupName/*",
                stack=stack,
                cluster=cluster,
            )
            return json.dumps(budget_node_policy_document(budget_arn(part, acct, budget_name(stack)), scope))

        self.policy = aws.iam.RolePolicy(
            f"{name}-budget",
            role=role_name,
            policy=pulumi.Output.all(partition, account).apply(render),
            opts=pulumi.ResourceOptions(parent=self),
        )
        self.register_outputs({})


@dataclasses.dataclass
class ClusterBudgetArgs:
    tagging: Tagging
    settings: Budget
    alert_emails: Sequence[str]  # budget.alertEmails, then monitoring.alertEmails (each once)
    partition: pulumi.Input[str]
    account: pulumi.Input[str]
    # stop-scale-out: the groups whose AlarmNotification the schedule resumes, {group: (name, arn)}
    scaling_groups: Mapping[str, tuple[pulumi.Input[str], pulumi.Input[str]]] = dataclasses.field(default_factory=dict)


class ClusterBudget(pulumi.ComponentResource):
    budget: aws.budgets.Budget
    topic: aws.sns.Topic
    topic_policy: aws.sns.TopicPolicy
    key: aws.kms.Key
    schedules: dict[str, aws.scheduler.Schedule]
    stop_function: aws.lambda_.Function | None

    def __init__(self, name: str, args: ClusterBudgetArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("gpucloud:budget:ClusterBudget", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        t, settings = args.tagging, args.settings
        ids = pulumi.Output.all(args.partition, args.account)

        self.key = aws.kms.Key(
            f"{name}-topic-key",
            description=f"gpucloud {t.cluster} budget topic",
            enable_key_rotation=True,
            policy=ids.apply(lambda v: json.dumps(publisher_key_policy_document(v[0], v[1], BUDGETS_PRINCIPAL))),
            tags=t.tags("budget-key"),
            opts=child,
        )
        self.topic = aws.sns.Topic(
            f"{name}-topic",
            name=budget_topic_name(t.cluster),
            kms_master_key_id=self.key.arn,
            tags=t.tags("budget"),
            opts=child,
        )
        self.topic_policy = aws.sns.TopicPolicy(
            f"{name}-topic-policy",
            arn=self.topic.arn,
            policy=pulumi.Output.all(self.topic.arn, args.partition, args.account).apply(
                lambda v: json.dumps(budget_topic_policy_document(v[0], v[1], v[2]))
            ),
            opts=child,
        )
        for i, email in enumerate(dict.fromkeys(e.lower() for e in args.alert_emails)):
            aws.sns.TopicSubscription(
                f"{name}-email-{i}", topic=self.topic.arn, protocol="email", endpoint=email, opts=child
            )
        self.budget = aws.budgets.Budget(
            f"{name}-budget",
            name=budget_name(t.stack),
            budget_type="COST",
            time_unit="MONTHLY",
            limit_amount=f"{settings.monthly_usd:.2f}",
            limit_unit="USD",
            cost_filters=[stack_cost_filter(t.stack)],
            notifications=notifications(thresholds(settings), self.topic.arn),
            tags=t.tags("budget"),
            # a notification to a topic Budgets may not yet publish to is refused at creation
            opts=pulumi.ResourceOptions(parent=self, depends_on=[self.topic_policy]),
        )
        stop = settings.on_exceeded == "stop-scale-out" and bool(args.scaling_groups)
        self.schedules = self._monthly_resume(name, args) if stop else {}
        self.stop_function = self._stop_when_empty(name, args) if stop else None
        self.register_outputs({"budgetName": self.budget.name, "topicArn": self.topic.arn})

    def _stop_when_empty(self, name: str, args: ClusterBudgetArgs) -> aws.lambda_.Function:
        """The topic's Lambda subscriber that suspends every group's scale-out over budget (see the
        module's docstring). Lambda invoked by SNS: the function's resource policy names the topic
        (https://docs.aws.amazon.com/sns/latest/dg/sns-lambda-as-subscriber.html)."""
        child = pulumi.ResourceOptions(parent=self)
        t = args.tagging
        function_name = stop_function_name(t.cluster)
        logs = aws.cloudwatch.LogGroup(
            f"{name}-stop-logs",
            name=f"/aws/lambda/{function_name}",  # where Lambda writes the function's log
            retention_in_days=30,
            tags=t.tags("budget-stop"),
            opts=child,
        )
        role = aws.iam.Role(
            f"{name}-stop",
            assume_role_policy=pulumi.Output.from_input(args.account).apply(
                lambda acct: json.dumps(lambda_trust_document(acct))
            ),
            tags=t.tags("budget-stop"),
            opts=child,
        )
        arns = [arn for _, arn in args.scaling_groups.values()]
        policy = aws.iam.RolePolicy(
            f"{name}-stop",
            role=role.name,
            policy=pulumi.Output.all(args.partition, args.account, logs.arn, *arns).apply(
                lambda v: json.dumps(stop_policy_document(budget_arn(v[0], v[1], budget_name(t.stack)), v[3:], v[2]))
            ),
            opts=child,
        )
        names = pulumi.Output.all(*[n for n, _ in args.scaling_groups.values()]).apply(lambda v: ",".join(v))
        function = aws.lambda_.Function(
            f"{name}-stop",
            name=function_name,
            description=f"gpucloud {t.cluster}: over budget, suspend every group's scale-out (stop-scale-out)",
            runtime="python3.12",
            handler="index.handler",
            code=pulumi.AssetArchive({"index.py": pulumi.StringAsset(stop_function_code())}),
            role=role.arn,
            timeout=60,
            environment=aws.lambda_.FunctionEnvironmentArgs(
                variables={
                    stop_lambda.BUDGET_NAME: budget_name(t.stack),
                    stop_lambda.ACCOUNT_ID: args.account,
                    stop_lambda.GROUP_NAMES: names,
                }
            ),
            tags=t.tags("budget-stop"),
            # its log group and permissions first: the first invocation must be able to log and act
            opts=pulumi.ResourceOptions(parent=self, depends_on=[logs, policy]),
        )
        permission = aws.lambda_.Permission(
            f"{name}-stop",
            action="lambda:InvokeFunction",
            function=function.name,
            principal=SNS_PRINCIPAL,
            source_arn=self.topic.arn,
            opts=child,
        )
        aws.sns.TopicSubscription(
            f"{name}-stop",
            topic=self.topic.arn,
            protocol="lambda",
            endpoint=function.arn,
            opts=pulumi.ResourceOptions(parent=self, depends_on=[permission]),
        )
        return function

    def _monthly_resume(self, name: str, args: ClusterBudgetArgs) -> dict[str, aws.scheduler.Schedule]:
        if not args.scaling_groups:
            return {}
        child = pulumi.ResourceOptions(parent=self)
        t = args.tagging
        role = aws.iam.Role(
            f"{name}-resume",
            assume_role_policy=pulumi.Output.from_input(args.account).apply(
                lambda acct: json.dumps(scheduler_trust_document(acct))
            ),
            tags=t.tags("budget-resume"),
            opts=child,
        )
        arns = [arn for _, arn in args.scaling_groups.values()]
        aws.iam.RolePolicy(
            f"{name}-resume",
            role=role.name,
            policy=pulumi.Output.all(*arns).apply(lambda v: json.dumps(resume_policy_document(v))),
            opts=child,
        )
        target = pulumi.Output.concat("arn:", args.partition, ":scheduler:::aws-sdk:autoscaling:resumeProcesses")
        schedules: dict[str, aws.scheduler.Schedule] = {}
        for group, (asg_name, _) in args.scaling_groups.items():
            schedules[group] = aws.scheduler.Schedule(
                f"{name}-resume-{group}",
                description=f"gpucloud {t.cluster}: resume {group}'s scale-out when the monthly budget restarts",
                schedule_expression=MONTHLY_RESUME,
                schedule_expression_timezone="UTC",
                flexible_time_window=aws.scheduler.ScheduleFlexibleTimeWindowArgs(mode="OFF"),
                target=aws.scheduler.ScheduleTargetArgs(
                    arn=target,
                    role_arn=role.arn,
                    input=pulumi.Output.from_input(asg_name).apply(
                        lambda n: json.dumps({"AutoScalingGroupName": n, "ScalingProcesses": [ALARM_PROCESS]})
                    ),
                ),
                opts=child,
            )
        return schedules
