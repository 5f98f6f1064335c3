"""No IAM statement allows '*' on '*'."""

from __future__ import annotations

import json

import pytest
from policy_args import check_resource

ROLE_POLICY = "aws:iam/rolePolicy:RolePolicy"


def document(*statements: dict) -> str:
    return json.dumps({"Version": "2012-10-17", "Statement": list(statements)})


def test_scoped_policy_passes():
    props = {
        "policy": document(
            {
                "Effect": "Allow",
                "Action": ["sqs:ReceiveMessage", "sqs:DeleteMessage"],
                "Resource": "arn:aws:sqs:us-east-1:123456789012:jobs",
            },
            {"Effect": "Allow", "Action": "ec2:DescribeInstances", "Resource": "*"},  # describe calls need '*'
            {"Effect": "Deny", "Action": "*", "Resource": "*"},
        )
    }
    assert check_resource("no-iam-wildcard-admin", ROLE_POLICY, props) == []


@pytest.mark.parametrize("action", ["*", ["s3:GetObject", "*"], "*:*"])
def test_wildcard_statement_fails(action):
    props = {"policy": document({"Sid": "Admin", "Effect": "Allow", "Action": action, "Resource": ["*"]})}
    assert check_resource("no-iam-wildcard-admin", ROLE_POLICY, props) == [
        "policy statement Admin allows action '*' on resource '*'; grant the specific actions on the specific "
        "ARNs the nodes need"
    ]


def test_single_statement_object_and_policy_type():
    props = {"policy": json.dumps({"Statement": {"Effect": "Allow", "Action": "*", "Resource": "*"}})}
    assert check_resource("no-iam-wildcard-admin", "aws:iam/policy:Policy", props) == [
        "policy statement #0 allows action '*' on resource '*'; grant the specific actions on the specific "
        "ARNs the nodes need"
    ]


def test_role_inline_policies_are_checked():
    props = {
        "inlinePolicies": [
            {"name": "ok", "policy": document({"Action": "s3:GetObject", "Resource": "*"})},
            {"name": "admin", "policy": document({"Action": "*", "Resource": "*"})},
        ]
    }
    messages = check_resource("no-iam-wildcard-admin", "aws:iam/role:Role", props)
    assert len(messages) == 1 and messages[0].startswith("inlinePolicies[admin] statement #0")


def test_administrator_access_attachment_fails():
    kind = "aws:iam/rolePolicyAttachment:RolePolicyAttachment"
    assert (
        check_resource(
            "no-iam-wildcard-admin", kind, {"policyArn": "arn:aws:iam::aws:policy/AmazonSSMManagedInstanceCore"}
        )
        == []
    )
    messages = check_resource(
        "no-iam-wildcard-admin", kind, {"policyArn": "arn:aws:iam::aws:policy/AdministratorAccess"}
    )
    assert len(messages) == 1 and "AdministratorAccess" in messages[0]


def test_unparseable_document_is_reported_not_crashed():
    messages = check_resource("no-iam-wildcard-admin", ROLE_POLICY, {"policy": "{not json"})
    assert messages == ["policy is not a JSON policy document, so its statements cannot be checked"]
    assert check_resource("no-iam-wildcard-admin", ROLE_POLICY, {}) == []
