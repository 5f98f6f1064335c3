"""The stack spec: what a ``stacks/Pulumi.<stack>.yaml`` file may say, as typed pydantic models.

Keys are camelCase in the file (Pulumi's convention) and snake_case in Python. Every model forbids
unknown keys so a typo is an error, not a silently ignored setting. Defaults live here, in code:
under Pulumi mocks the CLI's project-level config defaults do not exist.

Cross-field rules (EFA vs instance type, reservations, FSx sizes, cost ceiling, ...) are not here but
in ``rules.py``, one small validator per rule.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator
from pydantic.alias_generators import to_camel

CapacityType = Literal["spot", "on-demand", "capacity-block", "capacity-reservation"]
SpotAllocationStrategy = Literal["price-capacity-optimized", "capacity-optimized", "lowest-price"]
EfaMode = Literal["auto", "on", "off"]
EfaLayout = Literal["efa-only", "legacy"]
EgressMode = Literal["nat", "endpoints"]

DEFAULT_VPC_CIDR = "10.0.0.0/16"
DEFAULT_DLAMI_FLAVOUR = "base-oss-nvidia-driver-gpu-ubuntu-22.04"
RESERVED_CAPACITY: frozenset[str] = frozenset({"capacity-block", "capacity-reservation"})


class SpecModel(BaseModel):
    model_config = ConfigDict(
        extra="forbid", alias_generator=to_camel, populate_by_name=True, frozen=True, strict=False
    )


class Capacity(SpecModel):
    """How the group's nodes are bought."""

    type: CapacityType = "on-demand"
    reservation_id: str | None = None  # cr-... for capacity-block / capacity-reservation
    spot_allocation_strategy: SpotAllocationStrategy = "price-capacity-optimized"
    on_demand_base: int = 0  # spot groups: this many nodes are on-demand, the rest spot
    spot_max_price: float | None = None  # USD/h; unset = capped at the on-demand price (AWS default)


class Efa(SpecModel):
    mode: EfaMode = "auto"  # auto: on when the instance type supports EFA
    layout: EfaLayout = "efa-only"  # efa-only: ENA primary + EFA-only elsewhere (AWS's current advice)

    @field_validator("mode", mode="before")
    @classmethod
    def _yaml_booleans(cls, value: object) -> object:
        # YAML 1.1 reads a bare `on` / `off` as a boolean; take what the user meant.
        if value is True:
            return "on"
        if value is False:
            return "off"
        return value


class NodeGroup(SpecModel):
    name: str
    instance_type: str
    min_nodes: int = 0
    desired_nodes: int | None = None  # defaults to minNodes
    max_nodes: int = 1
    capacity: Capacity = Capacity()
    efa: Efa = Efa()
    placement_group: bool | None = None  # None: a cluster placement group whenever EFA is on
    root_volume_gib: int = Field(default=200, alias="rootVolumeGiB")
    drain_timeout_seconds: int = 600  # termination lifecycle hook heartbeat: time to checkpoint

    @property
    def desired(self) -> int:
        return self.min_nodes if self.desired_nodes is None else self.desired_nodes


class Fsx(SpecModel):
    size_gib: int = Field(default=1200, alias="sizeGiB")
    throughput_per_tib: int = Field(default=250, alias="throughputPerTiB")
    mount_path: str = "/fsx"
    link_path: str = "/checkpoints"  # where the checkpoint bucket appears inside the file system
    s3_prefix: str = "checkpoints/"  # which part of the bucket is linked


class CheckpointBucket(SpecModel):
    noncurrent_expiry_days: int = 7  # overwritten/deleted checkpoint objects are kept this long
    expiry_days: int | None = None  # delete checkpoints older than this (None: keep)
    abort_multipart_days: int = 1


class Storage(SpecModel):
    fsx: Fsx | None = None
    nvme_scratch: bool = True
    scratch_path: str = "/scratch"
    checkpoint_bucket: CheckpointBucket = CheckpointBucket()


class Ami(SpecModel):
    flavour: str | None = None  # DLAMI flavour, resolved through its SSM public parameter
    id: str | None = None  # or a fixed AMI id
    parameter: str | None = None  # or an SSM parameter holding the AMI id (our image pipeline's)

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
    schedule: str | None = None  # "cron(...)" / "rate(...)"; None: build on demand
    ami_parameter: str | None = None  # default /gpucloud/<stack>/ami-id
    matrix_file: str | None = None  # default images/versions.yaml
    root_volume_gib: int = Field(default=100, alias="rootVolumeGiB")


class Network(SpecModel):
    vpc_cidr: str | None = None  # new VPC (default 10.0.0.0/16) ...
    vpc_id: str | None = None  # ... or an existing VPC with private subnets
    subnet_ids: list[str] = []
    egress: EgressMode = "nat"  # new VPC: NAT gateway, or VPC endpoints only (no internet)

    @property
    def existing(self) -> bool:
        return self.vpc_id is not None


class Access(SpecModel):
    ssm: bool = True  # Session Manager: no SSH, no open ports
    ssh_key_name: str | None = None
    ssh_cidrs: list[str] = []


class JobPlane(SpecModel):
    max_receive_count: int = 5  # deliveries before a job message goes to the dead-letter queue
    visibility_timeout_seconds: int = 900


class ClusterSpec(SpecModel):
    region: str
    availability_zone: str | None = None  # None: the region's first available AZ
    cluster_name: str | None = None  # None: the stack name
    node_groups: list[NodeGroup]
    network: Network = Network()
    storage: Storage = Storage()
    ami: Ami = Ami()
    image: ImageBuild | None = None
    access: Access = Access()
    job_plane: JobPlane = JobPlane()
    tags: dict[str, str] = {}
    cost_ceiling_usd_per_hour: float | None = None

    def name_for(self, stack_name: str) -> str:
        return self.cluster_name or stack_name
