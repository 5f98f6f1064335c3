"""Only EventBridge may send to a queue that EventBridge rules deliver to.

The events queue carries the interruption events (spot warnings, rebalance recommendations,
lifecycle terminations) every agent acts on. A node that could ``sqs:SendMessage`` to it could
forge the termination of any other node. So no identity policy in the stack (inline role
policies, role policies, managed policies) may allow ``sqs:SendMessage`` on such a queue, and a
queue policy may allow it only to the ``events.amazonaws.com`` service principal
(https://docs.aws.amazon.com/eventbridge/latest/userguide/eb-use-resource-based.html#eb-sqs-permissions).

A queue counts as an events queue when an ``EventTarget`` names its ARN. IAM wildcards (``*``,
``?``) in actions and resources are matched as IAM matches them
(https://docs.aws.amazon.com/IAM/latest/UserGuide/reference_policies_elements_resource.html).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

from pulumi_policy import PolicyResource, ReportViolation, StackValidationArgs

from gpucloud.policy import resource_types as rt
from gpucloud.policy.props import as_mappings, parse_json_document, statements, string_set

SEND_ACTION = "sqs:SendMessage"
EVENTBRIDGE_PRINCIPAL = "events.amazonaws.com"


def iam_pattern_matches(pattern: str, value: str, *, case_sensitive: bool) -> bool:
    """IAM's wildcard match: ``*`` any run of characters, ``?`` any one character."""
    regex = "".join(".*" if c == "*" else "." if c == "?" else re.escape(c) for c in pattern)
    return re.fullmatch(regex, value, 0 if case_sensitive else re.IGNORECASE) is not None


def _covers(statement: Mapping[str, Any], key: str, value: str, *, case_sensitive: bool) -> bool:
    """Whether the statement's ``key`` (Action/Resource) or ``Not<key>`` element covers ``value``."""
    if key in statement:
        return any(iam_pattern_matches(p, value, case_sensitive=case_sensitive) for p in string_set(statement[key]))
    if f"Not{key}" in statement:
        return not any(
            iam_pattern_matches(p, value, case_sensitive=case_sensitive) for p in string_set(statement[f"Not{key}"])
        )
    return False


def allows_send(statement: Mapping[str, Any], queue_arn: str) -> bool:
    """An Allow statement that grants ``sqs:SendMessage`` on ``queue_arn`` (actions are case-insensitive)."""
    return (
        statement.get("Effect", "Allow") == "Allow"
        and _covers(statement, "Action", SEND_ACTION, case_sensitive=False)
        and _covers(statement, "Resource", queue_arn, case_sensitive=True)
    )


def events_queue_arns(resources: Iterable[PolicyResource]) -> set[str]:
    """ARNs of the SQS queues EventBridge rules deliver to."""
    return {
        arn
        for r in resources
        if r.resource_type == rt.EVENT_TARGET
        for arn in [r.props.get("arn")]
        if isinstance(arn, str) and arn.split(":")[2:3] == ["sqs"]
    }


def _identity_documents(resource: PolicyResource) -> list[tuple[str, Any]]:
    if resource.resource_type in rt.IAM_POLICY_DOCUMENT_HOLDERS:
        return [("policy", resource.props.get("policy"))]
    if resource.resource_type == rt.IAM_ROLE:
        return [
            (f"inlinePolicies[{inline.get('name') or position}]", inline.get("policy"))
            for position, inline in enumerate(as_mappings(resource.props.get("inlinePolicies")))
        ]
    return []


def _only_eventbridge(statement: Mapping[str, Any]) -> bool:
    principal = statement.get("Principal")
    if not isinstance(principal, Mapping) or set(principal) != {"Service"}:
        return False
    return string_set(principal.get("Service")) == {EVENTBRIDGE_PRINCIPAL}


def _label(statement: Mapping[str, Any], position: int) -> str:
    return str(statement.get("Sid") or f"#{position}")


def events_queue_senders(args: StackValidationArgs, report: ReportViolation) -> None:
    queues = events_queue_arns(args.resources)
    if not queues:
        return
    for resource in args.resources:
        for where, raw in _identity_documents(resource):
            for position, statement in enumerate(statements(parse_json_document(raw))):
                for arn in sorted(q for q in queues if allows_send(statement, q)):
                    report(
                        f"{where} statement {_label(statement, position)} allows sqs:SendMessage on the events "
                        f"queue {arn}; only EventBridge may send to it (a sender could forge interruptions)",
                        resource.urn,
                    )
        if resource.resource_type == rt.SQS_QUEUE_POLICY:
            for position, statement in enumerate(statements(parse_json_document(resource.props.get("policy")))):
                for arn in sorted(q for q in queues if allows_send(statement, q)):
                    if not _only_eventbridge(statement):
                        report(
                            f"queue policy statement {_label(statement, position)} lets a principal other than "
                            f"{EVENTBRIDGE_PRINCIPAL} send to the events queue {arn}",
                            resource.urn,
                        )
