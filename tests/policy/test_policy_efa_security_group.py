"""EFA security groups must allow all traffic to and from themselves (ingress AND egress)."""

from __future__ import annotations

import pytest
from policy_args import check_stack, resource

SG = "aws:ec2/securityGroup:SecurityGroup"
LT = "aws:ec2/launchTemplate:LaunchTemplate"
VPC_IN = "aws:vpc/securityGroupIngressRule:SecurityGroupIngressRule"
VPC_OUT = "aws:vpc/securityGroupEgressRule:SecurityGroupEgressRule"
RULE = "aws:ec2/securityGroupRule:SecurityGroupRule"
POLICY = "efa-security-group-self-rules"


def launch_template(group, interface_type="efa-only", groups=("sg-efa",)):
    nics = [
        {"networkCardIndex": 0.0, "deviceIndex": 0.0, "interfaceType": "interface", "securityGroups": list(groups)},
        {"networkCardIndex": 0.0, "deviceIndex": 1.0, "interfaceType": interface_type, "securityGroups": list(groups)},
    ]
    return resource(LT, "nodes-lt", {"networkInterfaces": nics}, {"networkInterfaces": [group]})


def vpc_rule(kind, name, group, protocol="-1", peer=True):
    props = {"securityGroupId": "sg-efa", "ipProtocol": protocol}
    deps = {"securityGroupId": [group]}
    if peer:
        props["referencedSecurityGroupId"] = "sg-efa"
        deps["referencedSecurityGroupId"] = [group]
    else:
        props["cidrIpv4"] = "10.0.0.0/16"
    return resource(kind, name, props, deps)


@pytest.fixture
def group():
    return resource(SG, "efa-sg", {"vpcId": "vpc-1", "description": "EFA"})


def test_standalone_vpc_rules_pass(group):
    resources = [group, vpc_rule(VPC_IN, "in", group), vpc_rule(VPC_OUT, "out", group), launch_template(group)]
    assert check_stack(POLICY, resources) == []


def test_inline_self_rules_pass():
    group = resource(
        SG,
        "efa-sg",
        {
            "ingress": [{"protocol": "-1", "fromPort": 0.0, "toPort": 0.0, "self": True}],
            "egress": [{"protocol": "-1", "fromPort": 0.0, "toPort": 0.0, "self": True}],
        },
    )
    assert check_stack(POLICY, [group, launch_template(group)]) == []


def test_security_group_rule_resources_pass(group):
    ingress = resource(
        RULE,
        "in",
        {
            "type": "ingress",
            "protocol": "-1",
            "fromPort": 0.0,
            "toPort": 0.0,
            "securityGroupId": "sg-efa",
            "self": True,
        },
        {"securityGroupId": [group]},
    )
    egress = resource(
        RULE,
        "out",
        {
            "type": "egress",
            "protocol": "all",
            "fromPort": 0.0,
            "toPort": 0.0,
            "securityGroupId": "sg-efa",
            "sourceSecurityGroupId": "sg-efa",
        },
        {"securityGroupId": [group], "sourceSecurityGroupId": [group]},
    )
    assert check_stack(POLICY, [group, ingress, egress, launch_template(group)]) == []


def test_missing_egress_self_rule_fails(group):
    found = check_stack(POLICY, [group, vpc_rule(VPC_IN, "in", group), launch_template(group)])
    assert found == [
        (
            "security group 'efa-sg' is used by EFA interfaces of 'nodes-lt' but has no all-traffic (protocol -1) "
            "egress rule referencing itself; EFA needs both",
            group.urn,
        )
    ]


@pytest.mark.parametrize("bad", [{"protocol": "tcp"}, {"peer": False}])
def test_partial_rules_do_not_count(group, bad):
    protocol = bad.get("protocol", "-1")
    peer = bad.get("peer", True)
    resources = [
        group,
        vpc_rule(VPC_IN, "in", group, protocol, peer),
        vpc_rule(VPC_OUT, "out", group, protocol, peer),
        launch_template(group),
    ]
    found = check_stack(POLICY, resources)
    assert len(found) == 1 and "ingress or egress" in found[0][0]


def test_non_efa_templates_are_not_checked(group):
    assert check_stack(POLICY, [group, launch_template(group, interface_type="interface")]) == []


def test_efa_interface_without_security_group_fails(group):
    found = check_stack(
        POLICY,
        [group, vpc_rule(VPC_IN, "in", group), vpc_rule(VPC_OUT, "out", group), launch_template(group, groups=())],
    )
    assert any("have no security groups" in message for message, _ in found)


def test_efa_group_outside_the_stack_is_reported():
    template = resource(
        LT,
        "nodes-lt",
        {
            "networkInterfaces": [
                {
                    "networkCardIndex": 0.0,
                    "deviceIndex": 0.0,
                    "interfaceType": "efa",
                    "securityGroups": ["sg-elsewhere"],
                }
            ]
        },
    )
    found = check_stack(POLICY, [template])
    assert len(found) == 1 and "cannot be verified" in found[0][0]
