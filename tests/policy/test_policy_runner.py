"""run_policies: recorded resources in, violations out, with references rebuilt like the engine."""

from __future__ import annotations

import dataclasses
from typing import Any

from gpucloud.policy.pack import POLICIES
from gpucloud.policy.runner import Violation, run_policies

SG = "aws:ec2/securityGroup:SecurityGroup"
VPC_IN = "aws:vpc/securityGroupIngressRule:SecurityGroupIngressRule"
VPC_OUT = "aws:vpc/securityGroupEgressRule:SecurityGroupEgressRule"
LT = "aws:ec2/launchTemplate:LaunchTemplate"
TAGS = {"gpucloud:stack": "dev"}


@dataclasses.dataclass
class Recorded:
    type: str
    name: str
    inputs: dict[str, Any]
    custom: bool = True
    id: str | None = None
    property_dependencies: dict[str, list[str]] | None = None


def urn(kind: str, name: str) -> str:
    return f"urn:pulumi:dev::gpucloud::{kind}::{name}"


def efa_stack(*, link: str, with_egress: bool = True) -> list[Recorded]:
    """An EFA group, its rules and a launch template, linked by ids or by property dependencies."""
    sg_urn = urn(SG, "efa")
    deps = (lambda *keys: {k: [sg_urn] for k in keys}) if link == "deps" else (lambda *keys: None)
    rules = [
        Recorded(
            VPC_IN,
            "efa-in",
            {"securityGroupId": "sg-9", "referencedSecurityGroupId": "sg-9", "ipProtocol": "-1", "tags": TAGS},
            property_dependencies=deps("securityGroupId", "referencedSecurityGroupId"),
        )
    ]
    if with_egress:
        rules.append(
            Recorded(
                VPC_OUT,
                "efa-out",
                {"securityGroupId": "sg-9", "referencedSecurityGroupId": "sg-9", "ipProtocol": "-1", "tags": TAGS},
                property_dependencies=deps("securityGroupId", "referencedSecurityGroupId"),
            )
        )
    template = Recorded(
        LT,
        "lt",
        {
            "metadataOptions": {"httpTokens": "required"},
            "tags": TAGS,
            "networkInterfaces": [
                {"networkCardIndex": 0.0, "deviceIndex": 0.0, "interfaceType": "efa", "securityGroups": ["sg-9"]}
            ],
        },
        property_dependencies=deps("networkInterfaces"),
    )
    group = Recorded(SG, "efa", {"vpcId": "vpc-1", "tags": TAGS}, id="sg-9" if link == "ids" else "unrelated")
    component = Recorded("gpucloud:cluster:Cluster", "cluster", {}, custom=False)
    return [component, group, *rules, template]


def test_clean_stack_has_no_violations_whether_linked_by_ids_or_dependencies():
    assert run_policies(efa_stack(link="ids"), stack="dev") == []
    assert run_policies(efa_stack(link="deps"), stack="dev") == []


def test_violations_name_policy_resource_and_level():
    violations = run_policies(efa_stack(link="deps", with_egress=False), stack="dev")
    assert violations == [
        Violation(
            policy="efa-security-group-self-rules",
            enforcement="mandatory",
            resource_type=SG,
            resource_name="efa",
            message="security group 'efa' is used by EFA interfaces of 'lt' but has no all-traffic (protocol -1) "
            "egress rule referencing itself; EFA needs both",
        )
    ]
    assert (
        violations[0]
        .describe()
        .startswith("[efa-security-group-self-rules] aws:ec2/securityGroup:SecurityGroup 'efa': ")
    )


def test_resource_policies_report_against_their_resource_and_stack_comes_from_the_urn():
    resources = efa_stack(link="ids")
    resources[-1].inputs["metadataOptions"] = {"httpTokens": "optional"}
    violations = run_policies(resources, stack="prod")  # tags say dev: every tagged resource is wrong
    assert {(v.policy, v.resource_name) for v in violations} == {
        ("imdsv2-required", "lt"),
        ("tagged-with-stack", "efa"),
        ("tagged-with-stack", "efa-in"),
        ("tagged-with-stack", "efa-out"),
        ("tagged-with-stack", "lt"),
    }


def test_every_policy_is_mandatory_and_uniquely_named():
    names = [p.name for p in POLICIES]
    assert len(names) == len(set(names)) == 14
    assert {p.enforcement_level.value for p in POLICIES} == {"mandatory"}
