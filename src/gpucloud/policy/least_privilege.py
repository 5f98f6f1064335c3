"""Least privilege beyond "no admin": no identity policy grants a wildcard action, and no SNS topic
is open to every principal.

- ``no-iam-wildcard-actions``: an ``Allow`` statement whose ``Action`` holds ``*`` anywhere
  (``*``, ``sns:*``, ``ec2:Describe*``) grants actions nobody reviewed, including ones AWS adds
  later; name the actions. ``NotAction`` in an Allow is the same thing inverted. Resource ``*`` stays
  allowed where the action supports no resource-level permission (``ec2:DescribeInstances``).
- ``sns-topic-not-public``: a topic policy statement that allows ``*`` (or ``{"AWS": "*"}``) without
  a condition lets anyone publish to (or subscribe to) the alert topic.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pulumi_policy import ReportViolation, ResourceValidationArgs

from gpucloud.policy import resource_types as rt
from gpucloud.policy.iam_statements import policy_documents
from gpucloud.policy.props import as_list, parse_json_document, statements, string_set


def wildcard_actions(document: Mapping[str, Any] | None) -> list[tuple[str, list[str]]]:
    """(Sid or position, the wildcard actions) of each Allow statement that grants any."""
    found = []
    for position, statement in enumerate(statements(document)):
        if statement.get("Effect", "Allow") != "Allow":
            continue
        label = str(statement.get("Sid") or f"#{position}")
        wild = sorted(a for a in string_set(statement.get("Action")) if "*" in a)
        if statement.get("NotAction") is not None:
            wild.append("NotAction")
        if wild:
            found.append((label, wild))
    return found


def no_wildcard_actions(args: ResourceValidationArgs, report: ReportViolation) -> None:
    for where, raw in policy_documents(args):
        for label, actions in wildcard_actions(parse_json_document(raw)):
            report(
                f"{where} statement {label} allows wildcard actions {', '.join(actions)}; name each action "
                "the role calls (least privilege)",
                None,
            )


def _public_principal(principal: Any) -> bool:
    if principal == "*":
        return True
    if isinstance(principal, Mapping):
        return "*" in [p for p in as_list(principal.get("AWS")) if isinstance(p, str)]
    return False


def sns_topic_not_public(args: ResourceValidationArgs, report: ReportViolation) -> None:
    if args.resource_type not in (rt.SNS_TOPIC, rt.SNS_TOPIC_POLICY):
        return
    document = parse_json_document(args.props.get("policy"))
    for position, statement in enumerate(statements(document)):
        if statement.get("Effect", "Allow") != "Allow" or statement.get("Condition"):
            continue
        if _public_principal(statement.get("Principal")):
            label = statement.get("Sid") or f"#{position}"
            report(
                f"topic policy statement {label} allows every principal ('*') with no condition; name the "
                "service or account that publishes (e.g. aps.amazonaws.com with aws:SourceArn)",
                None,
            )
