"""The Lambda function behind ``onExceeded: stop-scale-out`` when no node runs (``infra/budget.py``).

The agents stop scale-out at 100 % (``agent/budget_gate.py``), but only an agent that runs can: a
budget that crosses 100 % while the cluster is empty would let the next submit launch a node. So the
budget topic also invokes this function. It reads the budget itself (``DescribeBudget``: the actual
spend against the limit, as the agents do) rather than parsing the notification's text, and over
the limit suspends ``AlarmNotification`` on every scaling group of the stack; the groups' monthly
schedules and the agents resume them (``infra/budget.py``).

This file is the function's whole code (``index.py`` in its archive): it imports only the Python
standard library and boto3, which the Lambda Python runtime provides
(https://docs.aws.amazon.com/lambda/latest/dg/lambda-python.html).
"""

from __future__ import annotations

import os
from decimal import Decimal
from typing import Any

BUDGET_NAME = "GPUCLOUD_BUDGET_NAME"
ACCOUNT_ID = "GPUCLOUD_ACCOUNT_ID"
GROUP_NAMES = "GPUCLOUD_SCALING_GROUPS"  # comma-separated Auto Scaling group names
ALARM_PROCESS = "AlarmNotification"


def exceeded(budgets: Any, account: str, name: str) -> bool:
    """At 100 %: the month's actual cost reached the limit (as ``budget_gate.Spend.exceeded``)."""
    budget = budgets.describe_budget(AccountId=account, BudgetName=name)["Budget"]
    actual = Decimal(budget["CalculatedSpend"]["ActualSpend"]["Amount"])
    return actual >= Decimal(budget["BudgetLimit"]["Amount"])


def handler(event: Any, context: Any, *, budgets: Any = None, autoscaling: Any = None) -> dict[str, Any]:
    """Invoked by SNS with a budget notification; what it did (the clients are injected in tests)."""
    import boto3

    env = os.environ
    budgets = budgets or boto3.client("budgets")
    if not exceeded(budgets, env[ACCOUNT_ID], env[BUDGET_NAME]):
        return {"exceeded": False, "suspended": []}
    autoscaling = autoscaling or boto3.client("autoscaling")
    groups = [g for g in env.get(GROUP_NAMES, "").split(",") if g]
    for group in groups:
        autoscaling.suspend_processes(AutoScalingGroupName=group, ScalingProcesses=[ALARM_PROCESS])
    print(f"budget {env[BUDGET_NAME]} exceeded: {ALARM_PROCESS} suspended on {', '.join(groups) or 'no group'}")
    return {"exceeded": True, "suspended": groups}
