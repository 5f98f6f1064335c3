"""Security groups: the node (EFA) group and the FSx for Lustre group.

EFA needs a security group that allows all traffic to and from itself, as two rules that name the
group (CIDR rules do not count); they are separate rule resources because a group cannot reference
itself inline at creation. Lustre clients reach the file servers on TCP 988 and 1018-1023.
No rule accepts traffic from 0.0.0.0/0; SSH only when the stack names source ranges.

A group cannot be deleted while a network interface uses it (DependencyViolation). In a destroy the
node groups go first (their launch templates name these groups), but a terminated instance's EFA
interfaces are deleted after it, and the provider retries DependencyViolation only until the delete
timeout (terraform-provider-aws resourceSecurityGroupDelete; its lingering-ENI cleanup covers Lambda,
Comprehend and DMS interfaces, not instances'). ENI_DELETE_TIMEOUT gives them the time.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import pulumi
import pulumi_aws as aws

from gpucloud.cluster.monitoring_plan import AGENT_METRICS_PORT, DCGM_EXPORTER_PORT, NODE_EXPORTER_PORT
from gpucloud.cluster.tags import Tagging

LUSTRE_PORTS = ((988, 988), (1018, 1023))
# How long a destroy retries deleting a security group or subnet that interfaces still use: those of
# terminating nodes (a p5.48xlarge has 32, deleted with the instance: DeleteOnTermination,
# https://docs.aws.amazon.com/AWSEC2/latest/APIReference/API_InstanceNetworkInterfaceSpecification.html)
# and of a file system being deleted. The provider's defaults are 15 min (group) and 20 min (subnet);
# terraform-provider-aws waits at least 45 min for Lambda's lingering interfaces for the same reason.
ENI_DELETE_TIMEOUT = "45m"


# the options of a security group or subnet: children of the component, deleted patiently
def patient_delete(parent: pulumi.Resource) -> pulumi.ResourceOptions:
    return pulumi.ResourceOptions(parent=parent, custom_timeouts=pulumi.CustomTimeouts(delete=ENI_DELETE_TIMEOUT))


# what a monitor scrapes on every node (monitoring.mode: self-hosted)
SCRAPE_PORTS = {"node-exporter": NODE_EXPORTER_PORT, "dcgm-exporter": DCGM_EXPORTER_PORT, "agent": AGENT_METRICS_PORT}


@dataclasses.dataclass
class ClusterSecurityArgs:
    tagging: Tagging
    vpc_id: pulumi.Input[str]
    with_lustre: bool = False
    ssh_cidrs: Sequence[str] = ()


class ClusterSecurity(pulumi.ComponentResource):
    node_group_id: pulumi.Output[str]
    lustre_group_id: pulumi.Output[str] | None

    def __init__(self, name: str, args: ClusterSecurityArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("gpucloud:security:ClusterSecurity", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        t = args.tagging
        nodes = aws.ec2.SecurityGroup(
            f"{name}-nodes",
            vpc_id=args.vpc_id,
            description="gpucloud nodes: EFA all traffic within the group",
            revoke_rules_on_delete=True,
            tags=t.tags("nodes"),
            opts=patient_delete(self),
        )
        aws.vpc.SecurityGroupIngressRule(
            f"{name}-efa-in",
            security_group_id=nodes.id,
            ip_protocol="-1",
            referenced_security_group_id=nodes.id,
            description="EFA: all traffic from the group itself",
            tags=t.tags("efa-in"),
            opts=child,
        )
        aws.vpc.SecurityGroupEgressRule(
            f"{name}-efa-out",
            security_group_id=nodes.id,
            ip_protocol="-1",
            referenced_security_group_id=nodes.id,
            description="EFA: all traffic to the group itself",
            tags=t.tags("efa-out"),
            opts=child,
        )
        # Outbound HTTPS and the rest: AWS APIs, the DLAMI package mirrors, the NAT gateway.
        aws.vpc.SecurityGroupEgressRule(
            f"{name}-out",
            security_group_id=nodes.id,
            ip_protocol="-1",
            cidr_ipv4="0.0.0.0/0",
            description="outbound to AWS APIs and package mirrors",
            tags=t.tags("out"),
            opts=child,
        )
        for i, cidr in enumerate(args.ssh_cidrs):
            aws.vpc.SecurityGroupIngressRule(
                f"{name}-ssh-{i}",
                security_group_id=nodes.id,
                ip_protocol="tcp",
                from_port=22,
                to_port=22,
                cidr_ipv6=cidr if ":" in cidr else None,
                cidr_ipv4=None if ":" in cidr else cidr,
                description="SSH from an allowed range",
                tags=t.tags(f"ssh-{i}"),
                opts=child,
            )
        self.node_group_id = nodes.id
        self.lustre_group_id = self._lustre(name, args, nodes) if args.with_lustre else None
        self.register_outputs({"nodeSecurityGroupId": nodes.id, "lustreSecurityGroupId": self.lustre_group_id})

    def _lustre(self, name: str, args: ClusterSecurityArgs, nodes: aws.ec2.SecurityGroup) -> pulumi.Output[str]:
        child = pulumi.ResourceOptions(parent=self)
        t = args.tagging
        lustre = aws.ec2.SecurityGroup(
            f"{name}-lustre",
            vpc_id=args.vpc_id,
            description="gpucloud FSx for Lustre: Lustre ports from nodes",
            revoke_rules_on_delete=True,
            tags=t.tags("lustre"),
            opts=patient_delete(self),
        )
        for source, label in ((nodes, "nodes"), (lustre, "self")):
            for low, high in LUSTRE_PORTS:
                suffix = f"{label}-{low}" if low == high else f"{label}-{low}-{high}"
                aws.vpc.SecurityGroupIngressRule(
                    f"{name}-lustre-in-{suffix}",
                    security_group_id=lustre.id,
                    ip_protocol="tcp",
                    from_port=low,
                    to_port=high,
                    referenced_security_group_id=source.id,
                    description=f"Lustre from {label}",
                    tags=t.tags(f"lustre-in-{suffix}"),
                    opts=child,
                )
                aws.vpc.SecurityGroupEgressRule(
                    f"{name}-lustre-out-{suffix}",
                    security_group_id=lustre.id,
                    ip_protocol="tcp",
                    from_port=low,
                    to_port=high,
                    referenced_security_group_id=source.id,
                    description=f"Lustre to {label}",
                    tags=t.tags(f"lustre-out-{suffix}"),
                    opts=child,
                )
        return lustre.id


def allow_scrapes(
    name: str,
    tagging: Tagging,
    node_group_id: pulumi.Input[str],
    monitor_group_id: pulumi.Input[str],
    parent: pulumi.Resource,
) -> None:
    """The node group accepts the monitor's group on the exporters' ports, and nothing else from it."""
    for label, port in SCRAPE_PORTS.items():
        aws.vpc.SecurityGroupIngressRule(
            f"{name}-{label}",
            security_group_id=node_group_id,
            ip_protocol="tcp",
            from_port=port,
            to_port=port,
            referenced_security_group_id=monitor_group_id,
            description=f"monitor scrapes {label}",
            tags=tagging.tags(f"scrape-{label}"),
            opts=pulumi.ResourceOptions(parent=parent),
        )
        aws.vpc.SecurityGroupEgressRule(
            f"{name}-{label}-out",
            security_group_id=monitor_group_id,
            ip_protocol="tcp",
            from_port=port,
            to_port=port,
            referenced_security_group_id=node_group_id,
            description=f"scrape {label} on the nodes",
            tags=tagging.tags(f"scrape-{label}-out"),
            opts=pulumi.ResourceOptions(parent=parent),
        )
