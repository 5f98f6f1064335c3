"""The stack program: a ``ClusterSpec`` in, the cluster's components out.

``pulumi up`` (through ``__main__.py``) and ``gpucloud plan`` (under mocks, ``preview.py``) both
call ``build_cluster``, so the preview shows exactly what a deployment creates.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import TYPE_CHECKING

import pulumi
import pulumi_aws as aws

from gpucloud.catalog import Catalog
from gpucloud.cluster import agent_contract
from gpucloud.cluster.drill_contract import STACK_OUTPUT as DRILL_OUTPUT
from gpucloud.cluster.scaling_plan import QueueTerm, queue_terms
from gpucloud.cluster.tags import Tagging
from gpucloud.infra.ami import resolve_image
from gpucloud.infra.budget import BudgetNodeAccess, ClusterBudget, ClusterBudgetArgs, budget_node_settings
from gpucloud.infra.compute import DRAIN_HOOK, NodeGroup, NodeGroupArgs
from gpucloud.infra.drill import SpotDrill, SpotDrillArgs
from gpucloud.infra.expiry import stack_expiry
from gpucloud.infra.iam import NodeAccessPolicy, NodeAccessPolicyArgs, NodeIdentity, NodeIdentityArgs
from gpucloud.infra.jobplane import InterruptionEvents, InterruptionEventsArgs, JobPlane, JobPlaneArgs
from gpucloud.infra.monitoring import MonitoringArgs, Render, build_monitoring
from gpucloud.infra.network import ClusterNetwork, ClusterNetworkArgs
from gpucloud.infra.security import ClusterSecurity, ClusterSecurityArgs
from gpucloud.infra.storage import CheckpointStore, CheckpointStoreArgs, SharedFilesystem, SharedFilesystemArgs
from gpucloud.infra.userdata import user_data_output
from gpucloud.planning.cluster_plan import ClusterPlan, plan_cluster
from gpucloud.planning.instance_mix import group_zone_indices, plan_instance_mix, plan_templates
from gpucloud.spec.model import ClusterSpec

if TYPE_CHECKING:
    from gpucloud.infra.image import ImagePipeline


@dataclasses.dataclass
class ClusterOutputs:
    plan: ClusterPlan
    vpc_id: pulumi.Output[str]
    node_subnet_ids: pulumi.Output[list[str]]
    bucket_name: pulumi.Output[str]
    job_queue_url: pulumi.Output[str]
    events_queue_url: pulumi.Output[str]
    job_table_name: pulumi.Output[str]
    asg_names: dict[str, pulumi.Output[str]]
    fsx_dns_name: pulumi.Output[str] | None
    # what `gpucloud teardown` decides on before it destroys (docs/teardown.md)
    checkpoint_bucket_protected: bool = False
    fsx: SharedFilesystem | None = None
    # per node group with scaling enabled: the scale-out policy and the alarm that drives it
    scaling_policy_arns: dict[str, pulumi.Output[str]] = dataclasses.field(default_factory=dict)
    backlog_alarm_names: dict[str, pulumi.Output[str]] = dataclasses.field(default_factory=dict)
    # per capacity-block group with an end time: when it scales to 0 (ISO 8601 UTC)
    capacity_block_scale_down: dict[str, str] = dataclasses.field(default_factory=dict)
    ami_parameter_name: str | None = None  # set when the stack runs the image pipeline
    alert_topic_arn: pulumi.Output[str] | None = None  # monitoring self-hosted or managed
    monitor_instance_id: pulumi.Output[str] | None = None  # self-hosted: reach Grafana through SSM
    budget: ClusterBudget | None = None  # gpucloud:budget
    drill: SpotDrill | None = None  # gpucloud:drill

    def export(self) -> None:
        pulumi.export("vpcId", self.vpc_id)
        pulumi.export("nodeSubnetIds", self.node_subnet_ids)
        pulumi.export("checkpointBucket", self.bucket_name)
        pulumi.export("jobQueueUrl", self.job_queue_url)
        pulumi.export("eventsQueueUrl", self.events_queue_url)
        pulumi.export("jobTableName", self.job_table_name)
        pulumi.export("autoscalingGroups", self.asg_names)
        pulumi.export("scalingPolicies", self.scaling_policy_arns)
        pulumi.export("backlogAlarms", self.backlog_alarm_names)
        pulumi.export(
            "backlogMetric",
            {
                "namespace": agent_contract.NAMESPACE,
                "metrics": [agent_contract.UNCLAIMED_SLOTS, agent_contract.BUSY_NODES],
                "dimensions": [agent_contract.CLUSTER_DIMENSION, agent_contract.NODE_GROUP_DIMENSION],
            },
        )
        if self.capacity_block_scale_down:
            pulumi.export("capacityBlockScaleDown", self.capacity_block_scale_down)
        if self.fsx_dns_name is not None:
            pulumi.export("fsxDnsName", self.fsx_dns_name)
        pulumi.export("checkpointBucketProtected", self.checkpoint_bucket_protected)
        pulumi.export(
            "fsx",
            None
            if self.fsx is None
            else {
                "fileSystemId": self.fsx.file_system_id,
                "dataRepositoryAssociationId": self.fsx.association_id,
                "fileSystemPath": self.fsx.file_system_path,
                "exportPath": self.fsx.export_path,
                "exportOnDestroy": self.fsx.export_on_destroy,
            },
        )
        if self.ami_parameter_name is not None:
            pulumi.export("amiParameterName", self.ami_parameter_name)
        if self.alert_topic_arn is not None:
            pulumi.export("alertTopicArn", self.alert_topic_arn)
        if self.monitor_instance_id is not None:
            pulumi.export("monitorInstanceId", self.monitor_instance_id)
        if self.budget is not None:
            pulumi.export("budget", {"name": self.budget.budget.name, "topicArn": self.budget.topic.arn})
        if self.drill is not None:
            pulumi.export(DRILL_OUTPUT, self.drill.output())


def build_cluster(
    spec: ClusterSpec, stack_name: str, catalog: Catalog | None = None, monitoring_render: Render | None = None
) -> ClusterOutputs:
    """``monitoring_render``: tests only; the stack renders its monitoring files with gpucloud.monitoring."""
    plan = plan_cluster(spec, catalog)
    cluster = spec.name_for(stack_name)
    untimed = Tagging(stack=stack_name, cluster=cluster, extra=dict(spec.tags))
    tagging = dataclasses.replace(untimed, expires_at=stack_expiry(f"{cluster}-expires-at", untimed, spec.ttl_hours))
    zones = list(spec.availability_zones)
    az: pulumi.Input[str] = (
        zones[0] if zones else spec.availability_zone or aws.get_availability_zones_output(state="available").names[0]
    )

    network = ClusterNetwork(
        f"{cluster}-network",
        ClusterNetworkArgs(
            tagging=tagging,
            region=spec.region,
            availability_zone=az,
            more_availability_zones=zones[1:],
            egress=spec.network.egress,
            vpc_cidr=spec.network.vpc_cidr,
            existing_vpc_id=spec.network.vpc_id,
            existing_subnet_ids=spec.network.subnet_ids,
        ),
    )
    fsx_settings = spec.storage.fsx
    security = ClusterSecurity(
        f"{cluster}-security",
        ClusterSecurityArgs(
            tagging=tagging,
            vpc_id=network.vpc_id,
            with_lustre=fsx_settings is not None,
            ssh_cidrs=spec.access.ssh_cidrs,
        ),
    )
    store = CheckpointStore(
        f"{cluster}-checkpoints", CheckpointStoreArgs(tagging=tagging, settings=spec.storage.checkpoint_bucket)
    )
    first_subnet = network.node_subnet_ids.apply(lambda ids: ids[0])
    fsx = None
    if fsx_settings is not None and security.lustre_group_id is not None:
        fsx = SharedFilesystem(
            f"{cluster}-fsx",
            SharedFilesystemArgs(
                tagging=tagging,
                settings=fsx_settings,
                subnet_id=first_subnet,
                security_group_id=security.lustre_group_id,
                bucket_name=store.bucket_name,
                region=spec.region,
                export_on_destroy=spec.storage.fsx_exports_on_destroy,
            ),
        )
    jobs = JobPlane(
        f"{cluster}-jobplane",
        JobPlaneArgs(
            tagging=tagging,
            max_receive_count=spec.job_plane.max_receive_count,
            visibility_timeout_seconds=spec.job_plane.visibility_timeout_seconds,
        ),
    )
    identity = NodeIdentity(f"{cluster}-node", NodeIdentityArgs(tagging=tagging, ssm=spec.access.ssm))
    image = resolve_image(spec.ami)
    pipeline = _image_pipeline(spec, cluster, tagging, first_subnet, security.node_group_id, catalog)

    # Before the groups, and each group depends on it: a node never boots without its permissions.
    access = NodeAccessPolicy(
        f"{cluster}-node",
        NodeAccessPolicyArgs(
            role_name=identity.role.name,
            bucket_arn=store.bucket_arn,
            job_queue_arn=jobs.job_queue.arn,
            job_dead_letter_queue_arn=jobs.job_dlq.arn,
            events_queue_arn=jobs.events_queue.arn,
            table_arn=jobs.table.arn,
            region=spec.region,
            stack=stack_name,
            cluster=cluster,
            with_groups=bool(plan.groups),
            describe_instances=any(g.capacity.type == "capacity-block" for g in spec.node_groups),
            agent_package_arn=_agent_package_arn(spec),
            agent_wheelhouse_bucket_arn=_agent_wheelhouse_bucket_arn(spec),
            agent_wheelhouse_prefix=spec.agent.s3_wheelhouse.key if spec.agent.s3_wheelhouse else None,
        ),
    )

    monitoring = build_monitoring(
        f"{cluster}-monitoring",
        MonitoringArgs(
            tagging=tagging,
            spec=spec,
            stack_name=stack_name,
            plan=plan,
            vpc_id=network.vpc_id,
            subnet_id=first_subnet,
            node_security_group_id=security.node_group_id,
            node_role_name=identity.role.name,
            bucket_name=store.bucket_name,
            bucket_arn=store.bucket_arn,
            render=monitoring_render,
            job_table_name=jobs.table.name,
            job_table_arn=jobs.table.arn,
            job_queue_url=jobs.job_queue.url,
            job_queue_arn=jobs.job_queue.arn,
            job_dead_letter_queue_arn=jobs.job_dlq.arn,
        ),
    )

    # gpucloud:budget (infra/budget.py): stop-scale-out lets the agents read it, before any node boots
    budget_ids = (aws.get_partition_output().partition, aws.get_caller_identity_output().account_id)
    budget_access = None
    if spec.budget is not None and spec.budget.on_exceeded == "stop-scale-out":
        budget_access = BudgetNodeAccess(
            f"{cluster}-budget",
            role_name=identity.role.name,
            region=spec.region,
            stack=stack_name,
            cluster=cluster,
            partition=budget_ids[0],
            account=budget_ids[1],
        )

    groups: dict[str, NodeGroup] = {}
    # one job queue for every group: only one group's alarm may read it (scaling_plan's docstring)
    terms = queue_terms([(gp.group.name, gp.group.scaling.enabled) for gp in plan.groups])
    for gp in plan.groups:
        settings: dict[str, pulumi.Input[str]] = {
            "GPUCLOUD_CLUSTER": cluster,
            "GPUCLOUD_STACK": stack_name,
            "GPUCLOUD_NODE_GROUP": gp.group.name,
            # every group, stack order: the first takes jobs submitted without --group (agent/node_groups.py)
            "GPUCLOUD_NODE_GROUPS": ",".join(g.group.name for g in plan.groups),
            "GPUCLOUD_REGION": spec.region,
            "AWS_DEFAULT_REGION": spec.region,
            "GPUCLOUD_JOB_QUEUE_URL": jobs.job_queue.url,
            "GPUCLOUD_EVENTS_QUEUE_URL": jobs.events_queue.url,
            "GPUCLOUD_JOB_TABLE": jobs.table.name,
            "GPUCLOUD_CHECKPOINT_BUCKET": store.bucket_name,
            "GPUCLOUD_LIFECYCLE_HOOK": DRAIN_HOOK,
            # the hook's heartbeat timeout: how long a dead agent's peers may take to commit
            "GPUCLOUD_LIFECYCLE_TIMEOUT": str(gp.group.drain_timeout_seconds),
            "GPUCLOUD_NVME_SCRATCH": "1" if spec.storage.nvme_scratch else "0",
            "GPUCLOUD_SCRATCH_PATH": spec.storage.scratch_path,
            # empty: the AMI brings gpucloud (the validators require a package on a DLAMI)
            "GPUCLOUD_PACKAGE": spec.agent.package or "",
            agent_contract.SCALE_IN_ENV: "1" if gp.group.scaling.enabled else "0",
            agent_contract.IDLE_MINUTES_ENV: str(gp.group.scaling.idle_minutes),
            **monitoring.node_settings,  # which exporters the node starts, and where managed nodes write
            **budget_node_settings(stack_name, budget_ids[1], spec.budget),
        }
        if fsx is not None and fsx_settings is not None:
            settings.update(
                {
                    "GPUCLOUD_FSX_DNS": fsx.dns_name,
                    "GPUCLOUD_FSX_MOUNT_NAME": fsx.mount_name,
                    "GPUCLOUD_FSX_MOUNT_PATH": fsx_settings.mount_path,
                }
            )
        templates = plan_templates(plan_instance_mix(gp.group, gp.efa, catalog))
        # EFA and a cluster placement group need one zone; other groups may spread over the cluster's
        zone_indices = group_zone_indices(spec, gp.group, single_zone=gp.efa or gp.placement_group)
        groups[gp.group.name] = NodeGroup(
            f"{cluster}-group-{gp.group.name}",
            NodeGroupArgs(
                tagging=tagging,
                group=gp.group,
                templates=templates,
                placement_group=gp.placement_group,
                subnet_ids=network.node_subnet_ids.apply(_pick(zone_indices)),
                security_group_ids=[security.node_group_id],
                instance_profile_arn=identity.profile.arn,
                image_id=image.image_id,
                root_device_name=image.root_device_name,
                # per template: the node checks for the EFA devices its own type has
                user_data=[
                    user_data_output(settings | {"GPUCLOUD_EFA_INTERFACES": str(t.efa_interfaces)}) for t in templates
                ],
                job_queue_name=jobs.job_queue.name,
                queue_term=terms.get(gp.group.name, QueueTerm.NONE),
                ssh_key_name=spec.access.ssh_key_name,
                depends_on=[
                    access.policy,
                    *monitoring.node_depends_on,
                    # FSx is mountable before its link to the bucket exists: a node booting then
                    # would write checkpoints to a /fsx path nothing exports, or find none imported
                    *([fsx.association] if fsx is not None else []),
                    *([budget_access.policy] if budget_access is not None else []),
                ],
            ),
        )

    InterruptionEvents(
        f"{cluster}-interruptions",
        InterruptionEventsArgs(
            tagging=tagging,
            events_queue_arn=jobs.events_queue.arn,
            events_queue_url=jobs.events_queue.url,
            asg_names=[g.asg.name for g in groups.values()],
            block_reservation_ids=[
                g.capacity.reservation_id
                for g in spec.node_groups
                if g.capacity.type == "capacity-block" and g.capacity.reservation_id is not None
            ],
        ),
    )
    budget = None
    if spec.budget is not None:
        scaling = {n: (g.asg.name, g.asg.arn) for n, g in groups.items() if g.scaling is not None}
        budget = ClusterBudget(
            f"{cluster}-budget",
            ClusterBudgetArgs(
                tagging=tagging,
                settings=spec.budget,
                alert_emails=[*spec.budget.alert_emails, *spec.monitoring.alert_emails],
                partition=budget_ids[0],
                account=budget_ids[1],
                scaling_groups=scaling,
            ),
        )
    drill = None
    if spec.drill:  # gpucloud:drill: the FIS template `gpucloud drill` starts (infra/drill.py)
        drill = SpotDrill(
            f"{cluster}-drill",
            SpotDrillArgs(
                tagging=tagging,
                region=spec.region,
                partition=budget_ids[0],
                account=budget_ids[1],
                dead_letter_queue_name=jobs.job_dlq.name,
            ),
        )
    return ClusterOutputs(
        plan=plan,
        vpc_id=network.vpc_id,
        node_subnet_ids=network.node_subnet_ids,
        bucket_name=store.bucket_name,
        job_queue_url=jobs.job_queue.url,
        events_queue_url=jobs.events_queue.url,
        job_table_name=jobs.table.name,
        asg_names={name: g.asg.name for name, g in groups.items()},
        fsx_dns_name=fsx.dns_name if fsx is not None else None,
        checkpoint_bucket_protected=store.protected,
        fsx=fsx,
        scaling_policy_arns={n: g.scaling.policy.arn for n, g in groups.items() if g.scaling is not None},
        backlog_alarm_names={n: g.scaling.alarm.name for n, g in groups.items() if g.scaling is not None},
        capacity_block_scale_down={n: g.wind_down.scale_down_at for n, g in groups.items() if g.wind_down is not None},
        ami_parameter_name=pipeline.ami_parameter_name if pipeline is not None else None,
        alert_topic_arn=monitoring.alert_topic_arn,
        monitor_instance_id=monitoring.monitor_instance_id,
        budget=budget,
        drill=drill,
    )


def _pick(indices: list[int]) -> Callable[[list[str]], list[str]]:
    """The group's subnets among the cluster's node subnets (one per zone, in zone order)."""
    return lambda ids: [ids[i] for i in indices]


def _agent_package_arn(spec: ClusterSpec) -> pulumi.Output[str] | None:
    """The S3 object ARN of the stack's agent wheel (``agent.package = s3://...``), in this partition."""
    wheel = spec.agent.s3_wheel
    if wheel is None:
        return None
    partition = aws.get_partition_output().partition
    return pulumi.Output.concat("arn:", partition, ":s3:::", wheel.bucket, "/", wheel.key)


def _agent_wheelhouse_bucket_arn(spec: ClusterSpec) -> pulumi.Output[str] | None:
    """The bucket ARN of the stack's agent wheelhouse (``agent.package = s3://bucket/folder/``)."""
    house = spec.agent.s3_wheelhouse
    if house is None:
        return None
    partition = aws.get_partition_output().partition
    return pulumi.Output.concat("arn:", partition, ":s3:::", house.bucket)


def _image_pipeline(
    spec: ClusterSpec,
    cluster: str,
    tagging: Tagging,
    subnet_id: pulumi.Input[str],
    security_group_id: pulumi.Input[str],
    catalog: Catalog | None,
) -> ImagePipeline | None:
    """Our own AMI pipeline, when the stack file has an ``image`` section (its AMI id goes to SSM,
    where other stacks read it with ``ami: {parameter: ...}``)."""
    if spec.image is None:
        return None
    from gpucloud.image.matrix import load_matrix
    from gpucloud.infra.image import ImagePipeline, ImagePipelineArgs

    settings = spec.image
    return ImagePipeline(
        f"{cluster}-image",
        ImagePipelineArgs(
            tagging=tagging,
            matrix=load_matrix(settings.matrix_file),
            subnet_id=subnet_id,
            security_group_ids=[security_group_id],
            gpucloud_wheel_s3_uri=settings.wheel_s3_uri,
            build_instance_types=tuple(settings.build_instance_types),
            ami_parameter_name=settings.ami_parameter,
            schedule_expression=settings.schedule,
            root_volume_gib=settings.root_volume_gib,
        ),
        catalog=catalog,
    )
