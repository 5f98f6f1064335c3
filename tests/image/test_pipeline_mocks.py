"""The image pipeline component under Pulumi mocks, with the policy pack applied to what it registers."""

from __future__ import annotations

import dataclasses
import json

import pulumi
import pytest

from gpucloud.catalog import Catalog, load_catalog
from gpucloud.cluster.tags import CLUSTER_TAG, STACK_TAG, UNTAGGABLE_TYPES, Tagging
from gpucloud.errors import UserError
from gpucloud.image.matrix import load_matrix
from gpucloud.infra.image import ImagePipeline, ImagePipelineArgs, plan_image_pipeline
from gpucloud.infra.preview import RecordedResource, mocked_runtime, recorded_resources
from gpucloud.policy.runner import run_policies

from .conftest import SHIPPED_MATRIX, matrix_with

STACK = "p5-image"
WHEEL = "s3://acme-artifacts/wheels/gpucloud-0.1.0-py3-none-any.whl"
IB = "aws:imagebuilder/"


def _args(matrix, **overrides) -> ImagePipelineArgs:
    values = dict(
        tagging=Tagging(stack=STACK, cluster="acme-p5"),
        matrix=matrix,
        subnet_id="subnet-0abc",
        security_group_ids=["sg-0abc"],
        gpucloud_wheel_s3_uri=WHEEL,
    )
    values.update(overrides)
    return ImagePipelineArgs(**values)


def record(args: ImagePipelineArgs) -> list[RecordedResource]:
    @pulumi.runtime.test
    def run() -> None:
        ImagePipeline("image", args)

    with mocked_runtime(STACK, "us-east-1") as (_, monitor):
        run()
    return recorded_resources(monitor)


@pytest.fixture(scope="module")
def resources() -> list[RecordedResource]:
    return record(_args(load_matrix(SHIPPED_MATRIX), schedule_expression="cron(0 6 ? * mon *)"))


def _one(resources, type_suffix):
    found = [r for r in resources if r.type.endswith(type_suffix)]
    assert len(found) == 1, [r.type for r in resources]
    return found[0]


def test_components_carry_the_rendered_documents(resources):
    components = [r for r in resources if r.type == f"{IB}component:Component"]
    assert len(components) == 8
    for component in components:
        assert component.inputs["platform"] == "Linux"
        assert component.inputs["version"] == "1.0.0"
        assert component.inputs["data"].startswith("name: gpucloud-")
        assert component.inputs["name"].startswith("acme-p5-")  # cluster + layer + content digest
    assert all(r.parent and "gpucloud:image:ImagePipeline" in r.parent for r in resources if r.custom)


def test_recipe_orders_layers_and_encrypts_the_root_volume(resources):
    recipe = _one(resources, "imageRecipe:ImageRecipe").inputs
    assert recipe["parentImage"].startswith("ssm:/aws/service/canonical/ubuntu/server/24.04/")
    assert len(recipe["components"]) == 8
    pytorch = recipe["components"][-1]
    assert {p["name"]: p["value"] for p in pytorch["parameters"]} == {
        "GpucloudWheelS3Uri": WHEEL,
        "GpucloudWheelFile": "gpucloud-0.1.0-py3-none-any.whl",
    }
    assert all("parameters" not in c for c in recipe["components"][:-1])
    ebs = recipe["blockDeviceMappings"][0]["ebs"]
    assert recipe["blockDeviceMappings"][0]["deviceName"] == "/dev/sda1"
    assert ebs["encrypted"] == "true" and ebs["volumeType"] == "gp3" and ebs["volumeSize"] == 100


def test_build_instance_has_a_gpu_imdsv2_and_a_profile(resources):
    infra = _one(resources, "infrastructureConfiguration:InfrastructureConfiguration").inputs
    assert infra["instanceTypes"] == ["g5.2xlarge"]
    assert infra["instanceMetadataOptions"] == {"httpTokens": "required", "httpPutResponseHopLimit": 1}
    assert infra["terminateInstanceOnFailure"] is True
    profile = _one(resources, "instanceProfile:InstanceProfile")
    assert infra["instanceProfileName"] == profile.name  # the mock names auto-named resources by logical name
    attachments = [
        r.inputs["policyArn"] for r in resources if r.type.endswith("rolePolicyAttachment:RolePolicyAttachment")
    ]
    assert sorted(a.rsplit("/", 1)[-1] for a in attachments) == [
        "AmazonSSMManagedInstanceCore",
        "EC2InstanceProfileForImageBuilder",
    ]
    inline = json.loads(_one(resources, "rolePolicy:RolePolicy").inputs["policy"])
    assert inline["Statement"] == [
        {
            "Sid": "ReadGpucloudWheel",
            "Effect": "Allow",
            "Action": ["s3:GetObject"],
            "Resource": ["arn:aws:s3:::acme-artifacts/wheels/gpucloud-0.1.0-py3-none-any.whl"],
        }
    ]


def test_distribution_writes_the_ami_id_to_ssm(resources):
    dist = _one(resources, "distributionConfiguration:DistributionConfiguration").inputs["distributions"][0]
    assert dist["region"] == "us-east-1"
    assert dist["ssmParameterConfigurations"] == [
        {"parameterName": "/gpucloud/p5-image/ami-id", "dataType": "aws:ec2:image"}
    ]
    assert "{{ imagebuilder:buildDate }}" in dist["amiDistributionConfiguration"]["name"]
    assert dist["amiDistributionConfiguration"]["amiTags"][STACK_TAG] == STACK


def test_pipeline_wires_recipe_infrastructure_distribution_and_tests(resources):
    pipeline = _one(resources, "imagePipeline:ImagePipeline").inputs
    assert pipeline["imageTestsConfiguration"] == {"imageTestsEnabled": True, "timeoutMinutes": 120}
    assert pipeline["schedule"]["scheduleExpression"] == "cron(0 6 ? * mon *)"
    for key in ("imageRecipeArn", "infrastructureConfigurationArn", "distributionConfigurationArn"):
        assert pipeline[key].startswith("arn:aws:imagebuilder:")


def test_every_taggable_resource_is_tagged_with_stack_and_cluster(resources):
    for r in resources:
        if r.custom and r.type not in UNTAGGABLE_TYPES:
            assert r.inputs["tags"][STACK_TAG] == STACK, r.type
            assert r.inputs["tags"][CLUSTER_TAG] == "acme-p5", r.type


def test_policy_pack_finds_nothing(resources):
    violations = run_policies(resources, stack=STACK)
    assert [v.describe() for v in violations] == []


def test_policy_pack_would_catch_an_unencrypted_recipe(resources):
    # The pack really inspects these inputs: flip encryption off in a copy and it must object.
    recipe = _one(resources, "imageRecipe:ImageRecipe")
    inputs = json.loads(json.dumps(recipe.inputs))
    inputs["blockDeviceMappings"][0]["ebs"]["encrypted"] = "false"
    tampered = dataclasses.replace(recipe, inputs=inputs)
    assert any("not encrypted" in v.message for v in run_policies([tampered], stack=STACK))


def test_plan_refuses_a_broken_matrix():
    with pytest.raises(
        UserError, match=r"image matrix fails 'driver meets the CUDA toolkit's minimum driver': driver 570.124.06"
    ):
        plan_image_pipeline(_args(matrix_with(nvidia_driver="570.124.06")))


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"build_instance_types": ["g5.2xlarge", "m5.large"]}, "unknown instance type 'm5.large'"),
        ({"build_instance_types": []}, "build_instance_types is empty"),
        ({"schedule_expression": "every monday"}, "must be cron"),
        ({"root_volume_gib": 20}, "root volume 20 GiB must be 40..16384"),
        ({"gpucloud_wheel_s3_uri": "s3://b/gpucloud-0.0.9-py3-none-any.whl"}, "does not match the matrix pin"),
    ],
)
def test_plan_refuses_bad_arguments(overrides, message):
    with pytest.raises(UserError, match=message):
        plan_image_pipeline(_args(load_matrix(SHIPPED_MATRIX), **overrides))


def test_plan_refuses_a_build_instance_without_gpu():
    base = load_catalog()
    cpu = base.instance_types["g5.2xlarge"].model_copy(update={"name": "c7i.2xlarge", "gpus": 0, "gpu_model": ""})
    catalog = Catalog(**{**base.model_dump(), "instance_types": {**base.instance_types, "c7i.2xlarge": cpu}})
    with pytest.raises(UserError, match="'c7i.2xlarge' has no GPU"):
        plan_image_pipeline(_args(load_matrix(SHIPPED_MATRIX), build_instance_types=["c7i.2xlarge"]), catalog)
