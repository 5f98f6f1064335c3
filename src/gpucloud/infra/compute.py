"""A node group: cluster placement group, launch template (EFA interfaces, IMDSv2, encrypted gp3
root, market options) and autoscaling group (spot mix, capacity rebalance, termination hook).

How each capacity type is expressed (ParallelCluster does the same):
- spot: a mixed instances policy with the market choice in ``instances_distribution`` (a launch
  template with spot market options cannot be used in a mixed instances policy);
- capacity-block: ``instance_market_options.market_type = capacity-block`` plus the reservation id;
- capacity-reservation (ODCR): the reservation id as the launch template's reservation target;
- on-demand: neither.

With scaling enabled the group also gets its backlog scale-out policy and, on a capacity block with
an end time, the scheduled scale-down (``infra/scaling.py``); desired capacity then belongs to the
policy and the agents, so a later ``pulumi up`` leaves it alone.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import pulumi
import pulumi_aws as aws

from gpucloud.cluster.efa_layout import NicPlan
from gpucloud.cluster.scaling_plan import QueueTerm, default_lead_minutes
from gpucloud.cluster.tags import NODE_GROUP_TAG, Tagging
from gpucloud.infra.scaling import (
    GROUP_METRICS,
    BacklogScaling,
    BacklogScalingArgs,
    CapacityBlockWindDown,
    CapacityBlockWindDownArgs,
)
from gpucloud.planning.instance_mix import TemplatePlan
from gpucloud.spec.model import NodeGroup as NodeGroupSpec

DRAIN_HOOK = "gpucloud-drain"  # the agent completes this lifecycle action once the job is saved
# How long `pulumi destroy` waits for the group to be gone: its instances terminate first (the
# provider polls until DescribeAutoScalingGroups no longer lists it); a p5.48xlarge with 32 EFA
# interfaces takes minutes to shut down. The provider's default is 10 minutes.
GROUP_DELETE_TIMEOUT = "30m"


def launch_template_interfaces(
    nics: Sequence[NicPlan], security_group_ids: Sequence[pulumi.Input[str]]
) -> list[aws.ec2.LaunchTemplateNetworkInterfaceArgs]:
    """Launch-template interfaces for a NIC plan: security groups on every one, no public IPs,
    and no IP settings at all on EFA-only interfaces (they cannot have addresses)."""
    out = []
    for nic in nics:
        out.append(
            aws.ec2.LaunchTemplateNetworkInterfaceArgs(
                network_card_index=nic.network_card_index,
                device_index=nic.device_index,
                interface_type=nic.interface_type,
                security_groups=list(security_group_ids),
                # every interface, EFA ones included, goes with its instance: "If set to true, the
                # interface is deleted when the instance is terminated"
                # (https://docs.aws.amazon.com/AWSEC2/latest/APIReference/API_LaunchTemplateInstanceNetworkInterfaceSpecificationRequest.html).
                # One left behind would hold its subnet and security group (DependencyViolation) forever.
                delete_on_termination="true",
                associate_public_ip_address="false" if nic.has_ip and nic.device_index == 0 else None,
            )
        )
    return out


@dataclasses.dataclass
class NodeGroupArgs:
    tagging: Tagging
    group: NodeGroupSpec
    # one launch template per distinct interface layout of the group's instance types; the first
    # holds the primary type (``planning/instance_mix.py``)
    templates: Sequence[TemplatePlan]
    placement_group: bool
    subnet_ids: pulumi.Input[Sequence[str]]
    security_group_ids: Sequence[pulumi.Input[str]]
    instance_profile_arn: pulumi.Input[str]
    image_id: pulumi.Input[str]
    root_device_name: pulumi.Input[str]
    user_data: Sequence[pulumi.Input[str]]  # per template: its node settings differ (EFA count)
    job_queue_name: pulumi.Input[str]  # the backlog alarm counts this queue's visible slot messages
    queue_term: QueueTerm = QueueTerm.COUNT  # how (scaling_plan.queue_terms: one queue, several groups)
    ssh_key_name: str | None = None
    # what must exist before a node can launch (the node role's policy): the group waits for it
    depends_on: Sequence[pulumi.Resource] = ()


class NodeGroup(pulumi.ComponentResource):
    launch_template: aws.ec2.LaunchTemplate  # the primary type's
    launch_templates: list[aws.ec2.LaunchTemplate]
    asg: aws.autoscaling.Group
    scaling: BacklogScaling | None
    wind_down: CapacityBlockWindDown | None

    def __init__(self, name: str, args: NodeGroupArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("gpucloud:compute:NodeGroup", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        g = args.group
        tags = args.tagging.tags(g.name, **{NODE_GROUP_TAG: g.name})
        pg = (
            aws.ec2.PlacementGroup(f"{name}-pg", strategy="cluster", tags=tags, opts=child)
            if args.placement_group
            else None
        )
        self.launch_templates = [
            self._launch_template(f"{name}-lt" if k == 0 else f"{name}-lt-{k + 1}", args, template, user_data, pg, tags)
            for k, (template, user_data) in enumerate(zip(args.templates, args.user_data, strict=True))
        ]
        self.launch_template = self.launch_templates[0]
        version = self.launch_template.latest_version.apply(str)
        spot = g.capacity.type == "spot"
        self.asg = aws.autoscaling.Group(
            f"{name}-asg",
            min_size=g.min_nodes,
            max_size=g.max_nodes,
            desired_capacity=g.desired,
            vpc_zone_identifiers=args.subnet_ids,
            placement_group=pg.name if pg is not None else None,
            capacity_rebalance=spot,  # launch a replacement when AWS recommends rebalancing
            mixed_instances_policy=self._spot_mix(g, args.templates, version) if spot else None,
            launch_template=None
            if spot
            else aws.autoscaling.GroupLaunchTemplateArgs(id=self.launch_template.id, version=version),
            health_check_type="EC2",
            # spot and reserved capacity may take long to arrive; do not hold `pulumi up` for it
            wait_for_capacity_timeout="0",
            tags=[aws.autoscaling.GroupTagArgs(key=k, value=v, propagate_at_launch=True) for k, v in tags.items()],
            # the backlog alarm reads GroupDesiredCapacity, published only while collection is on
            enabled_metrics=list(GROUP_METRICS) if g.scaling.enabled else None,
            metrics_granularity="1Minute" if g.scaling.enabled else None,
            # A destroy must not wait on busy nodes. Without force the provider first drains the group:
            # capacity 0, then waits for every instance to terminate, and each one sits in
            # Terminating:Wait for the drain hook's heartbeat (drainTimeoutSeconds) unless its agent
            # completes the action, and a busy node's scale-in protection can hold it too; the delete
            # times out. ForceDelete "deletes any outstanding lifecycle actions"; the instances "will
            # also be forcibly terminated without executing termination lifecycle hooks"
            # (https://docs.aws.amazon.com/autoscaling/ec2/APIReference/API_DeleteAutoScalingGroup.html,
            # https://docs.aws.amazon.com/autoscaling/ec2/userguide/resource-deletion-protection.html;
            # pulumi-aws autoscaling.Group force_delete / force_delete_warm_pool,
            # https://www.pulumi.com/registry/packages/aws/api-docs/autoscaling/group/#force_delete_python).
            # Jobs are drained before that by `gpucloud teardown`, not by the hook.
            force_delete=True,
            force_delete_warm_pool=True,  # no warm pool today; one added later deletes the same way
            # with scaling, desired capacity is the policy's and the agents' to set, not the stack's
            opts=pulumi.ResourceOptions.merge(
                child,
                pulumi.ResourceOptions(
                    ignore_changes=["desiredCapacity"] if g.scaling.enabled else None,
                    depends_on=list(args.depends_on),
                    custom_timeouts=pulumi.CustomTimeouts(delete=GROUP_DELETE_TIMEOUT),
                ),
            ),
        )
        # The drain hook as a resource of its own: the group's initial_lifecycle_hooks are applied
        # only when the group is created, so a new drainTimeoutSeconds would reach node.env (the
        # agents' deadline) but not the hook AWS holds a terminating node for. A termination hook
        # applies to every later termination, whenever it was added.
        # https://www.pulumi.com/registry/packages/aws/api-docs/autoscaling/group/#initiallifecyclehooks
        self.drain_hook = aws.autoscaling.LifecycleHook(
            f"{name}-drain",
            name=DRAIN_HOOK,
            autoscaling_group_name=self.asg.name,
            lifecycle_transition="autoscaling:EC2_INSTANCE_TERMINATING",
            heartbeat_timeout=g.drain_timeout_seconds,
            default_result="CONTINUE",
            opts=child,
        )
        self.scaling = (
            BacklogScaling(
                f"{name}-scaling",
                BacklogScalingArgs(
                    tagging=args.tagging,
                    node_group=g.name,
                    asg_name=self.asg.name,
                    job_queue_name=args.job_queue_name,
                    max_nodes=g.max_nodes,
                    instance_warmup_seconds=g.scaling.instance_warmup_seconds,
                    queue_term=args.queue_term,
                ),
                opts=child,
            )
            if g.scaling.enabled
            else None
        )
        block_end = g.capacity.block_end if g.capacity.type == "capacity-block" else None
        self.wind_down = (
            CapacityBlockWindDown(
                f"{name}-block",
                CapacityBlockWindDownArgs(
                    asg_name=self.asg.name,
                    block_end=block_end,
                    lead_minutes=g.capacity.block_end_lead_minutes or default_lead_minutes(g.drain_timeout_seconds),
                ),
                opts=child,
            )
            if block_end is not None
            else None
        )
        self.register_outputs({"launchTemplateId": self.launch_template.id, "asgName": self.asg.name})

    def _launch_template(
        self,
        resource_name: str,
        args: NodeGroupArgs,
        template: TemplatePlan,
        user_data: pulumi.Input[str],
        pg: aws.ec2.PlacementGroup | None,
        tags: dict[str, str],
    ) -> aws.ec2.LaunchTemplate:
        g = args.group
        return aws.ec2.LaunchTemplate(
            resource_name,
            description=f"gpucloud {args.tagging.cluster} {g.name}: {template.instance_type}",
            image_id=args.image_id,
            instance_type=template.instance_type,
            iam_instance_profile=aws.ec2.LaunchTemplateIamInstanceProfileArgs(arn=args.instance_profile_arn),
            # interfaces carry the security groups; vpc_security_group_ids would conflict with them
            network_interfaces=launch_template_interfaces(template.nics, args.security_group_ids),
            metadata_options=aws.ec2.LaunchTemplateMetadataOptionsArgs(
                http_endpoint="enabled",
                http_tokens="required",
                http_put_response_hop_limit=2,  # containers on the node reach IMDS through one more hop
            ),
            block_device_mappings=[
                aws.ec2.LaunchTemplateBlockDeviceMappingArgs(
                    device_name=args.root_device_name,
                    ebs=aws.ec2.LaunchTemplateBlockDeviceMappingEbsArgs(
                        volume_size=g.root_volume_gib,
                        volume_type="gp3",
                        encrypted="true",
                        delete_on_termination="true",
                    ),
                )
            ],
            instance_market_options=self._market_options(g),
            capacity_reservation_specification=self._reservation(g),
            placement=aws.ec2.LaunchTemplatePlacementArgs(group_name=pg.name) if pg is not None else None,
            instance_initiated_shutdown_behavior="terminate",
            key_name=args.ssh_key_name,
            user_data=user_data,
            update_default_version=True,
            tag_specifications=[
                aws.ec2.LaunchTemplateTagSpecificationArgs(resource_type=kind, tags=tags)
                for kind in ("instance", "volume", "network-interface")
            ],
            tags=tags,
            opts=pulumi.ResourceOptions(parent=self),
        )

    @staticmethod
    def _market_options(g: NodeGroupSpec) -> aws.ec2.LaunchTemplateInstanceMarketOptionsArgs | None:
        if g.capacity.type == "capacity-block":
            return aws.ec2.LaunchTemplateInstanceMarketOptionsArgs(market_type="capacity-block")
        return None

    @staticmethod
    def _reservation(g: NodeGroupSpec) -> aws.ec2.LaunchTemplateCapacityReservationSpecificationArgs | None:
        if g.capacity.type not in ("capacity-block", "capacity-reservation"):
            return None
        return aws.ec2.LaunchTemplateCapacityReservationSpecificationArgs(
            capacity_reservation_target=aws.ec2.LaunchTemplateCapacityReservationSpecificationCapacityReservationTargetArgs(
                capacity_reservation_id=g.capacity.reservation_id,
            ),
        )

    def _spot_mix(
        self, g: NodeGroupSpec, templates: Sequence[TemplatePlan], version: pulumi.Output[str]
    ) -> aws.autoscaling.GroupMixedInstancesPolicyArgs:
        c = g.capacity
        return aws.autoscaling.GroupMixedInstancesPolicyArgs(
            instances_distribution=aws.autoscaling.GroupMixedInstancesPolicyInstancesDistributionArgs(
                on_demand_base_capacity=c.on_demand_base,
                on_demand_percentage_above_base_capacity=0,
                spot_allocation_strategy=c.spot_allocation_strategy,
                spot_max_price=None if c.spot_max_price is None else f"{c.spot_max_price:.4f}",
            ),
            launch_template=aws.autoscaling.GroupMixedInstancesPolicyLaunchTemplateArgs(
                launch_template_specification=(
                    aws.autoscaling.GroupMixedInstancesPolicyLaunchTemplateLaunchTemplateSpecificationArgs(
                        launch_template_id=self.launch_template.id, version=version
                    )
                ),
                overrides=self._overrides(g, templates),
            ),
        )

    def _overrides(
        self, g: NodeGroupSpec, templates: Sequence[TemplatePlan]
    ) -> list[aws.autoscaling.GroupMixedInstancesPolicyLaunchTemplateOverrideArgs]:
        """One override per instance type: its weight (when the group lists several types: AWS wants
        a weight on every override or on none) and, off the primary template, its own template."""
        weighted = bool(g.instance_types)
        overrides = []
        for k, (template, lt) in enumerate(zip(templates, self.launch_templates, strict=True)):
            own_template = (
                aws.autoscaling.GroupMixedInstancesPolicyLaunchTemplateOverrideLaunchTemplateSpecificationArgs(
                    launch_template_id=lt.id, version=lt.latest_version.apply(str)
                )
                if k > 0
                else None
            )
            for choice in template.choices:
                overrides.append(
                    aws.autoscaling.GroupMixedInstancesPolicyLaunchTemplateOverrideArgs(
                        instance_type=choice.instance_type.name,
                        weighted_capacity=str(choice.weight) if weighted else None,
                        launch_template_specification=own_template,
                    )
                )
        return overrides
