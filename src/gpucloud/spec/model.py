"""The stack spec: what a ``stacks/Pulumi.<stack>.yaml`` file may say, as typed pydantic models.

Keys are camelCase in the file (Pulumi's convention) and snake_case in Python. Every model forbids
unknown keys so a typo is an error, not a silently ignored setting. Defaults live here, in code:
under Pulumi mocks the CLI's project-level config defaults do not exist.

A setting's own range is part of its type here (``Field(ge=..., le=...)``, with the unit and the
reason as the field's ``description``): ``loading.py`` turns a value out of range into one line that
reads the bounds from the field, so each limit is written once. A setting's own form (ids, names,
CIDRs, paths, addresses) is an annotated type from ``formats.py``. Rules that weigh settings against
each other or against the catalog (EFA vs instance type, reservations, cost ceiling, ...) are in
``rules.py``, one small validator per rule.
"""

from __future__ import annotations

import datetime as dt
from typing import Annotated, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, field_validator, model_validator
from pydantic.alias_generators import to_camel

from gpucloud.spec.formats import (
    DEFAULT_DLAMI_FLAVOUR,
    AmiId,
    BuildSchedule,
    ClusterName,
    DlamiFlavour,
    FinanceEmail,
    FsxSizeGiB,
    FsxThroughput,
    GroupName,
    LinkPath,
    MountPath,
    OncallEmail,
    RegionName,
    ReservationId,
    S3Prefix,
    SshCidrs,
    SsmParameter,
    SubnetId,
    VpcCidr,
    VpcId,
)

CapacityType = Literal["spot", "on-demand", "capacity-block", "capacity-reservation"]
SpotAllocationStrategy = Literal["price-capacity-optimized", "capacity-optimized", "lowest-price"]
EfaMode = Literal["auto", "on", "off"]
EfaLayout = Literal["efa-only", "legacy"]
EgressMode = Literal["nat", "endpoints"]
MonitoringMode = Literal["self-hosted", "managed", "off"]
BudgetOnExceeded = Literal["notify", "stop-scale-out"]

DEFAULT_VPC_CIDR = "10.0.0.0/16"
RESERVED_CAPACITY: frozenset[str] = frozenset({"capacity-block", "capacity-reservation"})

# Ranges of single settings (the schema enforces them; error messages read them from the fields).
MAX_GROUP_NODES = 5000  # far above any GPU quota; keeps cost and capacity arithmetic in range
DRAIN_TIMEOUT_MIN, DRAIN_TIMEOUT_MAX = 30, 7200  # seconds: the lifecycle hook heartbeat's range
ROOT_VOLUME_GIB_MIN = 30  # the DLAMI's own snapshot needs this much
ROOT_VOLUME_GIB_MAX = 16384  # gp3's largest volume
IDLE_MINUTES_MAX = 1440  # a day
WARMUP_SECONDS_MAX = 3600
EXPECTED_CHECKPOINT_GIB_MAX = 1_048_576  # 1 PiB: far above any job; keeps the arithmetic in range
MAX_RECEIVE_COUNT_MAX = 1000  # SQS redrive policy's maxReceiveCount: 1 to 1000
VISIBILITY_TIMEOUT_MAX = 43200  # SQS: 12 hours
RETENTION_DAYS_MAX = 3650
BUDGET_PERCENT_MAX = 1000  # a notification above 10x the limit would never be read in time
TTL_HOURS_MAX = 24 * 365  # a longer-lived stack is not a temporary one: leave ttlHours out


def _not_a_boolean(value: object) -> object:
    # Lax mode would read `maxNodes: true` as 1. Text stays allowed: the Pulumi engine hands
    # top-level config to the program as strings ("5").
    if isinstance(value, bool):
        raise ValueError(f"expected a number, got {str(value).lower()}")
    return value


Int = Annotated[int, BeforeValidator(_not_a_boolean)]
Float = Annotated[float, BeforeValidator(_not_a_boolean)]


class SpecModel(BaseModel):
    # allow_inf_nan=False: `.nan` compares false with everything, so a NaN ceiling never applies
    model_config = ConfigDict(
        extra="forbid",
        alias_generator=to_camel,
        populate_by_name=True,
        frozen=True,
        strict=False,
        allow_inf_nan=False,
    )


class Capacity(SpecModel):
    """How the group's nodes are bought."""

    type: CapacityType = "on-demand"
    reservation_id: ReservationId | None = None  # cr-... for capacity-block / capacity-reservation
    spot_allocation_strategy: SpotAllocationStrategy = "price-capacity-optimized"
    # spot groups: this many nodes are on-demand, the rest spot
    on_demand_base: Int = Field(default=0, ge=0, le=MAX_GROUP_NODES, description="nodes")
    # unset = capped at the on-demand price (AWS default)
    spot_max_price: Float | None = Field(default=None, gt=0, description="USD/hour")
    # capacity-block only: when the block ends (ISO 8601 with a zone, e.g. 2026-12-01T11:30:00Z) ...
    block_end: dt.datetime | None = None
    # ... and how long before it the group scales to 0; None: 30 min (AWS reclaims the nodes from
    # then on) plus the drain timeout plus a margin, so checkpoints finish before AWS stops the nodes
    block_end_lead_minutes: Int | None = None

    @field_validator("block_end", mode="before")
    @classmethod
    def _iso_time(cls, value: object) -> object:
        # A bare date (YAML reads 2026-12-01 as one) or free text would get pydantic's generic
        # message; say what form is wanted instead.
        expected = "expected an ISO 8601 time with zone, e.g. 2026-12-01T11:30:00Z"
        if isinstance(value, str):
            try:
                return dt.datetime.fromisoformat(value)
            except ValueError:
                raise ValueError(f"not a time; {expected}") from None
        if isinstance(value, dt.date) and not isinstance(value, dt.datetime):
            raise ValueError(f"a date without a time; {expected}")
        return value


class Efa(SpecModel):
    mode: EfaMode = "auto"  # auto: on when the instance type supports EFA
    # efa-only: ENA primary + EFA-only elsewhere (the EC2 guide's current layout, documented for
    # P5/P5e/P5en); legacy: a combined EFA on every card. None: efa-only where documented, else legacy.
    layout: EfaLayout | None = None

    @field_validator("mode", mode="before")
    @classmethod
    def _yaml_booleans(cls, value: object) -> object:
        # YAML 1.1 reads a bare `on` / `off` as a boolean; take what the user meant.
        if value is True:
            return "on"
        if value is False:
            return "off"
        return value


class Scaling(SpecModel):
    """How a node group follows the queue: out on the backlog metric, in by idle agents."""

    enabled: bool = True  # false: the group keeps the size you set (no alarm, agents never scale in)
    # an agent idle this long terminates its node and lowers desired by one
    idle_minutes: Int = Field(
        default=10,
        ge=1,
        le=IDLE_MINUTES_MAX,
        description="minutes an agent waits for work before it terminates its node",
    )
    # Step scaling's warmup: repeated alarms within it do not add the same nodes twice while the
    # desired-capacity metric catches up with the last scale-out.
    instance_warmup_seconds: Int = Field(
        default=180,
        ge=0,
        le=WARMUP_SECONDS_MAX,
        description="seconds (how long a scale-out is not repeated while it takes effect)",
    )


class InstanceTypeChoice(SpecModel):
    """One instance type a spot group may launch, and the capacity units one node of it counts for
    (ASG instance weighting: https://docs.aws.amazon.com/autoscaling/ec2/userguide/ec2-auto-scaling-mixed-instances-groups-instance-weighting.html)."""

    instance_type: str
    weight: Int = 1


def _primary_from_choices(value: object) -> object:
    """``instanceTypes`` alone: the first one is the group's ``instanceType`` (its launch template's)."""
    if not isinstance(value, dict) or "instanceType" in value or "instance_type" in value:
        return value
    choices = value.get("instanceTypes", value.get("instance_types"))
    if isinstance(choices, list) and choices and isinstance(choices[0], dict):
        first = choices[0].get("instanceType", choices[0].get("instance_type"))
        if isinstance(first, str):
            return {**value, "instanceType": first}
    return value


class NodeGroup(SpecModel):
    name: GroupName
    instance_type: str
    # spot groups: several instance types (the first is instanceType), each with its weight; the group
    # launches whichever has capacity (price-capacity-optimized). Empty: instanceType alone, weight 1.
    instance_types: list[InstanceTypeChoice] = []
    # zones of the cluster's availabilityZones this group launches in; None: EFA and placement-group
    # groups the first zone (they cannot span zones), other groups every zone
    availability_zones: list[str] | None = None
    min_nodes: Int = Field(default=0, ge=0, le=MAX_GROUP_NODES, description="nodes")
    # defaults to minNodes
    desired_nodes: Int | None = Field(default=None, ge=0, le=MAX_GROUP_NODES, description="nodes")
    max_nodes: Int = Field(default=1, ge=1, le=MAX_GROUP_NODES, description="nodes")
    capacity: Capacity = Capacity()
    efa: Efa = Efa()
    placement_group: bool | None = None  # None: a cluster placement group whenever EFA is on
    root_volume_gib: Int = Field(
        default=200,
        alias="rootVolumeGiB",
        ge=ROOT_VOLUME_GIB_MIN,
        le=ROOT_VOLUME_GIB_MAX,
        description="GiB (the DLAMI needs the minimum)",
    )
    # termination lifecycle hook heartbeat: time to checkpoint
    drain_timeout_seconds: Int = Field(
        default=600,
        ge=DRAIN_TIMEOUT_MIN,
        le=DRAIN_TIMEOUT_MAX,
        description="seconds (the lifecycle hook heartbeat range)",
    )
    # the emergency save this group's jobs make (GiB, whole job); `plan` warns when it misses the notice
    expected_checkpoint_gib: Float | None = Field(
        default=None,
        alias="expectedCheckpointGiB",
        gt=0,
        le=EXPECTED_CHECKPOINT_GIB_MAX,
        description="GiB of checkpoint state",
    )
    scaling: Scaling = Scaling()

    @property
    def desired(self) -> int:
        return self.min_nodes if self.desired_nodes is None else self.desired_nodes

    @property
    def instance_mix(self) -> list[InstanceTypeChoice]:
        """Every instance type the group may launch, with its weight (the first is ``instance_type``)."""
        return list(self.instance_types) or [InstanceTypeChoice(instance_type=self.instance_type)]

    @model_validator(mode="before")
    @classmethod
    def _instance_type_from_choices(cls, value: object) -> object:
        return _primary_from_choices(value)


class Fsx(SpecModel):
    size_gib: Annotated[Int, FsxSizeGiB] = Field(default=1200, alias="sizeGiB")
    throughput_per_tib: Annotated[Int, FsxThroughput] = Field(default=250, alias="throughputPerTiB")
    mount_path: MountPath = "/fsx"
    link_path: LinkPath = "/checkpoints"  # where the checkpoint bucket appears inside the file system
    s3_prefix: S3Prefix = "checkpoints/"  # which part of the bucket is linked
    # before `pulumi destroy` deletes the link, export what automatic export has not written yet
    # (a before_delete hook on the data repository association; docs/teardown.md). The export lands
    # in the checkpoint bucket, which outlives the destroy only when protected: None (the default)
    # follows checkpointBucket.protect; true with an unprotected bucket is refused (spec/rules.py).
    export_on_destroy: bool | None = None


class CheckpointBucket(SpecModel):
    # overwritten/deleted checkpoint objects are kept this long
    noncurrent_expiry_days: Int = Field(default=7, ge=1, description="(days)")
    expiry_days: Int | None = Field(default=None, ge=1, description="(days)")  # delete older checkpoints (None: keep)
    abort_multipart_days: Int = Field(default=1, ge=1, description="(days)")
    # true: `pulumi destroy` refuses to delete the bucket (Pulumi's protect); false: the destroy
    # empties it, every version and delete marker included (docs/teardown.md)
    protect: bool = False


class Storage(SpecModel):
    fsx: Fsx | None = None
    nvme_scratch: bool = True
    scratch_path: str = "/scratch"
    checkpoint_bucket: CheckpointBucket = CheckpointBucket()

    @property
    def fsx_exports_on_destroy(self) -> bool:
        """Whether the destroy exports FSx to the bucket first: only worth its time (up to an hour)
        when the bucket survives the destroy (``protect``), unless the stack says otherwise."""
        if self.fsx is None:
            return False
        explicit = self.fsx.export_on_destroy
        return self.checkpoint_bucket.protect if explicit is None else explicit


class Ami(SpecModel):
    flavour: DlamiFlavour | None = None  # DLAMI flavour, resolved through its SSM public parameter
    id: AmiId | None = None  # or a fixed AMI id
    parameter: SsmParameter | None = None  # or an SSM parameter holding the AMI id (our image pipeline's)

    @property
    def ssm_parameter(self) -> str:
        if self.parameter is not None:
            return self.parameter
        flavour = self.flavour or DEFAULT_DLAMI_FLAVOUR
        return f"/aws/service/deeplearning/ami/x86_64/{flavour}/latest/ami-id"


class ImageBuild(SpecModel):
    """Our own AMI, built by EC2 Image Builder from ``images/`` (the key's presence enables it)."""

    wheel_s3_uri: str  # the gpucloud wheel the image installs, uploaded before a build
    build_instance_types: list[str] = ["g5.2xlarge"]  # a GPU type: the validate phase needs GPUs
    schedule: BuildSchedule | None = None  # "cron(...)" / "rate(...)"; None: build on demand
    ami_parameter: SsmParameter | None = None  # default /gpucloud/<stack>/ami-id
    matrix_file: str | None = None  # default images/versions.yaml
    root_volume_gib: Int = Field(default=100, alias="rootVolumeGiB")


class S3Object(BaseModel):
    """An ``s3://bucket/key`` URI, split."""

    model_config = ConfigDict(frozen=True)

    bucket: str
    key: str

    @property
    def file_name(self) -> str:
        return self.key.rsplit("/", 1)[-1]

    @property
    def is_folder(self) -> bool:
        """``s3://bucket/folder/``: a prefix, not an object (``s3://bucket/`` alone is neither)."""
        return self.key.endswith("/") and self.key.strip("/") != ""

    @classmethod
    def parse(cls, uri: str | None) -> S3Object | None:
        """Split an ``s3://`` URI (None for anything else; validity: ``rules._s3_wheel_problems``)."""
        if uri is None or not uri.startswith("s3://"):
            return None
        bucket, _, key = uri.removeprefix("s3://").partition("/")
        return cls(bucket=bucket, key=key)


class Agent(SpecModel):
    """Where a node gets the gpucloud package its node agent runs (``scripts/node-bootstrap.sh``)."""

    # 's3://bucket/key.whl': a wheel (pip wheel --no-deps .) the node copies with its instance role;
    # the stack grants s3:GetObject on exactly that object. Or a pip requirement for gpucloud:
    # 'gpucloud==0.1.0' from your index, 'gpucloud @ https://.../gpucloud-0.1.0-py3-none-any.whl'.
    # 's3://bucket/folder/': a wheelhouse (pip download gpucloud -d folder, for the nodes' platform):
    # installed with no package index, so it also works with egress: endpoints.
    # None: the AMI already has it in /opt/gpucloud/venv (the gpucloud image, ami.parameter).
    package: str | None = None

    @property
    def s3_wheel(self) -> S3Object | None:
        """The wheel's bucket and key when ``package`` is an ``s3://`` URI of one object (validity: ``rules.py``)."""
        found = S3Object.parse(self.package)
        return None if found is not None and found.is_folder else found

    @property
    def s3_wheelhouse(self) -> S3Object | None:
        """The folder's bucket and prefix when ``package`` is an ``s3://bucket/folder/`` URI."""
        found = S3Object.parse(self.package)
        return found if found is not None and found.is_folder else None


class Network(SpecModel):
    vpc_cidr: VpcCidr | None = None  # new VPC (default 10.0.0.0/16) ...
    vpc_id: VpcId | None = None  # ... or an existing VPC with private subnets
    subnet_ids: list[SubnetId] = []
    egress: EgressMode = "nat"  # new VPC: NAT gateway, or VPC endpoints only (no internet)

    @property
    def existing(self) -> bool:
        return self.vpc_id is not None


class Access(SpecModel):
    ssm: bool = True  # Session Manager: no SSH, no open ports
    ssh_key_name: str | None = None
    ssh_cidrs: SshCidrs = []


class JobPlane(SpecModel):
    # deliveries before a job message goes to the dead-letter queue
    max_receive_count: Int = Field(default=5, ge=1, le=MAX_RECEIVE_COUNT_MAX, description="deliveries")
    visibility_timeout_seconds: Int = Field(
        default=900, ge=0, le=VISIBILITY_TIMEOUT_MAX, description="seconds (the SQS limit)"
    )


class Monitoring(SpecModel):
    """Where the nodes' metrics go (docs/monitoring.md). Nodes run the exporters unless mode is off."""

    # self-hosted: one private monitor instance (Prometheus, Alertmanager, Grafana) reached through
    # SSM; managed: Amazon Managed Service for Prometheus; off: exporters only, nothing collects.
    mode: MonitoringMode = "off"
    # the TSDB's retention; sizes its EBS volume
    retention_days: Int = Field(default=15, ge=1, le=RETENTION_DAYS_MAX, description="days")
    instance_type: str = "t3.large"  # self-hosted: the monitor instance
    managed_grafana: bool = False  # managed: also an Amazon Managed Grafana workspace
    alert_emails: list[OncallEmail] = []  # subscribed to the alert topic (each confirms by mail)
    # self-hosted: the monitor writes `gpucloud report` to s3://<bucket>/reports/ daily and sends the
    # summary to the alert topic (docs/cost.md, "The daily report"). Unset: on where the monitor can
    # install gpucloud (self-hosted and agent.package set); false turns it off.
    daily_report: bool | None = None

    def daily_report_on(self, agent_package: str | None) -> bool:
        if self.daily_report is not None:
            return self.daily_report
        return self.mode == "self-hosted" and agent_package is not None


class Budget(SpecModel):
    """An AWS Budgets monthly cost budget over this stack's tagged resources (docs/cost.md, "Budgets")."""

    monthly_usd: Float = Field(gt=0, description="(USD per month)")
    # notifications (ACTUAL cost GREATER_THAN this % of monthlyUsd) to the budget's SNS topic
    alert_at_percent: list[Annotated[Float, Field(gt=0, le=BUDGET_PERCENT_MAX, description="(% of monthlyUsd)")]] = [
        50,
        80,
        100,
    ]
    # at 100%: notify only, or also stop scale-out for new work (running jobs are never stopped)
    on_exceeded: BudgetOnExceeded = "notify"
    alert_emails: list[FinanceEmail] = []  # subscribed to the budget topic, besides monitoring.alertEmails


class ClusterSpec(SpecModel):
    region: RegionName
    availability_zone: str | None = None  # None: the region's first available AZ
    # new VPC: a node subnet in each of these zones (instead of availabilityZone); EFA groups, placement
    # groups and FSx use the first. Spot groups without EFA spread over all: more pools, fewer interruptions.
    availability_zones: list[str] = []
    cluster_name: ClusterName | None = None  # None: the stack name
    node_groups: list[NodeGroup]
    network: Network = Network()
    storage: Storage = Storage()
    ami: Ami = Ami()
    image: ImageBuild | None = None
    agent: Agent = Agent()
    access: Access = Access()
    job_plane: JobPlane = JobPlane()
    monitoring: Monitoring = Monitoring()
    budget: Budget | None = None
    tags: dict[str, str] = {}
    # every resource gets gpucloud:expires-at = the time `pulumi up` ran + this (`gpucloud sweep --expired`)
    ttl_hours: Float | None = Field(default=None, gt=0, le=TTL_HOURS_MAX, description="(hours)")
    # an AWS FIS experiment template that interrupts one spot node of a `gpucloud drill` job (docs/drill.md)
    drill: bool = False
    cost_ceiling_usd_per_hour: Float | None = Field(default=None, gt=0, description="USD/hour")
    # default for every group's expectedCheckpointGiB (GiB of checkpoint state per job)
    expected_checkpoint_gib: Float | None = Field(
        default=None,
        alias="expectedCheckpointGiB",
        gt=0,
        le=EXPECTED_CHECKPOINT_GIB_MAX,
        description="GiB of checkpoint state",
    )

    def name_for(self, stack_name: str) -> str:
        return self.cluster_name or stack_name
