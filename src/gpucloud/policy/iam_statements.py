"""No IAM statement allows every action on every resource.

Checks identity policies (``iam.Policy``, ``iam.RolePolicy``/``UserPolicy``/``GroupPolicy``, the
``inlinePolicies`` of ``iam.Role``; documents are JSON strings) and attachments of the AWS managed
policies that are exactly that (AdministratorAccess). Trust policies (``assumeRolePolicy``) have no
``Resource`` and are not identity grants, so they are not checked here.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pulumi_policy import ReportViolation, ResourceValidationArgs

from gpucloud.policy import resource_types as rt
from gpucloud.policy.props import as_mappings, parse_json_document, statements, string_set

WILDCARD_ACTIONS = frozenset({"*", "*:*"})
# AWS managed policies whose document is Allow "*" on "*"
ADMIN_MANAGED_POLICY_SUFFIXES = (":policy/AdministratorAccess",)


def wildcard_statements(document: Mapping[str, Any] | None) -> list[str]:
    """Labels (Sid or position) of Allow statements granting every action on every resource."""
    found = []
    for position, statement in enumerate(statements(document)):
        if statement.get("Effect", "Allow") != "Allow":
            continue
        if string_set(statement.get("Action")) & WILDCARD_ACTIONS and "*" in string_set(statement.get("Resource")):
            found.append(str(statement.get("Sid") or f"#{position}"))
    return found


def policy_documents(args: ResourceValidationArgs) -> list[tuple[str, Any]]:
    if args.resource_type in rt.IAM_POLICY_DOCUMENT_HOLDERS:
        return [("policy", args.props.get("policy"))]
    if args.resource_type == rt.IAM_ROLE:
        return [
            (f"inlinePolicies[{inline.get('name') or position}]", inline.get("policy"))
            for position, inline in enumerate(as_mappings(args.props.get("inlinePolicies")))
        ]
    return []


def no_wildcard_admin(args: ResourceValidationArgs, report: ReportViolation) -> None:
    for where, raw in policy_documents(args):
        document = parse_json_document(raw)
        if raw is not None and document is None:
            report(f"{where} is not a JSON policy document, so its statements cannot be checked", None)
            continue
        for label in wildcard_statements(document):
            report(
                f"{where} statement {label} allows action '*' on resource '*'; grant the specific actions "
                "on the specific ARNs the nodes need",
                None,
            )
    if args.resource_type == rt.IAM_ROLE_POLICY_ATTACHMENT:
        arn = args.props.get("policyArn")
        if isinstance(arn, str) and arn.endswith(ADMIN_MANAGED_POLICY_SUFFIXES):
            report(f"attaches {arn}, which allows action '*' on resource '*'; attach a scoped policy", None)
