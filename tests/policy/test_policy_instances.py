"""IMDSv2 and public-IP policies: one compliant and one violating fixture each."""

from __future__ import annotations

import pytest
from policy_args import check_resource

LT = "aws:ec2/launchTemplate:LaunchTemplate"


def efa_nic(card: float, **extra) -> dict:
    # recorded numbers are floats (protobuf Struct), booleans in launch templates are strings
    return {
        "networkCardIndex": card,
        "deviceIndex": 0.0 if card == 0 else 1.0,
        "interfaceType": "efa",
        "securityGroups": ["sg-1"],
        "deleteOnTermination": "true",
        **extra,
    }


def test_launch_template_requiring_imdsv2_passes():
    props = {"metadataOptions": {"httpTokens": "required", "httpPutResponseHopLimit": 2.0}}
    assert check_resource("imdsv2-required", LT, props) == []


@pytest.mark.parametrize("metadata", [{"httpTokens": "optional"}, {}, None])
def test_launch_template_without_imdsv2_fails(metadata):
    props = {} if metadata is None else {"metadataOptions": metadata}
    messages = check_resource("imdsv2-required", LT, props)
    assert len(messages) == 1 and "httpTokens" in messages[0] and "'required'" in messages[0]


def test_image_builder_instances_need_imdsv2_too():
    kind = "aws:imagebuilder/infrastructureConfiguration:InfrastructureConfiguration"
    assert check_resource("imdsv2-required", kind, {"instanceMetadataOptions": {"httpTokens": "required"}}) == []
    assert check_resource("imdsv2-required", kind, {"instanceMetadataOptions": {"httpTokens": "optional"}})


def test_imdsv2_ignores_unrelated_types():
    assert check_resource("imdsv2-required", "aws:sqs/queue:Queue", {}) == []


def test_launch_template_without_public_ips_passes():
    props = {"networkInterfaces": [efa_nic(0.0, associatePublicIpAddress="false"), efa_nic(1.0)]}
    assert check_resource("no-public-ips", LT, props) == []


@pytest.mark.parametrize("flag", ["true", True])
def test_launch_template_public_ip_fails(flag):
    props = {"networkInterfaces": [efa_nic(0.0), efa_nic(1.0, associatePublicIpAddress=flag)]}
    messages = check_resource("no-public-ips", LT, props)
    assert messages == [
        "networkInterfaces (card 1, device 1) sets associatePublicIpAddress 'true'; nodes must not get "
        "public IPs (omit it or set 'false')"
    ]


def test_subnet_mapping_public_ips_fails_and_private_subnet_passes():
    subnet = "aws:ec2/subnet:Subnet"
    assert check_resource("no-public-ips", subnet, {"cidrBlock": "10.0.0.0/20"}) == []
    assert check_resource("no-public-ips", subnet, {"mapPublicIpOnLaunch": False}) == []
    messages = check_resource("no-public-ips", subnet, {"mapPublicIpOnLaunch": True})
    assert len(messages) == 1 and "mapPublicIpOnLaunch" in messages[0]


def test_public_ip_policy_survives_odd_shapes():
    # a missing or malformed interface list must not crash the policy
    assert check_resource("no-public-ips", LT, {"networkInterfaces": None}) == []
    assert check_resource("no-public-ips", LT, {"networkInterfaces": ["not-a-mapping"]}) == []


ASG = "aws:autoscaling/group:Group"


def test_placement_group_with_one_subnet_passes():
    props = {"placementGroup": "pg-1", "vpcZoneIdentifiers": ["subnet-a"]}
    assert check_resource("placement-group-one-zone", ASG, props) == []
    spread = {"vpcZoneIdentifiers": ["subnet-a", "subnet-b", "subnet-c"]}  # no placement group: may spread
    assert check_resource("placement-group-one-zone", ASG, spread) == []


@pytest.mark.parametrize("subnets", [["subnet-a", "subnet-b"], [], None])
def test_placement_group_over_several_zones_fails(subnets):
    props = {"placementGroup": "pg-1", "vpcZoneIdentifiers": subnets}
    (message,) = check_resource("placement-group-one-zone", ASG, props)
    assert "a cluster placement group lies in one Availability Zone" in message
