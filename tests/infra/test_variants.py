"""Stack variants the shipped stacks do not cover: existing VPC, endpoint-only egress, SSH, ODCR, AMI id."""

from __future__ import annotations

import json

from gpucloud.infra.preview import StackPreview, preview_stack
from gpucloud.spec import spec_from_config

BASE = {
    "aws:region": "eu-west-1",
    "gpucloud:nodeGroups": [{"name": "a", "instanceType": "p5en.48xlarge", "maxNodes": 2}],
    "gpucloud:agent": {"package": "s3://wheels-bucket/gpucloud-0.1.0-py3-none-any.whl"},
}


def plan(**extra) -> StackPreview:
    return preview_stack(spec_from_config({**BASE, **extra}, "test"), "variant")


def types(preview: StackPreview) -> set[str]:
    return {r.type for r in preview.custom_resources}


def test_existing_vpc_creates_no_network_and_uses_the_subnet() -> None:
    preview = plan(**{"gpucloud:network": {"vpcId": "vpc-0123abcd", "subnetIds": ["subnet-0123abcd"]}})
    assert not {"aws:ec2/vpc:Vpc", "aws:ec2/subnet:Subnet", "aws:ec2/natGateway:NatGateway"} & types(preview)
    asg = preview.of_type("aws:autoscaling/group:Group")[0].inputs
    assert asg["vpcZoneIdentifiers"] == ["subnet-0123abcd"]
    sg = preview.of_type("aws:ec2/securityGroup:SecurityGroup")[0].inputs
    assert sg["vpcId"] == "vpc-0123abcd"
    # the AZ comes from the region's lookup when the stack does not name one
    assert any(c.token == "aws:index/getAvailabilityZones:getAvailabilityZones" for c in preview.invokes)


def test_endpoint_egress_has_no_nat_and_private_endpoints() -> None:
    preview = plan(
        **{
            "gpucloud:network": {"vpcCidr": "10.9.0.0/20", "egress": "endpoints"},
            # no package index in this mode: the agent comes in the gpucloud image
            "gpucloud:agent": {},
            "gpucloud:ami": {"parameter": "/gpucloud/image/ami-id"},
        }
    )
    assert "aws:ec2/natGateway:NatGateway" not in types(preview)
    interface = {
        r.inputs["serviceName"]
        for r in preview.of_type("aws:ec2/vpcEndpoint:VpcEndpoint")
        if r.inputs["vpcEndpointType"] == "Interface"
    }
    assert {"com.amazonaws.eu-west-1.ssm", "com.amazonaws.eu-west-1.sqs"} <= interface
    https = [
        r.inputs
        for r in preview.of_type("aws:vpc/securityGroupIngressRule:SecurityGroupIngressRule")
        if r.inputs.get("fromPort") == 443
    ]
    assert https and https[0]["cidrIpv4"] == "10.9.0.0/20"


def test_ssh_is_opened_only_to_the_named_range() -> None:
    preview = plan(**{"gpucloud:access": {"sshKeyName": "ops", "sshCidrs": ["10.1.0.0/16"]}})
    ssh = [
        r.inputs
        for r in preview.of_type("aws:vpc/securityGroupIngressRule:SecurityGroupIngressRule")
        if r.inputs.get("fromPort") == 22
    ]
    assert [(s["cidrIpv4"], s["toPort"]) for s in ssh] == [("10.1.0.0/16", 22)]
    assert preview.of_type("aws:ec2/launchTemplate:LaunchTemplate")[0].inputs["keyName"] == "ops"


def test_on_demand_capacity_reservation_and_fixed_ami() -> None:
    preview = plan(
        **{
            "gpucloud:nodeGroups": [
                {
                    "name": "a",
                    "instanceType": "p5en.48xlarge",
                    "maxNodes": 2,
                    "efa": {"layout": "legacy"},
                    "capacity": {"type": "capacity-reservation", "reservationId": "cr-0123456789abcdef0"},
                }
            ],
            "gpucloud:ami": {"id": "ami-0fedcba9876543210"},
            "gpucloud:access": {"ssm": False, "sshKeyName": "ops", "sshCidrs": ["10.0.0.0/8"]},
        }
    )
    lt = preview.of_type("aws:ec2/launchTemplate:LaunchTemplate")[0].inputs
    assert "instanceMarketOptions" not in lt
    assert (
        lt["capacityReservationSpecification"]["capacityReservationTarget"]["capacityReservationId"]
        == "cr-0123456789abcdef0"
    )
    assert lt["imageId"] == "ami-0fedcba9876543210"
    assert [n["interfaceType"] for n in lt["networkInterfaces"]] == ["efa"] * 16
    assert not preview.of_type("aws:ec2/placementGroup:PlacementGroup")
    assert not any(c.token == "aws:ssm/getParameter:getParameter" for c in preview.invokes)
    assert not preview.of_type("aws:iam/rolePolicyAttachment:RolePolicyAttachment")  # ssm: false


def test_lifecycle_rule_names_every_group() -> None:
    preview = plan(
        **{
            "gpucloud:nodeGroups": [
                {"name": "a", "instanceType": "g6.xlarge"},
                {"name": "b", "instanceType": "g5.xlarge"},
            ]
        }
    )
    rule = next(r for r in preview.of_type("aws:cloudwatch/eventRule:EventRule") if r.name.endswith("asg-terminate"))
    names = json.loads(rule.inputs["eventPattern"])["detail"]["AutoScalingGroupName"]
    assert sorted(names) == ["variant-group-a-asg", "variant-group-b-asg"]


def test_image_pipeline_section_builds_the_pipeline_and_exports_its_parameter() -> None:
    from gpucloud.policy.runner import run_policies

    preview = plan(
        **{
            "gpucloud:image": {
                "wheelS3Uri": "s3://wheels-bucket/gpucloud-0.1.0-py3-none-any.whl",
                "amiParameter": "/gpucloud/images/ami-id",
            }
        }
    )
    distribution = preview.of_type("aws:imagebuilder/distributionConfiguration:DistributionConfiguration")
    assert len(distribution) == 1
    ssm = distribution[0].inputs["distributions"][0]["ssmParameterConfigurations"][0]
    assert ssm["parameterName"] == "/gpucloud/images/ami-id"
    assert preview.of_type("aws:imagebuilder/imagePipeline:ImagePipeline")
    # the pipeline's resources pass the same policy pack as the cluster's
    assert [v for v in run_policies(preview.resources, stack="variant") if v.enforcement == "mandatory"] == []


def test_ami_from_an_image_pipeline_parameter() -> None:
    preview = plan(**{"gpucloud:ami": {"parameter": "/gpucloud/images/ami-id"}})
    names = [c.args.get("name") for c in preview.invokes if c.token == "aws:ssm/getParameter:getParameter"]
    assert names == ["/gpucloud/images/ami-id"]
    assert not preview.of_type("aws:imagebuilder/imagePipeline:ImagePipeline")
