"""Spot capacity that is not one pool: several instance types in a spot group, each
with its weight and its own EFA layout (a mixed instances policy with launch-template overrides,
price-capacity-optimized), and several zones for groups without EFA."""

from __future__ import annotations

import base64
import json

import pytest

from gpucloud.cluster.addressing import plan_subnets
from gpucloud.errors import UserError
from gpucloud.infra.preview import StackPreview, preview_stack
from gpucloud.policy.pack import POLICIES
from gpucloud.policy.runner import run_policies
from gpucloud.spec import spec_from_config

LT = "aws:ec2/launchTemplate:LaunchTemplate"
ASG = "aws:autoscaling/group:Group"
SUBNET = "aws:ec2/subnet:Subnet"
PG = "aws:ec2/placementGroup:PlacementGroup"
ZONES = ["us-east-1a", "us-east-1b", "us-east-1c"]

H100_MIX = {
    "name": "h100",
    "instanceTypes": [
        {"instanceType": "p5.48xlarge", "weight": 1},
        {"instanceType": "p5en.48xlarge", "weight": 1},  # 16 EFA cards: its own launch template
        {"instanceType": "p5e.48xlarge", "weight": 1},  # same cards as p5: shares p5's template
    ],
    "maxNodes": 4,
    "capacity": {"type": "spot"},
}
SMALL_MIX = {
    "name": "dev",
    "instanceTypes": [{"instanceType": "g6.xlarge", "weight": 1}, {"instanceType": "g5.xlarge", "weight": 1}],
    "maxNodes": 4,
    "capacity": {"type": "spot"},
}
CONFIG = {
    "aws:region": "us-east-1",
    "gpucloud:availabilityZones": ZONES,
    "gpucloud:nodeGroups": [H100_MIX, SMALL_MIX],
    "gpucloud:network": {"vpcCidr": "10.70.0.0/16"},
    "gpucloud:agent": {"package": "s3://wheels-bucket/gpucloud-0.1.0-py3-none-any.whl"},
}


@pytest.fixture(scope="module")
def mixed() -> StackPreview:
    return preview_stack(spec_from_config(CONFIG, "Pulumi.mix.yaml"), "mix")


def group_resources(preview: StackPreview, kind: str, group: str) -> list:
    return [r for r in preview.of_type(kind) if f"-group-{group}-" in r.name]


def user_data(lt) -> str:
    return base64.b64decode(lt.inputs["userData"]).decode()


def test_each_type_is_an_override_with_its_weight_and_its_own_layout(mixed) -> None:
    templates = {lt.name: lt for lt in group_resources(mixed, LT, "h100")}
    assert sorted(templates) == ["mix-group-h100-lt", "mix-group-h100-lt-2"]
    primary, p5en = templates["mix-group-h100-lt"], templates["mix-group-h100-lt-2"]
    assert (primary.inputs["instanceType"], len(primary.inputs["networkInterfaces"])) == ("p5.48xlarge", 33)
    assert (p5en.inputs["instanceType"], len(p5en.inputs["networkInterfaces"])) == ("p5en.48xlarge", 17)
    # each template's nodes check for their own number of EFA devices
    assert "GPUCLOUD_EFA_INTERFACES=32" in user_data(primary) and "GPUCLOUD_EFA_INTERFACES=16" in user_data(p5en)
    (asg,) = group_resources(mixed, ASG, "h100")
    policy = asg.inputs["mixedInstancesPolicy"]
    assert policy["instancesDistribution"]["spotAllocationStrategy"] == "price-capacity-optimized"
    assert policy["launchTemplate"]["launchTemplateSpecification"]["launchTemplateId"] == primary.id
    overrides = [
        (o["instanceType"], o["weightedCapacity"], (o.get("launchTemplateSpecification") or {}).get("launchTemplateId"))
        for o in policy["launchTemplate"]["overrides"]
    ]
    assert overrides == [("p5.48xlarge", "1", None), ("p5e.48xlarge", "1", None), ("p5en.48xlarge", "1", p5en.id)]


def test_an_efa_group_stays_in_one_zone_and_one_placement_group(mixed) -> None:
    (asg,) = group_resources(mixed, ASG, "h100")
    (pg,) = group_resources(mixed, PG, "h100")
    assert asg.inputs["vpcZoneIdentifiers"] == ["mix-network-nodes-id"] and asg.inputs["placementGroup"] == pg.name
    for lt in group_resources(mixed, LT, "h100"):
        assert lt.inputs["placement"] == {"groupName": pg.name}


def test_a_group_without_efa_spreads_over_every_zone(mixed) -> None:
    subnets = {s.inputs["availabilityZone"]: s for s in mixed.of_type(SUBNET) if "-nodes" in s.name}
    assert sorted(subnets) == ZONES
    # the first zone keeps the one-zone subnet (name and range); the others get an eighth each
    assert [subnets[z].inputs["cidrBlock"] for z in ZONES] == ["10.70.0.0/17", "10.70.160.0/19", "10.70.192.0/19"]
    (asg,) = group_resources(mixed, ASG, "dev")
    assert asg.inputs["vpcZoneIdentifiers"] == [f"{subnets[z].name}-id" for z in ZONES]
    overrides = asg.inputs["mixedInstancesPolicy"]["launchTemplate"]["overrides"]
    assert [(o["instanceType"], o["weightedCapacity"]) for o in overrides] == [("g6.xlarge", "1"), ("g5.xlarge", "1")]
    assert not group_resources(mixed, PG, "dev")


def test_plan_shows_a_layout_per_instance_type(mixed) -> None:
    layouts = [(g.node_group, g.efa.instance_type, g.efa.layout, g.efa.efa_interfaces) for g in mixed.efa_layouts]
    assert layouts == [
        ("h100", "p5.48xlarge", "efa-only", 32),
        ("h100", "p5en.48xlarge", "efa-only", 16),
        ("h100", "p5e.48xlarge", "efa-only", 32),
        ("dev", "g6.xlarge", "none", 0),
        ("dev", "g5.xlarge", "none", 0),
    ]
    assert json.loads(json.dumps(mixed.to_json()))["efa_layout"][1]["instance_type"] == "p5en.48xlarge"


def test_the_policy_pack_passes_the_mixed_stack(mixed) -> None:
    assert [v.describe() for v in run_policies(mixed.resources, stack="mix", policies=POLICIES)] == []


def test_a_single_type_group_keeps_its_shape() -> None:
    config = {
        **CONFIG,
        "gpucloud:nodeGroups": [{"name": "dev", "instanceType": "g6.xlarge", "capacity": {"type": "spot"}}],
    }
    preview = preview_stack(spec_from_config(config, "test"), "one")
    (asg,) = preview.of_type(ASG)
    assert asg.inputs["mixedInstancesPolicy"]["launchTemplate"]["overrides"] == [{"instanceType": "g6.xlarge"}]
    assert [lt.name for lt in preview.of_type(LT)] == ["one-group-dev-lt"]


def test_subnet_plan_for_several_zones() -> None:
    assert plan_subnets("10.0.0.0/16").node_subnets == ("10.0.0.0/17",)
    plan = plan_subnets("10.0.0.0/16", 4)
    assert plan.node_subnets == ("10.0.0.0/17", "10.0.160.0/19", "10.0.192.0/19", "10.0.224.0/19")
    assert plan.public == "10.0.128.0/20"  # in the eighth no zone takes
    with pytest.raises(ValueError):
        plan_subnets("10.0.0.0/16", 5)


def refused(config: dict) -> str:
    with pytest.raises(UserError) as error:
        spec_from_config(config, "Pulumi.mix.yaml")
    return str(error.value)


def test_an_efa_group_asking_for_two_zones_is_told_why() -> None:
    h100 = {**H100_MIX, "availabilityZones": ZONES[:2]}
    message = refused({**CONFIG, "gpucloud:nodeGroups": [h100]})
    assert "gpucloud:nodeGroups[0].availabilityZones" in message
    assert "EFA traffic does not cross Availability Zones and a cluster placement group lies in one zone" in message


@pytest.mark.parametrize(
    ("group", "text"),
    [
        ({**SMALL_MIX, "capacity": {"type": "on-demand"}}, "several instance types are for spot groups"),
        (
            {**H100_MIX, "instanceTypes": [{"instanceType": "p5.48xlarge"}, {"instanceType": "g6.xlarge"}]},
            "the group uses EFA (p5.48xlarge has it) and g6.xlarge has none",
        ),
        (
            {**SMALL_MIX, "instanceTypes": [{"instanceType": "g6.xlarge"}, {"instanceType": "g6.xlarge"}]},
            "each instance type at most once",
        ),
        ({**SMALL_MIX, "instanceType": "g5.xlarge"}, "must be the first of instanceTypes (g6.xlarge)"),
        ({**SMALL_MIX, "instanceTypes": [{"instanceType": "g6.xlarge", "weight": 0}]}, "allowed: 1 (every node"),
        (
            {**SMALL_MIX, "instanceTypes": [{"instanceType": "g6.xlarge"}, {"instanceType": "g5.xlarge", "weight": 2}]},
            "the scale-out counts nodes",
        ),
        ({**SMALL_MIX, "instanceTypes": [{"instanceType": "g6.xlarge"}, {"instanceType": "x9.huge"}]}, "unknown"),
        ({**SMALL_MIX, "availabilityZones": ["us-east-1d"]}, "allowed: one or more different zones"),
    ],
)
def test_bad_mixes_are_one_line_each(group: dict, text: str) -> None:
    message = refused({**CONFIG, "gpucloud:nodeGroups": [group]})
    assert text in message and "\n" not in message


def test_each_zone_leaves_through_its_own_nat_gateway(mixed) -> None:
    """One NAT gateway in the first zone for all three would bill every other zone's egress as
    cross-zone data and cut it when the first zone fails: each zone gets its own."""
    by_id = {r.id: r for r in mixed.resources if r.custom}
    zone_of_subnet = {s.id: s.inputs["availabilityZone"] for s in mixed.of_type(SUBNET)}
    table_of_subnet = {
        a.inputs["subnetId"]: a.inputs["routeTableId"]
        for a in mixed.of_type("aws:ec2/routeTableAssociation:RouteTableAssociation")
    }
    nat_of_table = {r.inputs["routeTableId"]: r.inputs["natGatewayId"] for r in mixed.of_type("aws:ec2/route:Route")}
    nodes = [s for s in mixed.of_type(SUBNET) if "-nodes" in s.name]
    assert len(nodes) == len(ZONES) == len(mixed.of_type("aws:ec2/natGateway:NatGateway"))
    for subnet in nodes:
        nat = by_id[nat_of_table[table_of_subnet[subnet.id]]]
        assert zone_of_subnet[nat.inputs["subnetId"]] == subnet.inputs["availabilityZone"]
