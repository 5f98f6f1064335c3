"""Network: a VPC with a private node subnet in each of its AZs (one by default), S3 and DynamoDB
gateway endpoints, and either a NAT gateway or an interface endpoint for every other AWS API the
nodes call; or an existing VPC and subnets.

Nodes never get public IPs: multi-card instance types cannot have them, and SSM needs none.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import pulumi
import pulumi_aws as aws

from gpucloud.cluster.addressing import plan_subnets
from gpucloud.cluster.tags import Tagging
from gpucloud.infra.security import patient_delete

# Every AWS API a node calls must be reachable when the VPC has no route to the internet
# (egress: endpoints). tests/infra/test_endpoints.py finds the runtime's boto3 clients and checks
# each has its endpoint here.
# Gateway endpoints (free; in every VPC we create): the checkpoint bucket and the job table.
# https://docs.aws.amazon.com/vpc/latest/privatelink/gateway-endpoints.html
GATEWAY_SERVICES = ("s3", "dynamodb")
# Interface endpoints: Session Manager (ssm, ssmmessages, ec2messages), the job and events queues
# (sqs), the agent's group calls (autoscaling), and CloudWatch metrics, which boto3's "cloudwatch"
# client sends to monitoring.<region>: the agent's backlog metric (PutMetricData). No CloudWatch
# Logs: nothing on a node calls it (job logs go to the bucket), and each endpoint is billed per zone.
# https://docs.aws.amazon.com/AmazonCloudWatch/latest/monitoring/cloudwatch-and-interface-VPC.html
# https://docs.aws.amazon.com/autoscaling/ec2/userguide/ec2-auto-scaling-vpc-endpoints.html
# https://docs.aws.amazon.com/AWSSimpleQueueService/latest/SQSDeveloperGuide/sqs-internetwork-traffic-privacy.html
# The agent also calls EC2 (DescribeInstances: the instances of a Capacity Block whose expiry
# warning arrived): https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/interface-vpc-endpoints.html
ENDPOINT_SERVICES = ("ssm", "ssmmessages", "ec2messages", "sqs", "autoscaling", "monitoring", "ec2")
# boto3 client names whose endpoint service is named differently
ENDPOINT_FOR_CLIENT = {"cloudwatch": "monitoring"}


@dataclasses.dataclass
class ClusterNetworkArgs:
    tagging: Tagging
    region: str
    availability_zone: pulumi.Input[str]
    egress: str = "nat"  # "nat" | "endpoints"
    more_availability_zones: Sequence[str] = ()  # a node subnet in each of these zones too
    vpc_cidr: str | None = None  # create a VPC with this CIDR ...
    existing_vpc_id: str | None = None  # ... or use this VPC
    existing_subnet_ids: Sequence[str] = ()


class ClusterNetwork(pulumi.ComponentResource):
    vpc_id: pulumi.Output[str]
    node_subnet_ids: pulumi.Output[list[str]]
    vpc_cidr: pulumi.Output[str]

    def __init__(self, name: str, args: ClusterNetworkArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("gpucloud:network:ClusterNetwork", name, None, opts)
        if args.existing_vpc_id is not None:
            existing = aws.ec2.get_vpc_output(id=args.existing_vpc_id, opts=pulumi.InvokeOptions(parent=self))
            self.vpc_id = pulumi.Output.from_input(args.existing_vpc_id)
            self.vpc_cidr = existing.cidr_block
            self.node_subnet_ids = pulumi.Output.from_input(list(args.existing_subnet_ids))
        else:
            self._create(name, args)
        self.register_outputs({"vpcId": self.vpc_id, "nodeSubnetIds": self.node_subnet_ids})

    def _create(self, name: str, args: ClusterNetworkArgs) -> None:
        child = pulumi.ResourceOptions(parent=self)
        t = args.tagging
        cidr = args.vpc_cidr or "10.0.0.0/16"
        zones = [args.availability_zone, *args.more_availability_zones]
        plan = plan_subnets(cidr, len(zones))
        vpc = aws.ec2.Vpc(
            f"{name}-vpc",
            cidr_block=cidr,
            enable_dns_support=True,
            enable_dns_hostnames=True,
            tags=t.tags("vpc"),
            opts=child,
        )
        node_subnets, private_routes = [], []
        for index, (zone, block) in enumerate(zip(zones, plan.node_subnets, strict=True)):
            suffix = "" if index == 0 else f"-z{index + 1}"  # the first zone keeps the one-zone names
            # one route table per zone: each zone's default route goes to its own NAT gateway
            routes = aws.ec2.RouteTable(
                f"{name}-nodes{suffix}-rt", vpc_id=vpc.id, tags=t.tags(f"nodes{suffix}"), opts=child
            )
            private_routes.append(routes)
            subnet = aws.ec2.Subnet(
                f"{name}-nodes{suffix}",
                vpc_id=vpc.id,
                cidr_block=block,
                availability_zone=zone,
                map_public_ip_on_launch=False,
                tags=t.tags(f"nodes{suffix}"),
                # nodes' and FSx's interfaces may outlive their owner's delete by minutes (security.py)
                opts=patient_delete(self),
            )
            aws.ec2.RouteTableAssociation(
                f"{name}-nodes{suffix}-rta", subnet_id=subnet.id, route_table_id=routes.id, opts=child
            )
            node_subnets.append(subnet)
        if args.egress == "nat":
            igw = aws.ec2.InternetGateway(f"{name}-igw", vpc_id=vpc.id, tags=t.tags("igw"), opts=child)
            for index, (zone, block, routes) in enumerate(zip(zones, plan.public_subnets, private_routes, strict=True)):
                self._nat(name, args, vpc, igw, zone, block, routes, "" if index == 0 else f"-z{index + 1}")
        else:
            self._interface_endpoints(name, args, vpc, cidr, node_subnets)
        # Gateway endpoints are free and keep checkpoint and job-table traffic off the NAT gateway.
        for service in GATEWAY_SERVICES:
            aws.ec2.VpcEndpoint(
                f"{name}-{service}",
                vpc_id=vpc.id,
                vpc_endpoint_type="Gateway",
                service_name=f"com.amazonaws.{args.region}.{service}",
                route_table_ids=[routes.id for routes in private_routes],
                tags=t.tags(f"{service}-endpoint"),
                opts=child,
            )
        self.vpc_id = vpc.id
        self.vpc_cidr = vpc.cidr_block
        self.node_subnet_ids = pulumi.Output.all(*(subnet.id for subnet in node_subnets)).apply(list)

    def _nat(
        self,
        name: str,
        args: ClusterNetworkArgs,
        vpc: aws.ec2.Vpc,
        igw: aws.ec2.InternetGateway,
        zone: pulumi.Input[str],
        public_cidr: str,
        private_routes: aws.ec2.RouteTable,
        suffix: str,
    ) -> None:
        """One zone's NAT gateway, in that zone's public subnet, as its node subnet's default route. A
        NAT gateway serves its own zone only (https://docs.aws.amazon.com/vpc/latest/userguide/nat-gateway-basics.html):
        one in the first zone for every zone would bill each other zone's egress as cross-zone data
        and cut it when the first zone fails."""
        child = pulumi.ResourceOptions(parent=self)
        t = args.tagging
        public = aws.ec2.Subnet(
            f"{name}-public{suffix}",
            vpc_id=vpc.id,
            cidr_block=public_cidr,
            availability_zone=zone,
            map_public_ip_on_launch=False,
            tags=t.tags(f"public{suffix}"),
            opts=child,
        )
        public_routes = aws.ec2.RouteTable(
            f"{name}-public{suffix}-rt",
            vpc_id=vpc.id,
            routes=[aws.ec2.RouteTableRouteArgs(cidr_block="0.0.0.0/0", gateway_id=igw.id)],
            tags=t.tags(f"public{suffix}"),
            opts=child,
        )
        aws.ec2.RouteTableAssociation(
            f"{name}-public{suffix}-rta", subnet_id=public.id, route_table_id=public_routes.id, opts=child
        )
        eip = aws.ec2.Eip(f"{name}-nat{suffix}-ip", domain="vpc", tags=t.tags(f"nat{suffix}"), opts=child)
        nat = aws.ec2.NatGateway(
            f"{name}-nat{suffix}",
            allocation_id=eip.id,
            subnet_id=public.id,
            connectivity_type="public",
            tags=t.tags(f"nat{suffix}"),
            opts=pulumi.ResourceOptions(parent=self, depends_on=[igw]),
        )
        aws.ec2.Route(
            f"{name}-nodes{suffix}-default",
            route_table_id=private_routes.id,
            destination_cidr_block="0.0.0.0/0",
            nat_gateway_id=nat.id,
            opts=child,
        )

    def _interface_endpoints(
        self, name: str, args: ClusterNetworkArgs, vpc: aws.ec2.Vpc, cidr: str, subnets: Sequence[aws.ec2.Subnet]
    ) -> None:
        child = pulumi.ResourceOptions(parent=self)
        t = args.tagging
        sg = aws.ec2.SecurityGroup(
            f"{name}-endpoints",
            vpc_id=vpc.id,
            description="HTTPS from the cluster VPC to AWS endpoints",
            tags=t.tags("endpoints"),
            opts=patient_delete(self),  # the endpoints' interfaces go after the endpoints' delete
        )
        aws.vpc.SecurityGroupIngressRule(
            f"{name}-endpoints-https",
            security_group_id=sg.id,
            ip_protocol="tcp",
            from_port=443,
            to_port=443,
            cidr_ipv4=cidr,
            description="HTTPS from the VPC",
            tags=t.tags("endpoints-https"),
            opts=child,
        )
        for service in ENDPOINT_SERVICES:
            aws.ec2.VpcEndpoint(
                f"{name}-{service}",
                vpc_id=vpc.id,
                vpc_endpoint_type="Interface",
                service_name=f"com.amazonaws.{args.region}.{service}",
                subnet_ids=[subnet.id for subnet in subnets],  # one endpoint interface per zone
                security_group_ids=[sg.id],
                private_dns_enabled=True,
                tags=t.tags(f"{service}-endpoint"),
                opts=child,
            )
