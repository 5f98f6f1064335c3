"""Only EventBridge may send to the events queue: no node (identity policy) and no other principal
(queue policy) may, or a node could forge the interruption of another."""

from __future__ import annotations

import json

import pytest
from policy_args import check_stack, resource

from gpucloud.policy.events_queue import iam_pattern_matches

POLICY = "events-queue-eventbridge-only"
EVENTS_ARN = "arn:aws:sqs:us-east-1:123456789012:c-events"
JOBS_ARN = "arn:aws:sqs:us-east-1:123456789012:c-jobs"
TARGET = resource("aws:cloudwatch/eventTarget:EventTarget", "t", {"arn": EVENTS_ARN, "rule": "r"})


def role_policy(*statements: dict, name: str = "node-access"):
    document = json.dumps({"Version": "2012-10-17", "Statement": list(statements)})
    return resource("aws:iam/rolePolicy:RolePolicy", name, {"role": "node", "policy": document})


def queue_policy(*statements: dict):
    document = json.dumps({"Version": "2012-10-17", "Statement": list(statements)})
    return resource("aws:sqs/queuePolicy:QueuePolicy", "qp", {"queueUrl": "https://q", "policy": document})


def messages(*resources) -> list[str]:
    return [m for m, _ in check_stack(POLICY, [TARGET, *resources])]


def test_the_old_node_policy_is_refused() -> None:
    """The statement the stack shipped before: send (and more) on both queues."""
    old = {
        "Sid": "JobQueues",
        "Effect": "Allow",
        "Action": ["sqs:ReceiveMessage", "sqs:DeleteMessage", "sqs:SendMessage", "sqs:GetQueueUrl"],
        "Resource": [JOBS_ARN, EVENTS_ARN],
    }
    assert messages(role_policy(old)) == [
        f"policy statement JobQueues allows sqs:SendMessage on the events queue {EVENTS_ARN}; only EventBridge "
        "may send to it (a sender could forge interruptions)"
    ]


@pytest.mark.parametrize(
    "statement",
    [
        {"Effect": "Allow", "Action": "sqs:*", "Resource": EVENTS_ARN},
        {"Effect": "Allow", "Action": "SQS:send*", "Resource": "arn:aws:sqs:us-east-1:123456789012:*"},
        {"Effect": "Allow", "Action": "*", "Resource": "*"},
        {"Action": "sqs:SendMessage", "Resource": "arn:aws:sqs:*:*:c-event?"},
        {"Effect": "Allow", "NotAction": "sqs:ReceiveMessage", "Resource": EVENTS_ARN},
        {"Effect": "Allow", "Action": "sqs:SendMessage", "NotResource": JOBS_ARN},
    ],
)
def test_any_grant_of_send_on_the_events_queue_is_refused(statement: dict) -> None:
    assert len(messages(role_policy(statement))) == 1


@pytest.mark.parametrize(
    "statement",
    [
        {"Effect": "Allow", "Action": "sqs:SendMessage", "Resource": JOBS_ARN},
        {"Effect": "Deny", "Action": "sqs:SendMessage", "Resource": EVENTS_ARN},
        {"Effect": "Allow", "Action": ["sqs:ReceiveMessage", "sqs:DeleteMessage"], "Resource": EVENTS_ARN},
        {"Effect": "Allow", "NotAction": "sqs:SendMessage", "Resource": EVENTS_ARN},
        {"Effect": "Allow", "Action": "sqs:SendMessage", "Resource": "arn:aws:sqs:us-east-1:123456789012:c-events-dlq"},
    ],
)
def test_reading_the_events_queue_and_sending_elsewhere_pass(statement: dict) -> None:
    assert messages(role_policy(statement)) == []


def test_a_role_inline_policy_is_checked_too() -> None:
    inline = {"name": "x", "policy": json.dumps({"Statement": [{"Action": "sqs:SendMessage", "Resource": EVENTS_ARN}]})}
    role = resource("aws:iam/role:Role", "node", {"inlinePolicies": [inline]})
    assert messages(role) == [
        f"inlinePolicies[x] statement #0 allows sqs:SendMessage on the events queue {EVENTS_ARN}; only "
        "EventBridge may send to it (a sender could forge interruptions)"
    ]


def test_queue_policy_may_let_only_eventbridge_send() -> None:
    eventbridge = {
        "Effect": "Allow",
        "Principal": {"Service": "events.amazonaws.com"},
        "Action": "sqs:SendMessage",
        "Resource": EVENTS_ARN,
    }
    anyone = {"Sid": "Open", "Effect": "Allow", "Principal": "*", "Action": "sqs:SendMessage", "Resource": EVENTS_ARN}
    assert messages(queue_policy(eventbridge)) == []
    assert messages(queue_policy(eventbridge, anyone)) == [
        f"queue policy statement Open lets a principal other than events.amazonaws.com send to the events "
        f"queue {EVENTS_ARN}"
    ]


def test_without_an_event_target_nothing_is_an_events_queue() -> None:
    statement = {"Action": "sqs:SendMessage", "Resource": EVENTS_ARN}
    assert check_stack(POLICY, [role_policy(statement)]) == []


def test_iam_wildcards() -> None:
    assert iam_pattern_matches("arn:aws:sqs:*:1:q?", "arn:aws:sqs:us-east-1:1:q1", case_sensitive=True)
    assert not iam_pattern_matches("arn:aws:sqs:*:1:q", "arn:aws:sqs:us-east-1:1:q1", case_sensitive=True)
    assert not iam_pattern_matches("arn:aws:sqs:*:1:[q]", "arn:aws:sqs:us-east-1:1:q", case_sensitive=True)
    assert iam_pattern_matches("SQS:Send*", "sqs:SendMessage", case_sensitive=False)
