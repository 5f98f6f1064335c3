"""The GPU image pipeline: EC2 Image Builder builds the AMI from ``images/`` and publishes its id
to an SSM parameter that cluster stacks read.

``plan_image_pipeline`` is pure (names, versions, parameter values, and the checks that refuse a
build before any money is spent: a matrix that fails ``gpucloud image check``, a build instance
without a GPU); ``ImagePipeline`` only wires resources from that plan.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
from collections.abc import Sequence
from pathlib import Path

import pulumi
import pulumi_aws as aws

from gpucloud.catalog import Catalog, get_instance_type
from gpucloud.cluster.tags import Tagging
from gpucloud.errors import UserError
from gpucloud.image.matrix import VersionMatrix
from gpucloud.image.render import (
    RenderedComponent,
    default_image_dir,
    parent_image,
    render_components,
    wheel_parameters,
)
from gpucloud.image.rules import check_matrix, failed

# AWS managed policies Image Builder documents for its build instances (AWSTOE needs SSM to run).
BUILDER_MANAGED_POLICIES = ("policy/EC2InstanceProfileForImageBuilder", "policy/AmazonSSMManagedInstanceCore")
COMPONENT_VERSION = "1.0.0"  # content changes get a new component name (digest), not a new version
ROOT_DEVICE = "/dev/sda1"  # Ubuntu AMIs
_CRON = re.compile(r"^cron\(.+\)$|^rate\(.+\)$")


def default_ami_parameter(stack: str) -> str:
    """The SSM parameter cluster stacks read the AMI id from (``ami: {ssm_parameter: ...}``)."""
    return f"/gpucloud/{stack}/ami-id"


@dataclasses.dataclass
class ImagePipelineArgs:
    tagging: Tagging
    matrix: VersionMatrix
    subnet_id: pulumi.Input[str]  # a private subnet with egress to NVIDIA, PyPI, EFA and FSx repositories
    security_group_ids: Sequence[pulumi.Input[str]]
    gpucloud_wheel_s3_uri: str  # s3://bucket/key/gpucloud-<version>-py3-none-any.whl, uploaded before a build
    build_instance_types: Sequence[str] = ("g5.2xlarge",)  # any GPU type: validate needs a GPU to see
    ami_parameter_name: str | None = None  # default: /gpucloud/<stack>/ami-id
    schedule_expression: str | None = None  # e.g. "cron(0 6 ? * mon *)"; None: build on demand
    root_volume_gib: int = 100
    kms_key_id: str | None = None  # encrypts the build volume and the AMI snapshots (default: aws/ebs)
    image_dir: Path = dataclasses.field(default_factory=default_image_dir)
    test_timeout_minutes: int = 120


@dataclasses.dataclass(frozen=True)
class PlannedComponent:
    layer: str  # "20-nvidia-driver"
    resource_name: str  # Image Builder component name, unique per content
    rendered: RenderedComponent
    parameters: dict[str, str]


@dataclasses.dataclass(frozen=True)
class ImagePipelinePlan:
    components: list[PlannedComponent]
    recipe_name: str
    parent_image: str
    ami_parameter_name: str
    ami_name: str
    wheel_bucket: str
    wheel_key: str


def plan_image_pipeline(args: ImagePipelineArgs, catalog: Catalog | None = None) -> ImagePipelinePlan:
    bad = failed(check_matrix(args.matrix))
    if bad:
        raise UserError(f"image matrix fails '{bad[0].rule}': {bad[0].detail} (run gpucloud image check)")
    for instance_type in args.build_instance_types:
        if get_instance_type(instance_type, catalog).gpus == 0:
            raise UserError(f"build instance type {instance_type!r} has no GPU; the validate phase must see one")
    if not args.build_instance_types:
        raise UserError("build_instance_types is empty; give at least one GPU instance type")
    if args.schedule_expression is not None and not _CRON.fullmatch(args.schedule_expression):
        raise UserError(f"schedule {args.schedule_expression!r} must be cron(...) or rate(...)")
    if not 40 <= args.root_volume_gib <= 16384:
        raise UserError(f"root volume {args.root_volume_gib} GiB must be 40..16384 (CUDA and PyTorch need ~30)")

    wheel = wheel_parameters(args.matrix, args.gpucloud_wheel_s3_uri)
    bucket, _, key = args.gpucloud_wheel_s3_uri.removeprefix("s3://").partition("/")
    cluster = args.tagging.cluster
    components = []
    for rendered in render_components(args.matrix, args.image_dir):
        layer = rendered.name.removeprefix("gpucloud-")
        components.append(
            PlannedComponent(
                layer=layer,
                resource_name=f"{cluster}-{layer}-{rendered.digest}",
                rendered=rendered,
                parameters={p: wheel[p] for p in rendered.parameters},
            )
        )
    recipe_digest = hashlib.sha256("".join(c.rendered.digest for c in components).encode()).hexdigest()[:10]
    return ImagePipelinePlan(
        components=components,
        recipe_name=f"{cluster}-gpu-{recipe_digest}",
        parent_image=parent_image(args.matrix),
        ami_parameter_name=args.ami_parameter_name or default_ami_parameter(args.tagging.stack),
        ami_name=f"{cluster}-gpu-{{{{ imagebuilder:buildDate }}}}",
        wheel_bucket=bucket,
        wheel_key=key,
    )


def builder_policy_document(partition: str, wheel_bucket: str, wheel_key: str) -> dict:
    """What the build instance needs beyond the managed policies: read the one gpucloud wheel."""
    return {
        "Version": "2012-10-17",
        "Statement": [
            {
                "Sid": "ReadGpucloudWheel",
                "Effect": "Allow",
                "Action": ["s3:GetObject"],
                "Resource": [f"arn:{partition}:s3:::{wheel_bucket}/{wheel_key}"],
            }
        ],
    }


class ImagePipeline(pulumi.ComponentResource):
    """Image Builder components, recipe, infrastructure, distribution (AMI id -> SSM) and pipeline."""

    ami_parameter_name: str
    pipeline: aws.imagebuilder.ImagePipeline

    def __init__(
        self,
        name: str,
        args: ImagePipelineArgs,
        opts: pulumi.ResourceOptions | None = None,
        catalog: Catalog | None = None,
    ) -> None:
        super().__init__("gpucloud:image:ImagePipeline", name, None, opts)
        plan = plan_image_pipeline(args, catalog)
        child = pulumi.ResourceOptions(parent=self)
        tags = args.tagging.tags
        partition = aws.get_partition_output(opts=pulumi.InvokeOutputOptions(parent=self)).partition
        region = aws.get_region_output(opts=pulumi.InvokeOutputOptions(parent=self)).region

        role = aws.iam.Role(
            f"{name}-builder",
            description=f"gpucloud {args.tagging.cluster} image build instances",
            assume_role_policy=json.dumps(
                {
                    "Version": "2012-10-17",
                    "Statement": [
                        {"Effect": "Allow", "Principal": {"Service": "ec2.amazonaws.com"}, "Action": "sts:AssumeRole"}
                    ],
                }
            ),
            tags=tags("image-builder"),
            opts=child,
        )
        for index, managed in enumerate(BUILDER_MANAGED_POLICIES):
            aws.iam.RolePolicyAttachment(
                f"{name}-builder-managed-{index}",
                role=role.name,
                policy_arn=pulumi.Output.concat("arn:", partition, ":iam::aws:", managed),
                opts=child,
            )
        aws.iam.RolePolicy(
            f"{name}-builder-wheel",
            role=role.id,
            policy=partition.apply(lambda p: json.dumps(builder_policy_document(p, plan.wheel_bucket, plan.wheel_key))),
            opts=child,
        )
        profile = aws.iam.InstanceProfile(f"{name}-builder", role=role.name, tags=tags("image-builder"), opts=child)

        components = [
            aws.imagebuilder.Component(
                f"{name}-{c.layer}",
                name=c.resource_name,
                platform="Linux",
                version=COMPONENT_VERSION,
                data=c.rendered.document,
                description=f"gpucloud image layer {c.layer} (rendered from images/versions.yaml)",
                kms_key_id=args.kms_key_id,
                tags=tags(f"image-{c.layer}"),
                opts=child,
            )
            for c in plan.components
        ]
        recipe = aws.imagebuilder.ImageRecipe(
            f"{name}-recipe",
            name=plan.recipe_name,
            version=COMPONENT_VERSION,
            parent_image=plan.parent_image,
            components=[
                aws.imagebuilder.ImageRecipeComponentArgs(
                    component_arn=component.arn,
                    parameters=[
                        aws.imagebuilder.ImageRecipeComponentParameterArgs(name=k, value=v)
                        for k, v in planned.parameters.items()
                    ]
                    or None,
                )
                for component, planned in zip(components, plan.components, strict=True)
            ],
            block_device_mappings=[
                aws.imagebuilder.ImageRecipeBlockDeviceMappingArgs(
                    device_name=ROOT_DEVICE,
                    ebs=aws.imagebuilder.ImageRecipeBlockDeviceMappingEbsArgs(
                        volume_size=args.root_volume_gib,
                        volume_type="gp3",
                        encrypted="true",
                        delete_on_termination="true",
                        kms_key_id=args.kms_key_id,
                    ),
                )
            ],
            tags=tags("image-recipe"),
            opts=child,
        )
        infrastructure = aws.imagebuilder.InfrastructureConfiguration(
            f"{name}-infrastructure",
            name=f"{args.tagging.cluster}-gpu-image",
            description="GPU build instance for the gpucloud image (validate and test need a GPU)",
            instance_profile_name=profile.name,
            instance_types=list(args.build_instance_types),
            subnet_id=args.subnet_id,
            security_group_ids=list(args.security_group_ids),
            terminate_instance_on_failure=True,
            instance_metadata_options=aws.imagebuilder.InfrastructureConfigurationInstanceMetadataOptionsArgs(
                http_tokens="required",
                http_put_response_hop_limit=1,
            ),
            resource_tags=tags("image-build"),
            tags=tags("image-infrastructure"),
            opts=child,
        )
        distribution = aws.imagebuilder.DistributionConfiguration(
            f"{name}-distribution",
            name=f"{args.tagging.cluster}-gpu-image",
            description=f"Publishes the AMI id to SSM {plan.ami_parameter_name}",
            distributions=[
                aws.imagebuilder.DistributionConfigurationDistributionArgs(
                    region=region,
                    ami_distribution_configuration=aws.imagebuilder.DistributionConfigurationDistributionAmiDistributionConfigurationArgs(
                        name=plan.ami_name,
                        description="gpucloud GPU image: "
                        + ", ".join(
                            f"{k} {getattr(args.matrix.versions, k)}"
                            for k in ("nvidia_driver", "cuda", "nccl", "efa_installer", "pytorch")
                        ),
                        ami_tags=tags("gpu-image", **{"gpucloud:matrix": plan.recipe_name}),
                        kms_key_id=args.kms_key_id,
                    ),
                    ssm_parameter_configurations=[
                        aws.imagebuilder.DistributionConfigurationDistributionSsmParameterConfigurationArgs(
                            parameter_name=plan.ami_parameter_name,
                            data_type="aws:ec2:image",
                        )
                    ],
                )
            ],
            tags=tags("image-distribution"),
            opts=child,
        )
        self.pipeline = aws.imagebuilder.ImagePipeline(
            f"{name}-pipeline",
            name=f"{args.tagging.cluster}-gpu-image",
            description="gpucloud GPU image (images/versions.yaml)",
            image_recipe_arn=recipe.arn,
            infrastructure_configuration_arn=infrastructure.arn,
            distribution_configuration_arn=distribution.arn,
            schedule=(
                aws.imagebuilder.ImagePipelineScheduleArgs(
                    schedule_expression=args.schedule_expression,
                    pipeline_execution_start_condition="EXPRESSION_MATCH_ONLY",
                )
                if args.schedule_expression
                else None
            ),
            image_tests_configuration=aws.imagebuilder.ImagePipelineImageTestsConfigurationArgs(
                image_tests_enabled=True,
                timeout_minutes=args.test_timeout_minutes,
            ),
            enhanced_image_metadata_enabled=True,
            status="ENABLED",
            tags=tags("image-pipeline"),
            opts=child,
        )
        self.ami_parameter_name = plan.ami_parameter_name
        self.register_outputs(
            {
                "pipelineArn": self.pipeline.arn,
                "recipeArn": recipe.arn,
                "amiParameterName": plan.ami_parameter_name,
            }
        )
