"""No ingress from the whole internet, whatever resource shape carries the rule."""

from __future__ import annotations

import pytest
from policy_args import check_resource

SG = "aws:ec2/securityGroup:SecurityGroup"
VPC_IN = "aws:vpc/securityGroupIngressRule:SecurityGroupIngressRule"
VPC_OUT = "aws:vpc/securityGroupEgressRule:SecurityGroupEgressRule"
RULE = "aws:ec2/securityGroupRule:SecurityGroupRule"


def test_private_ingress_and_open_egress_pass():
    assert (
        check_resource(
            "no-internet-ingress",
            SG,
            {
                "ingress": [
                    {"protocol": "-1", "fromPort": 0.0, "toPort": 0.0, "self": True},
                    {"protocol": "tcp", "fromPort": 988.0, "toPort": 988.0, "cidrBlocks": ["10.0.0.0/16"]},
                ],
                "egress": [{"protocol": "-1", "fromPort": 0.0, "toPort": 0.0, "cidrBlocks": ["0.0.0.0/0"]}],
            },
        )
        == []
    )
    assert check_resource("no-internet-ingress", VPC_OUT, {"ipProtocol": "-1", "cidrIpv4": "0.0.0.0/0"}) == []
    assert (
        check_resource("no-internet-ingress", RULE, {"type": "egress", "protocol": "-1", "cidrBlocks": ["0.0.0.0/0"]})
        == []
    )


def test_inline_ingress_from_anywhere_fails_naming_ports():
    messages = check_resource(
        "no-internet-ingress",
        SG,
        {"ingress": [{"protocol": "tcp", "fromPort": 22.0, "toPort": 22.0, "cidrBlocks": ["0.0.0.0/0"]}]},
    )
    assert messages == [
        "ingress (tcp 22) is open to 0.0.0.0/0; allow only security groups, prefix lists or "
        "private CIDRs (nodes are reached through SSM)"
    ]


@pytest.mark.parametrize(
    "props, cidr",
    [
        ({"ipProtocol": "tcp", "fromPort": 22.0, "toPort": 22.0, "cidrIpv4": "0.0.0.0/0"}, "0.0.0.0/0"),
        ({"ipProtocol": "-1", "cidrIpv6": "::/0"}, "::/0"),
    ],
)
def test_vpc_ingress_rule_from_anywhere_fails(props, cidr):
    messages = check_resource("no-internet-ingress", VPC_IN, props)
    assert len(messages) == 1 and f"open to {cidr}" in messages[0]


def test_security_group_rule_ingress_from_anywhere_fails():
    messages = check_resource(
        "no-internet-ingress",
        RULE,
        {"type": "ingress", "protocol": "-1", "fromPort": 0.0, "toPort": 0.0, "ipv6CidrBlocks": ["::/0"]},
    )
    assert messages and "all traffic" in messages[0] and "::/0" in messages[0]


def test_missing_props_do_not_crash():
    assert check_resource("no-internet-ingress", SG, {}) == []
    assert check_resource("no-internet-ingress", VPC_IN, {}) == []
