"""A small stack's real resources, made with boto3 on the moto server, as a dead CI job leaves them;
and untagged look-alikes plus a ``gpucloud:keep=true`` one beside them, which sweep must not touch.

Shared by tests/teardown and benchmarks/bench_sweep.py.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from gpucloud.cluster.tags import EXPIRES_AT_TAG, KEEP_TAG, STACK_TAG

AMI = "ami-12c6146b"  # one of moto's built-in AMIs
ASSUME_EC2 = json.dumps(
    {
        "Version": "2012-10-17",
        "Statement": [{"Effect": "Allow", "Principal": {"Service": "ec2.amazonaws.com"}, "Action": "sts:AssumeRole"}],
    }
)


@dataclasses.dataclass
class Leaked:
    """What was made: ``tagged`` ARN-ish ids sweep must delete; ``spared`` ones it must leave."""

    ids: dict[str, str] = dataclasses.field(default_factory=dict)
    spared: dict[str, str] = dataclasses.field(default_factory=dict)


def tags_for(stack: str | None, **more: str) -> list[dict[str, str]]:
    base = {STACK_TAG: stack} if stack else {}
    return [{"Key": k, "Value": v} for k, v in {**base, **more}.items()]


def make_stack(
    client: Any,
    stack: str,
    *,
    prefix: str,
    tagged: bool = True,
    expires_at: str | None = None,
    instance_type: str = "t3.micro",
    instances: int = 1,
    on_demand: int = 0,
    fsx_gib: int = 1200,
) -> dict[str, str]:
    """One stack's resources; ``tagged=False`` makes the same ones without any gpucloud tag. Of the
    ``instances``, the first ``on_demand`` launch on-demand (a group's onDemandBase), the rest spot.
    Returns kind -> id for each."""
    extra = {EXPIRES_AT_TAG: expires_at} if expires_at else {}
    tag_list = tags_for(stack if tagged else None, Name=f"{prefix}-res", **extra)

    def spec(rtype: str) -> list[dict[str, Any]]:
        return [{"ResourceType": rtype, "Tags": tag_list}]

    ec2 = client("ec2")
    made: dict[str, str] = {}
    vpc = ec2.create_vpc(CidrBlock="10.0.0.0/16", TagSpecifications=spec("vpc"))["Vpc"]["VpcId"]
    made["ec2:vpc"] = vpc
    subnet = ec2.create_subnet(VpcId=vpc, CidrBlock="10.0.1.0/24", TagSpecifications=spec("subnet"))["Subnet"][
        "SubnetId"
    ]
    made["ec2:subnet"] = subnet
    sg = ec2.create_security_group(
        GroupName=f"{prefix}-efa", Description="efa", VpcId=vpc, TagSpecifications=spec("security-group")
    )["GroupId"]
    ec2.authorize_security_group_ingress(
        GroupId=sg, IpPermissions=[{"IpProtocol": "-1", "UserIdGroupPairs": [{"GroupId": sg}]}]
    )
    made["ec2:security-group"] = sg
    igw = ec2.create_internet_gateway(TagSpecifications=spec("internet-gateway"))["InternetGateway"][
        "InternetGatewayId"
    ]
    ec2.attach_internet_gateway(InternetGatewayId=igw, VpcId=vpc)
    made["ec2:internet-gateway"] = igw
    eip = ec2.allocate_address(Domain="vpc", TagSpecifications=spec("elastic-ip"))["AllocationId"]
    made["ec2:elastic-ip"] = eip
    nat = ec2.create_nat_gateway(SubnetId=subnet, AllocationId=eip, TagSpecifications=spec("natgateway"))
    made["ec2:natgateway"] = nat["NatGateway"]["NatGatewayId"]
    rt = ec2.create_route_table(VpcId=vpc, TagSpecifications=spec("route-table"))["RouteTable"]["RouteTableId"]
    ec2.associate_route_table(RouteTableId=rt, SubnetId=subnet)
    made["ec2:route-table"] = rt
    endpoint = ec2.create_vpc_endpoint(
        VpcId=vpc,
        VpcEndpointType="Gateway",
        ServiceName="com.amazonaws.us-east-1.s3",
        RouteTableIds=[rt],
        TagSpecifications=spec("vpc-endpoint"),
    )
    made["ec2:vpc-endpoint"] = endpoint["VpcEndpoint"]["VpcEndpointId"]
    lt = ec2.create_launch_template(
        LaunchTemplateName=f"{prefix}-nodes",
        LaunchTemplateData={"ImageId": AMI, "InstanceType": instance_type},
        TagSpecifications=spec("launch-template"),
    )
    made["ec2:launch-template"] = lt["LaunchTemplate"]["LaunchTemplateId"]
    launched: list[dict[str, Any]] = []
    for count, market in ((on_demand, {}), (instances - on_demand, {"MarketType": "spot"})):
        if count > 0:
            launched += ec2.run_instances(
                ImageId=AMI,
                InstanceType=instance_type,
                MinCount=count,
                MaxCount=count,
                SubnetId=subnet,
                SecurityGroupIds=[sg],
                **({"InstanceMarketOptions": market} if market else {}),
                TagSpecifications=spec("instance"),
            )["Instances"]
    for i, inst in enumerate(launched):
        made[f"ec2:instance#{i}"] = inst["InstanceId"]
    volume = ec2.create_volume(
        AvailabilityZone="us-east-1a", Size=20, VolumeType="gp3", TagSpecifications=spec("volume")
    )
    ec2.attach_volume(VolumeId=volume["VolumeId"], InstanceId=launched[0]["InstanceId"], Device="/dev/sdf")
    made["ec2:volume"] = volume["VolumeId"]
    # an EFA-style second interface on the (first) instance
    eni = ec2.create_network_interface(SubnetId=subnet, Groups=[sg], TagSpecifications=spec("network-interface"))
    eni_id = eni["NetworkInterface"]["NetworkInterfaceId"]
    ec2.attach_network_interface(NetworkInterfaceId=eni_id, InstanceId=launched[0]["InstanceId"], DeviceIndex=1)
    made["ec2:network-interface"] = eni_id

    client("autoscaling").create_auto_scaling_group(
        AutoScalingGroupName=f"{prefix}-asg",
        LaunchTemplate={"LaunchTemplateId": made["ec2:launch-template"]},
        MinSize=0,
        MaxSize=1,
        DesiredCapacity=0,
        VPCZoneIdentifier=subnet,
        Tags=[{**t, "PropagateAtLaunch": True} for t in tag_list],
    )
    made["autoscaling:autoScalingGroup"] = f"{prefix}-asg"

    fsx = client("fsx").create_file_system(
        FileSystemType="LUSTRE",
        StorageCapacity=fsx_gib,
        SubnetIds=[subnet],
        LustreConfiguration={"DeploymentType": "PERSISTENT_2", "PerUnitStorageThroughput": 250},
        Tags=tag_list,
    )
    made["fsx:file-system"] = fsx["FileSystem"]["FileSystemId"]

    kv = {t["Key"]: t["Value"] for t in tag_list}
    client("sqs").create_queue(QueueName=f"{prefix}-jobs", tags=kv)
    made["sqs:queue"] = f"{prefix}-jobs"
    client("dynamodb").create_table(
        TableName=f"{prefix}-jobs",
        KeySchema=[{"AttributeName": "job_id", "KeyType": "HASH"}],
        AttributeDefinitions=[{"AttributeName": "job_id", "AttributeType": "S"}],
        BillingMode="PAY_PER_REQUEST",
        Tags=tag_list,
    )
    made["dynamodb:table"] = f"{prefix}-jobs"
    events = client("events")
    events.put_rule(
        Name=f"{prefix}-spot",
        EventPattern=json.dumps({"source": ["aws.ec2"], "detail-type": ["EC2 Spot Instance Interruption Warning"]}),
        Tags=tag_list,
    )
    queue_arn = f"arn:aws:sqs:us-east-1:123456789012:{prefix}-jobs"
    events.put_targets(Rule=f"{prefix}-spot", Targets=[{"Id": "events-queue", "Arn": queue_arn}])
    made["events:rule"] = f"{prefix}-spot"
    iam = client("iam")
    iam.create_role(RoleName=f"{prefix}-node", AssumeRolePolicyDocument=ASSUME_EC2, Tags=tag_list)
    iam.put_role_policy(
        RoleName=f"{prefix}-node",
        PolicyName="queue",
        PolicyDocument=json.dumps(
            {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "sqs:*", "Resource": queue_arn}]}
        ),
    )
    managed = iam.create_policy(
        PolicyName=f"{prefix}-ssm",
        PolicyDocument=json.dumps(
            {
                "Version": "2012-10-17",
                "Statement": [{"Effect": "Allow", "Action": "ssm:UpdateInstanceInformation", "Resource": "*"}],
            }
        ),
    )["Policy"]["Arn"]
    iam.attach_role_policy(RoleName=f"{prefix}-node", PolicyArn=managed)
    iam.create_instance_profile(InstanceProfileName=f"{prefix}-node", Tags=tag_list)
    iam.add_role_to_instance_profile(InstanceProfileName=f"{prefix}-node", RoleName=f"{prefix}-node")
    made["iam:role"] = f"{prefix}-node"
    made["iam:instance-profile"] = f"{prefix}-node"

    s3 = client("s3")
    bucket = f"{prefix}-checkpoints"
    s3.create_bucket(Bucket=bucket)
    s3.put_bucket_versioning(Bucket=bucket, VersioningConfiguration={"Status": "Enabled"})
    if tag_list:
        s3.put_bucket_tagging(Bucket=bucket, Tagging={"TagSet": tag_list})
    for step in (1, 2):  # two versions of one key, and a delete marker
        s3.put_object(Bucket=bucket, Key="ckpt/latest", Body=f"step {step}".encode())
    s3.delete_object(Bucket=bucket, Key="ckpt/latest")
    s3.create_multipart_upload(Bucket=bucket, Key="ckpt/step-3/shard-0")
    made["s3:bucket"] = bucket
    return made


def leave_stack_behind(client: Any, stack: str, **kwargs: Any) -> Leaked:
    """The stack tagged, an untagged twin, and one tagged resource marked keep (a bucket)."""
    leaked = Leaked(ids=make_stack(client, stack, prefix=stack, **kwargs))
    leaked.spared = {k: v for k, v in make_stack(client, stack, prefix=f"{stack}-twin", tagged=False).items()}
    kept = f"{stack}-kept-data"
    client("s3").create_bucket(Bucket=kept)
    client("s3").put_bucket_tagging(Bucket=kept, Tagging={"TagSet": tags_for(stack, **{KEEP_TAG: "true"})})
    leaked.spared["s3:bucket#kept"] = kept
    return leaked
