"""Every shipped stack, planned under Pulumi mocks: the inputs that make a cluster correct and secure."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpucloud.cluster.tags import CLUSTER_TAG, STACK_TAG, UNTAGGABLE_TYPES
from gpucloud.infra.preview import RecordedResource, StackPreview

LT = "aws:ec2/launchTemplate:LaunchTemplate"
ASG = "aws:autoscaling/group:Group"
HOOK = "aws:autoscaling/lifecycleHook:LifecycleHook"
PG = "aws:ec2/placementGroup:PlacementGroup"
SG = "aws:ec2/securityGroup:SecurityGroup"
INGRESS = "aws:vpc/securityGroupIngressRule:SecurityGroupIngressRule"
EGRESS = "aws:vpc/securityGroupEgressRule:SecurityGroupEgressRule"
QUEUE = "aws:sqs/queue:Queue"
RULE = "aws:cloudwatch/eventRule:EventRule"
TARGET = "aws:cloudwatch/eventTarget:EventTarget"
FSX = "aws:fsx/lustreFileSystem:LustreFileSystem"
DRA = "aws:fsx/dataRepositoryAssociation:DataRepositoryAssociation"

SHIPPED = ("dev", "p4d-spot", "p5-capacity-block")
stacks = pytest.mark.parametrize("stack", SHIPPED)


def one(preview: StackPreview, type_token: str, name_suffix: str = "") -> RecordedResource:
    found = [r for r in preview.of_type(type_token) if r.name.endswith(name_suffix)]
    assert len(found) == 1, (type_token, name_suffix, [r.name for r in found])
    return found[0]


@stacks
def test_launch_templates_are_secure(previews, stack: str) -> None:
    for lt in previews[stack].of_type(LT):
        i = lt.inputs
        assert i["metadataOptions"] == {
            "httpEndpoint": "enabled",
            "httpTokens": "required",
            "httpPutResponseHopLimit": 2,
        }
        assert "vpcSecurityGroupIds" not in i  # interfaces carry the groups
        root = i["blockDeviceMappings"][0]["ebs"]
        assert (root["encrypted"], root["volumeType"]) == ("true", "gp3")
        assert {t["resourceType"] for t in i["tagSpecifications"]} == {"instance", "volume", "network-interface"}
        for spec in i["tagSpecifications"]:
            assert spec["tags"][STACK_TAG] == stack
        for nic in i["networkInterfaces"]:
            assert nic["securityGroups"] == [f"{previews[stack].cluster}-security-nodes-id"]
            assert nic.get("associatePublicIpAddress") in (None, "false")
            if nic["interfaceType"] == "efa-only":
                assert not {k for k in nic if "Ip" in k or "ipv" in k.lower()}, nic


def test_p5_capacity_block_launch_template(previews) -> None:
    preview = previews["p5-capacity-block"]
    lt = one(preview, LT).inputs
    nics = lt["networkInterfaces"]
    assert len(nics) == 33 and sum(n["interfaceType"] == "efa-only" for n in nics) == 32
    assert sorted({n["networkCardIndex"] for n in nics}) == list(range(32))
    # the current EC2 guide: ENA primary at 0/0, EFA-only at 0/1, then EFA-only at device 0 of cards 1-31
    layout = [(n["networkCardIndex"], n["deviceIndex"], n["interfaceType"]) for n in nics]
    assert layout[:2] == [(0, 0, "interface"), (0, 1, "efa-only")]
    assert layout[2:] == [(card, 0, "efa-only") for card in range(1, 32)]
    assert lt["instanceMarketOptions"] == {"marketType": "capacity-block"}
    assert lt["capacityReservationSpecification"]["capacityReservationTarget"] == {
        "capacityReservationId": "cr-0a1b2c3d4e5f60718"
    }
    assert "placement" not in lt and not preview.of_type(PG)  # a capacity block brings its own placement
    asg = one(preview, ASG).inputs
    assert "mixedInstancesPolicy" not in asg and asg["launchTemplate"]["version"] == "1"
    assert asg["capacityRebalance"] is False
    assert (asg["minSize"], asg["desiredCapacity"], asg["maxSize"]) == (2, 2, 2)


def test_p4d_spot_asg(previews) -> None:
    preview = previews["p4d-spot"]
    lt = one(preview, LT).inputs
    assert "instanceMarketOptions" not in lt  # spot is chosen by the mixed instances policy
    # AWS documents no EFA-only layout for p4d: a combined EFA on each of the 4 cards
    nics = [(n["networkCardIndex"], n["deviceIndex"], n["interfaceType"]) for n in lt["networkInterfaces"]]
    assert nics == [(0, 0, "efa"), (1, 1, "efa"), (2, 1, "efa"), (3, 1, "efa")]
    pg = one(preview, PG)
    assert pg.inputs["strategy"] == "cluster"
    assert lt["placement"] == {"groupName": pg.name}
    asg = one(preview, ASG).inputs
    assert asg["placementGroup"] == pg.name
    assert len(asg["vpcZoneIdentifiers"]) == 1  # EFA: one subnet, one AZ
    mix = asg["mixedInstancesPolicy"]
    assert mix["instancesDistribution"] == {
        "onDemandBaseCapacity": 1,
        "onDemandPercentageAboveBaseCapacity": 0,
        "spotAllocationStrategy": "price-capacity-optimized",
    }
    assert mix["launchTemplate"]["overrides"] == [{"instanceType": "p4d.24xlarge"}]
    assert asg["capacityRebalance"] is True and "launchTemplate" not in asg


def test_dev_is_small_and_cheap(previews) -> None:
    preview = previews["dev"]
    asg = one(preview, ASG).inputs
    assert (
        asg["maxSize"] <= 2
        and asg["mixedInstancesPolicy"]["instancesDistribution"]["spotAllocationStrategy"] == "price-capacity-optimized"
    )
    assert one(preview, LT).inputs["networkInterfaces"] == [
        {
            "interfaceType": "interface",
            "networkCardIndex": 0,
            "deviceIndex": 0,
            "deleteOnTermination": "true",
            "associatePublicIpAddress": "false",
            "securityGroups": ["dev-security-nodes-id"],
        }
    ]
    assert not preview.of_type(FSX) and not preview.of_type(PG)
    assert preview.cost.on_demand.max is not None and preview.cost.on_demand.max < 5


@stacks
def test_every_asg_has_the_drain_hook_and_propagated_tags(previews, stack: str) -> None:
    for asg in previews[stack].of_type(ASG):
        hooks = [h.inputs for h in previews[stack].of_type(HOOK) if h.inputs["autoscalingGroupName"] == asg.name]
        assert [(h["name"], h["lifecycleTransition"], h["defaultResult"]) for h in hooks] == [
            ("gpucloud-drain", "autoscaling:EC2_INSTANCE_TERMINATING", "CONTINUE")
        ]
        # applied at creation only, so not used: a new drain timeout must reach the hook
        assert "initialLifecycleHooks" not in asg.inputs
        tags = {t["key"]: t for t in asg.inputs["tags"]}
        assert tags[STACK_TAG]["value"] == stack and CLUSTER_TAG in tags
        assert all(t["propagateAtLaunch"] is True for t in tags.values())


@stacks
def test_every_taggable_resource_carries_stack_and_cluster(previews, stack: str) -> None:
    preview = previews[stack]
    for r in preview.custom_resources:
        if r.type in UNTAGGABLE_TYPES or r.type == ASG:
            continue
        assert r.inputs.get("tags", {}).get(STACK_TAG) == stack, r.name
        assert r.inputs["tags"][CLUSTER_TAG] == preview.cluster, r.name


@stacks
def test_every_resource_sits_in_a_component(previews, stack: str) -> None:
    for r in previews[stack].custom_resources:
        assert r.parent is not None and r.parent.split("::")[2].split("$")[-1].startswith("gpucloud:"), r.name


@stacks
def test_security_groups(previews, stack: str) -> None:
    preview = previews[stack]
    nodes = f"{preview.cluster}-security-nodes-id"
    ingress, egress = preview.of_type(INGRESS), preview.of_type(EGRESS)
    assert any(
        r.inputs["securityGroupId"] == nodes
        and r.inputs.get("referencedSecurityGroupId") == nodes
        and r.inputs["ipProtocol"] == "-1"
        for r in ingress
    )
    assert any(
        r.inputs["securityGroupId"] == nodes
        and r.inputs.get("referencedSecurityGroupId") == nodes
        and r.inputs["ipProtocol"] == "-1"
        for r in egress
    )
    for r in ingress:
        assert r.inputs.get("cidrIpv4") != "0.0.0.0/0" and r.inputs.get("cidrIpv6") != "::/0"
    for sg in preview.of_type(SG):
        assert "ingress" not in sg.inputs  # rules are separate resources
    lustre = [r for r in ingress if r.inputs.get("fromPort") == 988]
    assert bool(lustre) == (stack != "dev")


@pytest.mark.parametrize("stack", ["p4d-spot", "p5-capacity-block"])
def test_fsx_persistent_2_linked_to_the_bucket(previews, stack: str) -> None:
    preview = previews[stack]
    fsx = one(preview, FSX).inputs
    assert fsx["deploymentType"] == "PERSISTENT_2" and fsx["perUnitStorageThroughput"] in (125, 250, 500, 1000)
    assert fsx["subnetIds"] == f"{stack}-network-nodes-id"
    assert fsx["securityGroupIds"] == [f"{stack}-security-lustre-id"]
    dra = one(preview, DRA).inputs
    assert dra["fileSystemId"] == "fs-0123456789abcdef0"
    assert dra["dataRepositoryPath"] == f"s3://{stack}-checkpoints-bucket/checkpoints/"
    assert dra["s3"]["autoExportPolicy"]["events"] == ["NEW", "CHANGED", "DELETED"]


@stacks
def test_checkpoint_bucket(previews, stack: str) -> None:
    preview = previews[stack]
    bucket = f"{preview.cluster}-checkpoints-bucket"
    versioning = one(preview, "aws:s3/bucketVersioning:BucketVersioning").inputs
    assert versioning == {"bucket": bucket, "versioningConfiguration": {"status": "Enabled"}}
    sse = one(preview, "aws:s3/bucketServerSideEncryptionConfiguration:BucketServerSideEncryptionConfiguration")
    assert sse.inputs["rules"][0]["applyServerSideEncryptionByDefault"]["sseAlgorithm"] == "AES256"
    block = one(preview, "aws:s3/bucketPublicAccessBlock:BucketPublicAccessBlock").inputs
    assert all(
        block[k] is True for k in ("blockPublicAcls", "blockPublicPolicy", "ignorePublicAcls", "restrictPublicBuckets")
    )
    policy = json.loads(one(preview, "aws:s3/bucketPolicy:BucketPolicy").inputs["policy"])
    deny = policy["Statement"][0]
    assert deny["Effect"] == "Deny" and deny["Condition"] == {"Bool": {"aws:SecureTransport": "false"}}
    assert deny["Resource"] == [f"arn:aws:s3:::{bucket}", f"arn:aws:s3:::{bucket}/*"]
    rules = one(preview, "aws:s3/bucketLifecycleConfiguration:BucketLifecycleConfiguration").inputs["rules"]
    assert rules[0]["noncurrentVersionExpiration"]["noncurrentDays"] >= 1


@stacks
def test_job_plane(previews, stack: str) -> None:
    preview = previews[stack]
    c = preview.cluster
    queues = {r.name: r.inputs for r in preview.of_type(QUEUE)}
    assert set(queues) == {
        f"{c}-jobplane-jobs",
        f"{c}-jobplane-jobs-dlq",
        f"{c}-jobplane-events",
        f"{c}-jobplane-events-dlq",
    }
    redrive = json.loads(queues[f"{c}-jobplane-jobs"]["redrivePolicy"])
    assert redrive == {
        "deadLetterTargetArn": f"arn:aws:sqs:us-east-1:123456789012:{c}-jobplane-jobs-dlq",
        "maxReceiveCount": 5,
    }
    assert all(q["sqsManagedSseEnabled"] for q in queues.values())
    table = one(preview, "aws:dynamodb/table:Table").inputs
    assert table["pointInTimeRecovery"] == {"enabled": True} and table["serverSideEncryption"] == {"enabled": True}

    rules = {
        r.name.rsplit("-interruptions-", 1)[1]: json.loads(r.inputs["eventPattern"]) for r in preview.of_type(RULE)
    }
    assert rules["spot-warning"]["detail-type"] == ["EC2 Spot Instance Interruption Warning"]
    assert rules["rebalance"]["detail-type"] == ["EC2 Instance Rebalance Recommendation"]
    assert rules["asg-terminate"]["detail-type"] == ["EC2 Instance-terminate Lifecycle Action"]
    assert rules["asg-terminate"]["detail"]["AutoScalingGroupName"] == [r.name for r in preview.of_type(ASG)]
    events_arn = f"arn:aws:sqs:us-east-1:123456789012:{c}-jobplane-events"
    targets = preview.of_type(TARGET)
    from gpucloud.spec import load_stack_file, stack_file_for

    groups = load_stack_file(stack_file_for(stack)).node_groups
    blocks = [g.capacity.reservation_id for g in groups if g.capacity.type == "capacity-block"]
    if blocks:  # this cluster's blocks only: the warning is account-wide
        assert rules["capacity-block-expiry"]["detail-type"][0] == "Capacity Block Reservation Expiration Warning"
        assert rules["capacity-block-expiry"]["detail"] == {"capacity-reservation-id": blocks}
    else:
        assert "capacity-block-expiry" not in rules
    assert len(targets) == 3 + bool(blocks) and all(t.inputs["arn"] == events_arn for t in targets)
    policy = json.loads(one(preview, "aws:sqs/queuePolicy:QueuePolicy").inputs["policy"])["Statement"][0]
    assert policy["Principal"] == {"Service": "events.amazonaws.com"} and policy["Resource"] == events_arn
    assert sorted(policy["Condition"]["ArnEquals"]["aws:SourceArn"]) == sorted(
        f"arn:aws:events:us-east-1:123456789012:rule/{r.name}" for r in preview.of_type(RULE)
    )


@stacks
def test_iam_scoped_to_the_cluster(previews, stack: str) -> None:
    preview = previews[stack]
    role = one(preview, "aws:iam/role:Role", "-node-role").inputs  # the monitor's: tests/infra/test_monitoring.py
    assert json.loads(role["assumeRolePolicy"])["Statement"][0]["Principal"] == {"Service": "ec2.amazonaws.com"}
    ssm = one(preview, "aws:iam/rolePolicyAttachment:RolePolicyAttachment", "-node-ssm").inputs
    assert ssm["policyArn"] == "arn:aws:iam::aws:policy/AmazonSSMManagedInstanceCore"
    document = json.loads(one(preview, "aws:iam/rolePolicy:RolePolicy", "-node-access").inputs["policy"])
    known = {r.name for r in preview.custom_resources}
    for statement in document["Statement"]:
        assert all("*" not in action for action in statement["Action"])
        if statement["Sid"] in {"FindOwnGroup", "PublishBacklog", "FindInstances"}:
            continue  # only on "*"
        if statement["Sid"] == "JobTags":  # this cluster's instances, volumes, interfaces (test_node_iam.py)
            assert statement["Condition"]["ForAllValues:StringEquals"] == {"aws:TagKeys": ["gpucloud:job-id"]}
            continue
        if statement["Sid"] == "BootstrapFailedTag":  # this cluster's instances (test_bootstrap_failure.py)
            assert statement["Condition"]["StringEquals"] == {"aws:ResourceTag/gpucloud:cluster": preview.cluster}
            continue
        if statement["Sid"] in {"NodeLifecycle", "DrainOnTermination", "MarkBlockEnding"}:  # this stack's groups only
            assert statement["Condition"]["StringEquals"]["autoscaling:ResourceTag/gpucloud:stack"] == stack
            continue
        if statement["Sid"] == "AgentPackage":  # outside the stack: exactly the wheel its agent.package names
            assert statement["Resource"] == ["arn:aws:s3:::" + load_agent_package(stack).removeprefix("s3://")]
            assert statement["Action"] == ["s3:GetObject"]
            continue
        for arn in statement["Resource"]:
            assert arn != "*"
            named = _resource_name(arn)
            assert named in known, arn  # every ARN is one of this stack's own resources
    profile = one(preview, "aws:iam/instanceProfile:InstanceProfile", "-node-profile")
    assert one(preview, LT).inputs["iamInstanceProfile"]["arn"].endswith(f"instance-profile/{profile.name}")


@stacks
def test_network_has_no_public_nodes(previews, stack: str) -> None:
    preview = previews[stack]
    for subnet in preview.of_type("aws:ec2/subnet:Subnet"):
        assert subnet.inputs["mapPublicIpOnLaunch"] is False
    endpoints = {r.inputs["serviceName"] for r in preview.of_type("aws:ec2/vpcEndpoint:VpcEndpoint")}
    assert "com.amazonaws.us-east-1.s3" in endpoints
    nodes = one(preview, "aws:ec2/subnet:Subnet", "-network-nodes").inputs
    assert nodes["availabilityZone"] == load_az(stack)


def _resource_name(arn: str) -> str:
    tail = arn.split(":")[-1]
    if arn.startswith("arn:aws:s3:::"):
        return tail.split("/")[0]  # bucket or bucket/*
    parts = tail.split("/")
    return parts[1] if len(parts) > 1 else parts[0]  # table/x[/index/*], autoScalingGroupName/x, queue


def load_az(stack: str) -> str:
    from gpucloud.spec import load_stack_file, stack_file_for

    spec = load_stack_file(stack_file_for(stack))
    return spec.availability_zone or spec.availability_zones[0]


def load_agent_package(stack: str) -> str:
    from gpucloud.spec import load_stack_file, stack_file_for

    package = load_stack_file(stack_file_for(stack)).agent.package
    assert package is not None
    return package


@stacks
def test_ami_comes_from_the_dlami_parameter(previews, stack: str) -> None:
    calls = [c for c in previews[stack].invokes if c.token == "aws:ssm/getParameter:getParameter"]
    # the self-hosted monitor boots Ubuntu (tests/infra/test_monitoring.py); the nodes the DLAMI
    calls = [c for c in calls if not c.args["name"].startswith("/aws/service/canonical/")]
    assert [c.args["name"] for c in calls] == [
        "/aws/service/deeplearning/ami/x86_64/base-oss-nvidia-driver-gpu-ubuntu-22.04/latest/ami-id"
    ]
    assert one(previews[stack], LT).inputs["imageId"] == "ami-0123456789abcdef0"


@stacks
def test_user_data_carries_the_node_settings(previews, stack: str) -> None:
    import base64

    preview = previews[stack]
    text = base64.b64decode(one(preview, LT).inputs["userData"]).decode()
    assert (
        f"GPUCLOUD_JOB_QUEUE_URL=https://sqs.us-east-1.amazonaws.com/123456789012/{preview.cluster}-jobplane-jobs"
        in text
    )
    assert ("GPUCLOUD_FSX_DNS=fs-0123456789abcdef0.fsx.us-east-1.amazonaws.com" in text) == (stack != "dev")
    expected_efa = {"dev": 0, "p4d-spot": 4, "p5-capacity-block": 32}[stack]
    assert f"GPUCLOUD_EFA_INTERFACES={expected_efa}" in text
    assert (
        f"GPUCLOUD_EVENTS_QUEUE_URL=https://sqs.us-east-1.amazonaws.com/123456789012/{preview.cluster}-jobplane-events"
        in text
    )  # the agents' queue mode
    [hook] = [h.inputs for h in preview.of_type(HOOK)]
    assert f"GPUCLOUD_LIFECYCLE_TIMEOUT={int(hook['heartbeatTimeout'])}" in text  # the dead-agent handler's deadline
    assert "gpucloud-agent.service" in text


def test_preview_json_shape(previews) -> None:
    data = json.loads(json.dumps(previews["p4d-spot"].to_json()))
    assert {"type", "name", "inputs"} <= set(data["resources"][0])
    assert data["efa_layout"][0]["efa_interfaces"] == 4
    assert set(data["cost"]) >= {"on_demand", "spot_estimate", "as_configured", "groups"}


@pytest.mark.parametrize("stack", ["p4d-spot", "p5-capacity-block"])
def test_the_guides_table_says_each_shipped_stacks_interface_layout(previews, stack: str) -> None:
    """docs/cluster-as-code.md's "Shipped stacks" row names the layout the stack builds: combined EFA
    interfaces for legacy (p4d), EFA-only beside an ENA primary for efa-only (p5)."""
    guide = (Path(__file__).resolve().parents[2] / "docs" / "cluster-as-code.md").read_text()
    [row] = [line for line in guide.splitlines() if line.startswith(f"| `{stack}` |")]
    nics = row.split("|")[4]
    (lt,) = previews[stack].of_type(LT)
    kinds = {nic["interfaceType"] for nic in lt.inputs["networkInterfaces"]}
    efa = sum(nic["interfaceType"] in ("efa", "efa-only") for nic in lt.inputs["networkInterfaces"])
    if kinds == {"efa"}:
        assert f"{efa} combined EFA" in nics and "EFA-only" not in nics.replace("no EFA-only layout", "")
    else:
        assert kinds == {"interface", "efa-only"} and f"{efa} EFA-only + ENA primary" in nics


@pytest.mark.parametrize("stack", ["p4d-spot", "p5-capacity-block"])
def test_node_groups_wait_for_the_fsx_link_to_the_bucket(previews, stack: str) -> None:
    """The file system mounts before its data repository association exists; a node must not boot
    onto a /fsx path that is not linked to the bucket yet."""
    [association] = previews[stack].of_type("aws:fsx/dataRepositoryAssociation:DataRepositoryAssociation")
    for asg in previews[stack].of_type(ASG):
        assert association.urn in asg.options.depends_on
