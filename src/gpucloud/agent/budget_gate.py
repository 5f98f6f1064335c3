"""``gpucloud:budget.onExceeded: stop-scale-out``: at 100% of the month's budget, no scale-out for new work.

Why the agents, and not a Budgets action. Budgets actions can apply an IAM policy or SCP, or stop
EC2/RDS instances (https://docs.aws.amazon.com/cost-management/latest/userguide/budgets-controls.html):
stopping instances kills running jobs, and a deny policy cannot be attached to the Auto Scaling
service-linked role that launches the nodes. The agents already drive scale-out (they publish the
backlog the alarm reads, ``backlog_metric.py``), so they are where it stops:

- every agent reads the budget (``DescribeBudget``: ``CalculatedSpend.ActualSpend`` against
  ``BudgetLimit``), at most once per ``CHECK_SECONDS`` (Budgets refreshes its figures only a few
  times a day, https://docs.aws.amazon.com/cost-management/latest/userguide/budgets-managing-costs.html);
- over budget, it publishes every group's ``UnclaimedSlots`` as 0 (``held``): the alarm's agent
  term sees no new work. ``BusyNodes`` is published as it is, and nothing is terminated or
  unprotected: running jobs finish, and idle nodes still take queued jobs (already paid for);
- every agent also reads the gate at its group check (``AsgHooks.group_ending``, every minute,
  running or idle), and publishes no fallback forecast while over budget;
- the alarm of a one-group cluster also counts the job queue's own visible messages
  (``cluster/scaling_plan.py``), which no agent can zero; so the agent also suspends its group's
  ``AlarmNotification`` process (the alarm's scaling policies no longer run; launches that replace
  an interrupted node, the agents' own scale-in and scheduled actions go on:
  https://docs.aws.amazon.com/autoscaling/ec2/userguide/as-suspend-resume-processes.html) and
  resumes it once the budget is back under its limit. The suspension outlives the nodes, so an empty
  cluster stays stopped; the stack resumes every group on the 1st of each month (``infra/budget.py``).

A failed read must not stop scale-out for the rest of the month: the gate fails open (not
exceeded), logs the failure once until a read succeeds again, and retries after ``CHECK_SECONDS``.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import time
from collections.abc import Callable
from decimal import Decimal, InvalidOperation
from typing import Any

from gpucloud.agent.backlog_metric import GroupBacklog
from gpucloud.cluster.agent_contract import ACCOUNT_ID_ENV, ALARM_PROCESS, BUDGET_NAME_ENV

log = logging.getLogger("gpucloud.agent")

CHECK_SECONDS = 600.0


@dataclasses.dataclass(frozen=True)
class Spend:
    actual_usd: Decimal
    limit_usd: Decimal

    @property
    def exceeded(self) -> bool:
        """At 100%: the month's actual cost reached the limit (a limit of 0 is always reached)."""
        return self.actual_usd >= self.limit_usd

    def describe(self) -> str:
        return f"{self.actual_usd:.2f} of {self.limit_usd:.2f} USD this month"


def spend_of(response: dict[str, Any]) -> Spend:
    """The month's actual spend and limit from a ``DescribeBudget`` response (amounts are strings)."""
    budget = response["Budget"]
    try:
        actual = Decimal(budget["CalculatedSpend"]["ActualSpend"]["Amount"])
        limit = Decimal(budget["BudgetLimit"]["Amount"])
    except (KeyError, InvalidOperation) as err:
        raise ValueError(f"DescribeBudget gave no actual spend and limit ({err!r})") from None
    return Spend(actual_usd=actual, limit_usd=limit)


def held(backlogs: list[GroupBacklog], exceeded: bool) -> list[GroupBacklog]:
    """What to publish: over budget, no group has new work to scale out for; busy nodes stay counted."""
    if not exceeded:
        return backlogs
    return [dataclasses.replace(b, unclaimed_slots=0) for b in backlogs]


class BudgetGate:
    """Whether the stack's budget is exceeded, read from AWS Budgets at most every ``CHECK_SECONDS``."""

    def __init__(
        self,
        budgets: Any,
        *,
        account_id: str,
        budget_name: str,
        clock: Callable[[], float] = time.monotonic,
        check_seconds: float = CHECK_SECONDS,
    ) -> None:
        self._budgets = budgets
        self.account_id, self.budget_name = account_id, budget_name
        self._clock, self._check_seconds = clock, check_seconds
        self._next_check: float | None = None
        self._exceeded = False
        self._failing = False  # the last read failed and was logged: do not log it again

    def exceeded(self) -> bool:
        now = self._clock()
        if self._next_check is not None and now < self._next_check:
            return self._exceeded
        self._next_check = now + self._check_seconds
        try:
            spend = spend_of(self._budgets.describe_budget(AccountId=self.account_id, BudgetName=self.budget_name))
        except Exception as err:  # noqa: BLE001 - any failure: fail open, scale-out goes on
            if not self._failing:
                log.warning(
                    "cannot read budget %s (%s); scale-out is not stopped until a read succeeds",
                    self.budget_name,
                    err,
                )
            self._failing, self._exceeded = True, False
            return False
        if self._failing:
            log.info("budget %s read again: %s", self.budget_name, spend.describe())
        if spend.exceeded and not self._exceeded:
            log.warning("budget %s exceeded (%s): scale-out for new work stops", self.budget_name, spend.describe())
        self._failing, self._exceeded = False, spend.exceeded
        return spend.exceeded


class AlarmSwitch:
    """Suspends or resumes ``AlarmNotification`` when the budget state changes (and once at the first
    reading, since another agent may have left it suspended), on this agent's group and, with the
    cluster known, on every group of the cluster: a group at 0 nodes has no agent of its own, and on a
    cluster whose nodes are all busy the queue's wake term would otherwise launch a node into it."""

    def __init__(self, autoscaling: Any, asg_name: str, cluster: str | None = None) -> None:
        self._client, self.asg_name, self.cluster = autoscaling, asg_name, cluster
        self._applied: bool | None = None  # the exceeded state last applied to the groups
        self._failing = False

    def groups(self) -> list[str]:
        """This agent's group first, then the cluster's others (by the ``gpucloud:cluster`` tag the
        stack puts on every group; DescribeAutoScalingGroups filters by tag:
        https://docs.aws.amazon.com/autoscaling/ec2/APIReference/API_DescribeAutoScalingGroups.html)."""
        if self.cluster is None:
            return [self.asg_name]
        from gpucloud.cluster.tags import CLUSTER_TAG  # the tag key the stack writes (a pure module)

        pages = self._client.get_paginator("describe_auto_scaling_groups").paginate(
            Filters=[{"Name": f"tag:{CLUSTER_TAG}", "Values": [self.cluster]}]
        )
        others = {g["AutoScalingGroupName"] for page in pages for g in page["AutoScalingGroups"]} - {self.asg_name}
        return [self.asg_name, *sorted(others)]

    def apply(self, exceeded: bool) -> None:
        """Never raises: it runs beside the wind-down check, which must not be lost to it. A failed
        call is logged once and retried at the next reading (every group again: the calls are idempotent)."""
        if self._applied == exceeded:
            return
        call = self._client.suspend_processes if exceeded else self._client.resume_processes
        group = self.asg_name
        try:
            for group in self.groups():
                call(AutoScalingGroupName=group, ScalingProcesses=[ALARM_PROCESS])
        except Exception as err:  # noqa: BLE001 - the published backlog still says 0; retried next time
            if not self._failing:
                log.warning("cannot %s %s of %s: %s", "suspend" if exceeded else "resume", ALARM_PROCESS, group, err)
            self._failing = True
            return
        self._applied, self._failing = exceeded, False


def gate_from_env(session: Any, env: dict[str, str] | None = None) -> BudgetGate | None:
    """The gate when the stack asks for stop-scale-out (both settings present), else None."""
    env = dict(os.environ if env is None else env)
    name, account = env.get(BUDGET_NAME_ENV), env.get(ACCOUNT_ID_ENV)
    if not (name and account):
        return None
    # Budgets is a global service with one endpoint (us-east-1 in the aws partition)
    return BudgetGate(session.client("budgets", region_name="us-east-1"), account_id=account, budget_name=name)
