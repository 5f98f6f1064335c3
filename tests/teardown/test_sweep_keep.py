"""What sweep keeps: the keep tag as people write it, and what a delete would take with it (an Auto
Scaling group's ForceDelete terminates every instance in the group; deleting a role empties the
instance profiles that hold it). Moto server for the AWS side."""

from __future__ import annotations

import datetime as dt

import pytest
from tests.teardown.leaked_stack import AMI, ASSUME_EC2, tags_for

from gpucloud.cluster.tags import STACK_TAG
from gpucloud.teardown.model import Found
from gpucloud.teardown.plan import Selection
from gpucloud.teardown.sweep import sweep

REGION = "us-east-1"
NOW = dt.datetime.now(dt.timezone.utc)

KEPT = [
    ("gpucloud:keep", "true"),
    ("gpucloud:keep", "True"),
    ("gpucloud:keep", " TRUE "),
    ("gpucloud:keep", "yes"),
    ("gpucloud:keep", "1"),
    ("gpucloud:keep", "on"),
    ("gpucloud:keep", ""),  # the key alone: a wish to keep
    ("gpucloud:keep", "please"),  # not a boolean: kept, never guessed away
    ("GPUCloud:Keep", "true"),
    ("GPUCLOUD:KEEP", "Yes"),
    (" gpucloud:keep ", "true"),
]
NOT_KEPT = [
    ("gpucloud:keep", "false"),
    ("gpucloud:keep", "False"),
    ("gpucloud:keep", "no"),
    ("gpucloud:keep", " NO "),
    ("gpucloud:keep", "0"),
    ("gpucloud:keep", "off"),
    ("gpucloud:keeper", "true"),
    ("keep", "true"),
    ("gpucloud:stack", "keep"),
]


def _found(tags: dict[str, str]) -> Found:
    return Found("arn:aws:s3:::b", "s3:bucket", "b", tags)


@pytest.mark.parametrize(("key", "value"), KEPT)
def test_keep_tag_as_people_write_it_keeps(key: str, value: str) -> None:
    assert _found({STACK_TAG: "s", key: value}).keep


@pytest.mark.parametrize(("key", "value"), NOT_KEPT)
def test_false_keep_values_and_other_keys_do_not_keep(key: str, value: str) -> None:
    assert not _found({STACK_TAG: "s", key: value}).keep


def _run_instance(client, subnet: str, tags: dict[str, str]) -> str:
    spec = [{"ResourceType": "instance", "Tags": [{"Key": k, "Value": v} for k, v in tags.items()]}]
    made = client("ec2").run_instances(
        ImageId=AMI, InstanceType="t3.micro", MinCount=1, MaxCount=1, SubnetId=subnet, TagSpecifications=spec
    )
    return made["Instances"][0]["InstanceId"]


def _state(client, instance: str) -> str:
    return client("ec2").describe_instances(InstanceIds=[instance])["Reservations"][0]["Instances"][0]["State"]["Name"]


def _sweep(client, delete: bool):
    return {o.decision.found.ident: o for o in sweep(client, REGION, Selection(stack="ci-7"), delete=delete, now=NOW)}


@pytest.mark.parametrize(
    ("key", "value"), [("gpucloud:keep", "true"), ("GPUCloud:Keep", "yes"), ("gpucloud:keep", "1")]
)
def test_group_force_delete_spares_kept_and_other_stack_instances(client, key: str, value: str) -> None:
    ec2 = client("ec2")
    vpc = ec2.create_vpc(CidrBlock="10.0.0.0/16")["Vpc"]["VpcId"]
    subnet = ec2.create_subnet(VpcId=vpc, CidrBlock="10.0.1.0/24")["Subnet"]["SubnetId"]
    template = ec2.create_launch_template(
        LaunchTemplateName="ci-7-nodes", LaunchTemplateData={"ImageId": AMI, "InstanceType": "t3.micro"}
    )["LaunchTemplate"]["LaunchTemplateId"]
    autoscaling = client("autoscaling")
    autoscaling.create_auto_scaling_group(
        AutoScalingGroupName="ci-7-asg",
        LaunchTemplate={"LaunchTemplateId": template},
        MinSize=0,
        MaxSize=5,
        DesiredCapacity=0,
        VPCZoneIdentifier=subnet,
        Tags=[{**t, "PropagateAtLaunch": True} for t in tags_for("ci-7")],
    )
    kept = _run_instance(client, subnet, {STACK_TAG: "ci-7", key: value})
    foreign = _run_instance(client, subnet, {STACK_TAG: "other-stack"})
    ours = _run_instance(client, subnet, {STACK_TAG: "ci-7"})
    autoscaling.attach_instances(AutoScalingGroupName="ci-7-asg", InstanceIds=[kept, foreign, ours])

    dry = _sweep(client, delete=False)
    assert dry[kept].action == "skip" and dry["ci-7-asg"].action == "would delete"

    done = _sweep(client, delete=True)
    assert done["ci-7-asg"].result == "deleted", done["ci-7-asg"]
    assert done[ours].result in ("deleted", "already gone")
    assert autoscaling.describe_auto_scaling_groups(AutoScalingGroupNames=["ci-7-asg"])["AutoScalingGroups"] == []
    assert _state(client, kept) == "running"
    assert _state(client, foreign) == "running"
    assert _state(client, ours) in ("terminated", "shutting-down")


def test_role_held_by_a_kept_instance_profile_is_left_with_it(client) -> None:
    iam = client("iam")
    iam.create_role(RoleName="ci-7-node", AssumeRolePolicyDocument=ASSUME_EC2, Tags=tags_for("ci-7"))
    iam.create_instance_profile(InstanceProfileName="ci-7-kept", Tags=tags_for("ci-7", **{"gpucloud:keep": "yes"}))
    iam.add_role_to_instance_profile(InstanceProfileName="ci-7-kept", RoleName="ci-7-node")
    iam.create_role(RoleName="ci-7-free", AssumeRolePolicyDocument=ASSUME_EC2, Tags=tags_for("ci-7"))
    iam.create_instance_profile(InstanceProfileName="ci-7-free", Tags=tags_for("ci-7"))
    iam.add_role_to_instance_profile(InstanceProfileName="ci-7-free", RoleName="ci-7-free")

    dry = _sweep(client, delete=False)
    assert dry["ci-7-node"].action == "skip"
    assert dry["ci-7-node"].result == "skipped: held by instance profile ci-7-kept, which sweep keeps"

    done = _sweep(client, delete=True)
    assert done["ci-7-free"].result == "deleted"
    profile = iam.get_instance_profile(InstanceProfileName="ci-7-kept")["InstanceProfile"]
    assert [r["RoleName"] for r in profile["Roles"]] == ["ci-7-node"]
