"""Run the stack program offline under Pulumi mocks and record what it would create.

No Pulumi CLI, no engine, no provider plugin, no network, no credentials: ``pulumi.runtime``'s
mock monitor takes every resource registration in-process, and ``PreviewMocks`` answers the
provider's part: ids, the computed attributes the program reads (ARNs, URLs, DNS names), and the
invokes (availability zones, the DLAMI SSM parameter, the AMI, the partition).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import dataclasses
import hashlib
from collections.abc import Iterator, Sequence
from typing import Any, NamedTuple

import pulumi
from pulumi.runtime import MockCallArgs, MockResourceArgs, Mocks, set_all_config, set_mocks, settings
from pulumi.runtime.mocks import MockMonitor

from gpucloud.catalog import Catalog
from gpucloud.cluster.efa_layout import EfaLayoutSummary
from gpucloud.cluster.hourly_cost import CostEstimate, RootVolumes, infrastructure_cost, infrastructure_prices
from gpucloud.cluster.monitoring_plan import MonitorCost, cluster_series, monitor_cost
from gpucloud.planning.cluster_plan import EmergencySavePlan, GroupPlan
from gpucloud.planning.instance_mix import group_zone_indices, plan_instance_mix
from gpucloud.spec.model import ClusterSpec

PROJECT = "gpucloud"
ACCOUNT = "123456789012"  # placeholder account id in the ARNs the mocks invent
MOCK_AMI = "ami-0123456789abcdef0"


@dataclasses.dataclass(frozen=True)
class ResourceOptionsSeen:
    """The resource options the engine receives with a registration (mocks see inputs, not these):
    what decides how a destroy treats the resource (docs/teardown.md, "A destroy that finishes")."""

    protect: bool = False  # a destroy refuses to delete it
    delete_timeout: str | None = None  # custom_timeouts(delete=...)
    before_delete: tuple[str, ...] = ()  # names of the resource hooks run before its delete
    depends_on: tuple[str, ...] = ()  # URNs of explicit depends_on (deleted after this one)
    delete_before_replace: bool = False  # a replacement deletes the old one (and its replaced dependents) first
    ignore_changes: tuple[str, ...] = ()  # inputs whose changes are no diff (no update, no replacement)
    replace_on_changes: tuple[str, ...] = ()  # inputs whose changes replace the resource

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.protect:
            out["protect"] = True
        if self.delete_timeout:
            out["delete_timeout"] = self.delete_timeout
        if self.before_delete:
            out["before_delete"] = list(self.before_delete)
        return out


@dataclasses.dataclass(frozen=True)
class RecordedResource:
    type: str  # Pulumi type token, e.g. aws:ec2/launchTemplate:LaunchTemplate
    name: str  # logical name
    inputs: dict[str, Any]  # camelCase wire names, as the engine would receive them
    custom: bool  # False for ComponentResources
    parent: str | None  # parent URN (None for top-level resources)
    urn: str
    id: str = ""  # the id the mocks returned (custom resources)
    property_dependencies: dict[str, list[str]] = dataclasses.field(default_factory=dict)  # input -> URNs
    options: ResourceOptionsSeen = dataclasses.field(default_factory=lambda: ResourceOptionsSeen())

    def to_json(self) -> dict[str, Any]:
        out = {
            "type": self.type,
            "name": self.name,
            "inputs": self.inputs,
            "custom": self.custom,
            "parent": self.parent,
        }
        if options := self.options.to_json():  # only what changes how `pulumi destroy` treats it
            out["options"] = options
        return out


@dataclasses.dataclass(frozen=True)
class RecordedInvoke:
    token: str
    args: dict[str, Any]


@dataclasses.dataclass(frozen=True)
class GroupLayout:
    node_group: str
    placement_group: bool
    efa: EfaLayoutSummary


@dataclasses.dataclass(frozen=True)
class StackPreview:
    stack: str
    cluster: str
    region: str
    resources: list[RecordedResource]
    invokes: list[RecordedInvoke]
    efa_layouts: list[GroupLayout]
    cost: CostEstimate
    emergency_saves: list[EmergencySavePlan] = dataclasses.field(default_factory=list)
    monitoring: MonitorCost | None = None  # what the stack's monitoring costs an hour

    @property
    def custom_resources(self) -> list[RecordedResource]:
        return [r for r in self.resources if r.custom]

    def of_type(self, type_token: str) -> list[RecordedResource]:
        return [r for r in self.resources if r.type == type_token]

    def to_json(self) -> dict[str, Any]:
        return {
            "stack": self.stack,
            "cluster": self.cluster,
            "region": self.region,
            "resources": [r.to_json() for r in self.resources],
            "efa_layout": [
                {"node_group": g.node_group, "placement_group": g.placement_group, **g.efa.to_json()}
                for g in self.efa_layouts
            ],
            "cost": self.cost.to_json(),
            "emergency_save": [g.to_json() for g in self.emergency_saves],
            "monitoring": self.monitoring.to_json() if self.monitoring is not None else None,
        }


def _service(type_token: str) -> str:
    return type_token.split(":")[1].split("/")[0]


class PreviewMocks(Mocks):
    """Plays the AWS provider: echoes inputs as state and adds the attributes AWS would compute."""

    def __init__(self, region: str, availability_zone: str | None) -> None:
        self.region = region
        self.availability_zone = availability_zone or f"{region}a"
        self.invokes: list[RecordedInvoke] = []

    def _arn(self, args: MockResourceArgs, physical: str) -> str:
        typ = args.typ
        if typ == "aws:s3/bucket:Bucket":
            return f"arn:aws:s3:::{physical}"
        if typ == "aws:sqs/queue:Queue":
            return f"arn:aws:sqs:{self.region}:{ACCOUNT}:{physical}"
        if typ == "aws:dynamodb/table:Table":
            return f"arn:aws:dynamodb:{self.region}:{ACCOUNT}:table/{physical}"
        if typ == "aws:autoscaling/group:Group":
            uuid = hashlib.sha1(physical.encode()).hexdigest()[:8]
            return (
                f"arn:aws:autoscaling:{self.region}:{ACCOUNT}:autoScalingGroup:{uuid}-0000-4000-8000-"
                f"000000000000:autoScalingGroupName/{physical}"
            )
        if typ.startswith("aws:iam/"):
            kind = "role" if typ.endswith("Role") else "instance-profile"
            return f"arn:aws:iam::{ACCOUNT}:{kind}/{physical}"
        if typ == "aws:cloudwatch/eventRule:EventRule":
            return f"arn:aws:events:{self.region}:{ACCOUNT}:rule/{physical}"
        if typ == "aws:sns/topic:Topic":
            return f"arn:aws:sns:{self.region}:{ACCOUNT}:{physical}"
        if typ == "aws:amp/workspace:Workspace":
            return f"arn:aws:aps:{self.region}:{ACCOUNT}:workspace/ws-{hashlib.sha1(physical.encode()).hexdigest()[:8]}"
        return f"arn:aws:{_service(typ)}:{self.region}:{ACCOUNT}:{typ.split(':')[-1].lower()}/{physical}"

    def new_resource(self, args: MockResourceArgs) -> tuple[str, dict]:
        physical = args.inputs.get("name") or args.name
        state = dict(args.inputs)
        state.setdefault("name", physical)
        state.setdefault("arn", self._arn(args, physical))
        resource_id = f"{physical}-id"
        if args.typ == "aws:s3/bucket:Bucket":
            state.setdefault("bucket", physical)
            resource_id = physical
        elif args.typ == "aws:sqs/queue:Queue":
            state["url"] = f"https://sqs.{self.region}.amazonaws.com/{ACCOUNT}/{physical}"
        elif args.typ == "aws:fsx/lustreFileSystem:LustreFileSystem":
            resource_id = "fs-0123456789abcdef0"
            state.update(dnsName=f"{resource_id}.fsx.{self.region}.amazonaws.com", mountName="abcdefgh")
        elif args.typ == "aws:ec2/launchTemplate:LaunchTemplate":
            state["latestVersion"] = 1
        elif args.typ == "aws:ec2/vpc:Vpc":
            resource_id = "vpc-0123456789abcdef0"
        elif args.typ == "aws:amp/workspace:Workspace":
            resource_id = state["arn"].rsplit("/", 1)[-1]
            state["prometheusEndpoint"] = (
                f"https://aps-workspaces.{self.region}.amazonaws.com/workspaces/{resource_id}/"
            )
        elif args.typ == "aws:ebs/volume:Volume":
            resource_id = "vol-0123456789abcdef0"
        return resource_id, state

    def call(self, args: MockCallArgs) -> tuple[dict, list[tuple[str, str]] | None]:
        self.invokes.append(RecordedInvoke(args.token, dict(args.args)))
        return self._answer(args), []  # no check failures: a mocked invoke never fails

    def _answer(self, args: MockCallArgs) -> dict:
        token = args.token
        if token == "aws:index/getAvailabilityZones:getAvailabilityZones":
            zones = [self.availability_zone] + [
                f"{self.region}{s}" for s in "abc" if f"{self.region}{s}" != self.availability_zone
            ]
            return {"names": zones, "zoneIds": [f"{self.region[:2]}-az{i + 1}" for i in range(len(zones))]}
        if token == "aws:ssm/getParameter:getParameter":
            return {"name": args.args.get("name"), "type": "String", "value": MOCK_AMI, "insecureValue": MOCK_AMI}
        if token == "aws:ec2/getAmi:getAmi":
            image = (args.args.get("filters") or [{}])[0].get("values", [MOCK_AMI])[0]
            return {"id": image, "imageId": image, "architecture": "x86_64", "rootDeviceName": "/dev/sda1"}
        if token == "aws:index/getPartition:getPartition":
            return {"partition": "aws", "dnsSuffix": "amazonaws.com", "id": "aws"}
        if token == "aws:index/getRegion:getRegion":
            return {"name": self.region, "region": self.region, "id": self.region}
        if token == "aws:index/getCallerIdentity:getCallerIdentity":
            return {"accountId": ACCOUNT, "arn": f"arn:aws:iam::{ACCOUNT}:user/preview", "userId": "PREVIEW"}
        if token == "aws:ec2/getSubnet:getSubnet":
            return {"id": args.args.get("id"), "availabilityZone": self.availability_zone}
        if token == "aws:ec2/getVpc:getVpc":
            return {"id": args.args.get("id"), "cidrBlock": "10.0.0.0/16"}
        return {}


class _Registration(NamedTuple):
    urn: str
    type: str
    custom: bool
    parent: str | None
    inputs: dict[str, Any]
    id: str
    property_dependencies: dict[str, list[str]]
    options: ResourceOptionsSeen


def _options_of(request: Any) -> ResourceOptionsSeen:
    return ResourceOptionsSeen(
        protect=bool(request.protect),
        delete_timeout=request.customTimeouts.delete or None,
        before_delete=tuple(request.hooks.before_delete),
        depends_on=tuple(request.dependencies),
        delete_before_replace=bool(request.deleteBeforeReplace),
        ignore_changes=tuple(request.ignoreChanges),
        replace_on_changes=tuple(request.replaceOnChanges),
    )


class _ParentRecordingMonitor(MockMonitor):
    """The stock mock monitor, plus what the engine would also know of each registration: its
    parent (for the resource tree), its property dependencies (for the policy pack) and the
    options that decide how a destroy treats it (protect, delete timeout, delete hooks)."""

    def __init__(self, mocks: Mocks) -> None:
        super().__init__(mocks)
        self.registrations: list[_Registration] = []  # appended from Pulumi's RPC threads

    def RegisterResource(self, request):
        response = super().RegisterResource(request)
        if request.type != "pulumi:pulumi:Stack":
            inputs = pulumi.runtime.rpc.deserialize_properties(request.object)
            parent = request.parent or None
            if parent is not None and parent.split("::")[2].split("$")[-1] == "pulumi:pulumi:Stack":
                parent = None  # top-level resources: the stack itself is not shown as a parent
            dependencies = {key: list(deps.urns) for key, deps in request.propertyDependencies.items() if deps.urns}
            self.registrations.append(
                _Registration(
                    response.urn,
                    request.type,
                    bool(request.custom),
                    parent,
                    inputs,
                    response.id,
                    dependencies,
                    _options_of(request),
                )
            )
        return response


def _plain(value: Any) -> Any:
    """Recorded inputs as plain JSON-able data (the RPC layer hands back protobuf-friendly types).
    An asset archive (a Lambda function's code) becomes its file names with each text's SHA-256: a
    plan shows which code ships without printing it."""
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, pulumi.AssetArchive):
        return {"archive": {name: _plain(asset) for name, asset in sorted(value.assets.items())}}
    if isinstance(value, pulumi.StringAsset):
        return {"text_sha256": hashlib.sha256(value.text.encode()).hexdigest()}
    if isinstance(value, (pulumi.Asset, pulumi.Archive)):
        return {"asset": type(value).__name__}
    return value


@contextlib.contextmanager
def mocked_runtime(
    stack_name: str, region: str, availability_zone: str | None = None
) -> Iterator[tuple[PreviewMocks, _ParentRecordingMonitor]]:
    """Install the preview mocks as Pulumi's runtime for the duration of the block.

    Pulumi's runtime keeps process-global state (root stack, config, event loop); each block starts
    clean so one preview never leaks resources, exports or config into the next.
    """
    loop = asyncio.new_event_loop()
    # Pulumi hands every mock RPC to the loop's thread pool; the mocks are pure Python (GIL-bound),
    # so extra threads only add switching: two workers cut preview time by ~40% (benchmarks/).
    loop.set_default_executor(concurrent.futures.ThreadPoolExecutor(max_workers=2))
    asyncio.set_event_loop(loop)
    settings.ROOT.set(None)
    set_all_config({})
    mocks = PreviewMocks(region, availability_zone)
    monitor = _ParentRecordingMonitor(mocks)
    set_mocks(mocks, project=PROJECT, stack=stack_name, preview=False, monitor=monitor)
    try:
        yield mocks, monitor
    finally:
        asyncio.set_event_loop(None)
        loop.close()


def recorded_resources(monitor: _ParentRecordingMonitor) -> list[RecordedResource]:
    return [
        RecordedResource(
            type=r.type,
            name=r.urn.rsplit("::", 1)[-1],
            inputs=_plain(r.inputs),
            custom=r.custom,
            parent=r.parent,
            urn=r.urn,
            id=r.id,
            property_dependencies=r.property_dependencies,
            options=r.options,
        )
        for r in monitor.registrations
    ]


def preview_stack(spec: ClusterSpec, stack_name: str, catalog: Catalog | None = None) -> StackPreview:
    """Run ``build_cluster`` under mocks; return every resource it registers, the EFA layout and cost."""
    from gpucloud.infra.program import build_cluster

    outputs = []

    @pulumi.runtime.test
    def run() -> None:
        outputs.append(build_cluster(spec, stack_name, catalog))

    with mocked_runtime(stack_name, spec.region, spec.availability_zone) as (mocks, monitor):
        run()
    plan = outputs[0].plan
    resources = recorded_resources(monitor)
    monitoring = monitor_cost(
        spec.monitoring.mode,
        cluster_series((g.instance_type, g.group.max_nodes) for g in plan.groups),
        spec.monitoring.retention_days,
        spec.monitoring.instance_type,
    )
    return StackPreview(
        stack=stack_name,
        cluster=spec.name_for(stack_name),
        region=spec.region,
        resources=resources,
        invokes=list(mocks.invokes),
        # one row per instance type of each group: a spot group's types each have their own layout
        efa_layouts=[
            GroupLayout(g.group.name, g.placement_group, t.efa_layout)
            for g in plan.groups
            for t in plan_instance_mix(g.group, g.efa, catalog)
        ],
        cost=_priced_in_full(plan.cost, resources, spec, monitoring, plan.groups),
        emergency_saves=[g.emergency_save for g in plan.groups],
        monitoring=monitoring,
    )


def _priced_in_full(
    cost: CostEstimate,
    resources: list[RecordedResource],
    spec: ClusterSpec,
    monitoring: MonitorCost,
    groups: Sequence[GroupPlan] = (),
) -> CostEstimate:
    """The nodes' cost plus everything else the recorded resources cost by the hour, and the monitor."""
    volumes = [RootVolumes(g.name, g.root_volume_gib, g.min_nodes, g.desired, g.max_nodes) for g in spec.node_groups]
    lines, warnings = infrastructure_cost(((r.type, r.inputs) for r in resources if r.custom), volumes, spec.region)
    return dataclasses.replace(
        cost,
        infrastructure=lines,
        monitoring=monitoring.total,
        warnings=[*cost.warnings, *warnings, *cross_zone_warnings(spec, groups)],
    )


def cross_zone_warnings(spec: ClusterSpec, groups: Sequence[GroupPlan]) -> list[str]:
    """What a group spread over several zones pays that plan cannot count: FSx for Lustre lives in
    the first zone only (a file system is in one subnet), and a gang's nodes in different zones talk
    across them; AWS bills both as data between zones, per GB each way (EC2 pricing, data transfer)."""
    zones = list(spec.availability_zones)
    if len(zones) < 2 or spec.network.existing:
        return []
    rate = infrastructure_prices().cross_az_usd_per_gb_each_way
    out = []
    for gp in groups:
        indices = group_zone_indices(spec, gp.group, single_zone=gp.efa or gp.placement_group)
        spread = [zones[i] for i in indices if i > 0]
        if not spread:
            continue
        what = "its gangs' traffic between zones" + (
            f" and its FSx traffic (the file system is in {zones[0]})" if spec.storage.fsx is not None else ""
        )
        out.append(
            f"node group {gp.group.name} also runs in {', '.join(spread)}: {what} is billed as data between "
            f"zones, {rate:g} USD per GB each way (not included)"
        )
    return out
