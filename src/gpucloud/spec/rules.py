"""Validators: one small function per rule, each with its own error text (ParallelCluster style).

What is checked here weighs settings against each other or against the catalog, or items of one
list or mapping against each other (names given twice, the tags). A setting's own range is in the
schema (``model.py``) and its own form in ``formats.py``, so every value a rule sees is already
well formed and in range. (The package URIs stay here: ``agent.package`` is only required with
some AMIs, and ``image.wheelS3Uri`` is checked the same way as an ``s3://`` package.) A rule takes
the parts of the parsed ``ClusterSpec`` it checks (and the catalog where it needs it) and yields
``Problem``s; it never raises. Rules that need a node group's instance type skip groups whose type
is unknown: that is reported once, by ``known_instance_type``.
"""

from __future__ import annotations

import datetime as dt
import re
import unicodedata
from collections.abc import Iterator, Mapping, Sequence

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import InvalidWheelFilename, canonicalize_name, parse_wheel_filename

from gpucloud.catalog import Catalog, InstanceType
from gpucloud.cluster.addressing import MAX_ZONES
from gpucloud.cluster.efa_layout import EFA_ONLY_FAMILIES, efa_only_documented
from gpucloud.cluster.hourly_cost import GroupSizing, estimate_cost
from gpucloud.cluster.monitoring_plan import monitor_instance_types
from gpucloud.cluster.scaling_plan import default_lead_minutes, minimum_lead_minutes, wind_down_time
from gpucloud.cluster.tags import MAX_RESOURCE_TAGS, OWN_TAGS_MAX
from gpucloud.spec.decisions import efa_enabled, uses_placement_group
from gpucloud.spec.model import (
    RESERVED_CAPACITY,
    Access,
    Agent,
    Ami,
    Budget,
    ClusterSpec,
    Fsx,
    ImageBuild,
    Monitoring,
    MonitoringMode,
    Network,
    NodeGroup,
    S3Object,
    Storage,
)
from gpucloud.spec.problems import Problem, key_path

BUCKET_RE = re.compile(r"[a-z0-9][a-z0-9.\-]{1,61}[a-z0-9]")
AGENT_PROJECT = "gpucloud"
AGENT_PACKAGE_EXAMPLES = (
    "'s3://my-artifacts/wheels/gpucloud-0.1.0-py3-none-any.whl', 'gpucloud==0.1.0' "
    "or 'gpucloud @ https://example.com/gpucloud-0.1.0-py3-none-any.whl'"
)
TAG_KEY_RESERVED = ("aws:", "gpucloud:")  # compared case-insensitively: AWS reserves aws: in any case
TAG_KEY_MAX_CHARS = 128  # https://docs.aws.amazon.com/tag-editor/latest/userguide/tagging.html
TAG_VALUE_MAX_CHARS = 256  # https://docs.aws.amazon.com/tag-editor/latest/userguide/tagging.html
LEAD_MINUTES_MAX = 1440  # capacity.blockEndLeadMinutes; the least depends on drainTimeoutSeconds


def _groups(groups: Sequence[NodeGroup], catalog: Catalog) -> Iterator[tuple[int, NodeGroup, InstanceType]]:
    for i, group in enumerate(groups):
        itype = catalog.instance_types.get(group.instance_type)
        if itype is not None:
            yield i, group, itype


def availability_zone_in_region(region: str, az: str | None) -> Iterator[Problem]:
    if az is not None and not re.fullmatch(re.escape(region) + r"[a-z]", az):
        yield Problem(
            key_path("availabilityZone"),
            f"must be a zone of region {region}, e.g. '{region}a'",
            az,
        )


def cluster_zones(region: str, zone: str | None, zones: Sequence[str], network: Network) -> Iterator[Problem]:
    if not zones:
        return
    key = key_path("availabilityZones")
    if zone is not None:
        yield Problem(key, "give availabilityZone (one zone) or availabilityZones (several), not both", zones)
    elif network.existing:
        yield Problem(key, "with an existing VPC the node subnets (network.subnetIds) set the zones; remove it", zones)
    elif len(set(zones)) != len(zones) or not 1 <= len(zones) <= MAX_ZONES:
        yield Problem(key, f"allowed: 1 to {MAX_ZONES} different zones (a node subnet is carved for each)", zones)
    else:
        for j, zone in enumerate(zones):
            if not re.fullmatch(re.escape(region) + r"[a-z]", zone):
                yield Problem(
                    key_path("availabilityZones", j),
                    f"must be a zone of region {region}, e.g. '{region}a'",
                    zone,
                )


def group_zones(
    groups: Sequence[NodeGroup], known: Sequence[str], network: Network, catalog: Catalog
) -> Iterator[Problem]:
    """A group's zones: among the cluster's (``known``), and one only where EFA or a placement group is used."""
    for i, group in enumerate(groups):
        zones = group.availability_zones
        if zones is None:
            continue
        key = key_path("nodeGroups", i, "availabilityZones")
        if network.existing or not known:
            yield Problem(
                key,
                "list the cluster's zones in availabilityZones first (a new VPC only); a group picks among them",
                zones,
            )
        elif not zones or len(set(zones)) != len(zones) or not set(zones) <= set(known):
            yield Problem(key, f"allowed: one or more different zones of availabilityZones ({', '.join(known)})", zones)
        elif len(zones) > 1 and _needs_one_zone(group, catalog):
            yield Problem(
                key,
                "EFA traffic does not cross Availability Zones and a cluster placement group lies in one zone; "
                "give one zone (or set efa.mode: off and placementGroup: false to spread)",
                zones,
            )


def _needs_one_zone(group: NodeGroup, catalog: Catalog) -> bool:
    itype = catalog.instance_types.get(group.instance_type)
    if itype is None:
        return group.efa.mode == "on" or bool(group.placement_group)
    return efa_enabled(group, itype) or uses_placement_group(group, itype)


def instance_mix(groups: Sequence[NodeGroup], catalog: Catalog) -> Iterator[Problem]:
    """Several instance types: spot groups only, known types, each once, weights ASG accepts."""
    known = ", ".join(sorted(catalog.instance_types))
    for i, group in enumerate(groups):
        choices = group.instance_types
        if not choices:
            continue
        key = key_path("nodeGroups", i, "instanceTypes")
        names = [c.instance_type for c in choices]
        if len(choices) > 1 and group.capacity.type != "spot":
            yield Problem(
                key,
                "several instance types are for spot groups (a mixed instances policy); "
                f"give one instanceType for '{group.capacity.type}' capacity",
                names,
            )
        if group.instance_type != names[0]:
            yield Problem(
                key_path("nodeGroups", i, "instanceType"),
                f"must be the first of instanceTypes ({names[0]}), the launch template's own type; or omit it",
                group.instance_type,
            )
        if len(set(names)) != len(names):
            yield Problem(key, "each instance type at most once", names)
        for j, choice in enumerate(choices):
            if choice.instance_type not in catalog.instance_types:
                yield Problem(
                    key_path("nodeGroups", i, "instanceTypes", j, "instanceType"),
                    f"unknown instance type; known types: {known}",
                    choice.instance_type,
                )
            if choice.weight != 1:
                # ASG would take 1 to 999 (LaunchTemplateOverrides.WeightedCapacity), but every count
                # here is of nodes: the scale-out alarm adds busy + unclaimed - desired (desired in
                # capacity units), the cost and the emergency-save plan price and size one node per unit.
                yield Problem(
                    key_path("nodeGroups", i, "instanceTypes", j, "weight"),
                    "allowed: 1 (every node counts as one: the scale-out counts nodes against the group's "
                    "desired capacity, and cost and emergency-save plans price and size one node per unit)",
                    choice.weight,
                )


def instance_mix_capabilities(groups: Sequence[NodeGroup], catalog: Catalog) -> Iterator[Problem]:
    """Every type of a group can do what the group asks: EFA, cluster placement, spot."""
    for i, group, primary in _groups(groups, catalog):
        efa = efa_enabled(group, primary)
        placement = uses_placement_group(group, primary)
        for j, choice in enumerate(group.instance_types[1:], start=1):
            itype = catalog.instance_types.get(choice.instance_type)
            if itype is None:
                continue
            key = key_path("nodeGroups", i, "instanceTypes", j, "instanceType")
            if efa and not (itype.efa_supported and itype.max_efa_interfaces > 0):
                yield Problem(
                    key,
                    f"the group uses EFA ({primary.name} has it) and {itype.name} has none; list EFA types only",
                    itype.name,
                )
            elif placement and not itype.supports_cluster_placement:
                yield Problem(key, f"{itype.name} does not support the group's cluster placement group", itype.name)
            elif "spot" not in itype.usage_classes:
                yield Problem(key, f"{itype.name} is not offered as spot", itype.name)
            elif group.efa.layout == "efa-only" and efa and not efa_only_documented(itype):
                yield Problem(
                    key,
                    f"the EC2 guide documents EFA-only interfaces for {', '.join(sorted(EFA_ONLY_FAMILIES))} only; "
                    "set efa.layout: legacy, or omit it (each type then gets its documented layout)",
                    itype.name,
                )


def at_least_one_group(groups: Sequence[NodeGroup]) -> Iterator[Problem]:
    if not groups:
        yield Problem(key_path("nodeGroups"), "at least one node group is required")


def group_names(groups: Sequence[NodeGroup]) -> Iterator[Problem]:
    seen: set[str] = set()
    for i, group in enumerate(groups):
        if group.name in seen:
            yield Problem(key_path("nodeGroups", i, "name"), "node group names must be unique", group.name)
        seen.add(group.name)


def known_instance_type(groups: Sequence[NodeGroup], catalog: Catalog) -> Iterator[Problem]:
    known = ", ".join(sorted(catalog.instance_types))
    for i, group in enumerate(groups):
        # a group that lists instanceTypes has each checked where it is written (``instance_mix``)
        if group.instance_type not in catalog.instance_types and not group.instance_types:
            yield Problem(
                key_path("nodeGroups", i, "instanceType"),
                f"unknown instance type; known types: {known}",
                group.instance_type,
            )


def node_counts(groups: Sequence[NodeGroup]) -> Iterator[Problem]:
    for i, g in enumerate(groups):
        if not g.min_nodes <= g.desired <= g.max_nodes:
            yield Problem(
                key_path("nodeGroups", i),
                f"node counts must satisfy minNodes <= desiredNodes <= maxNodes, "
                f"got {g.min_nodes} <= {g.desired} <= {g.max_nodes}",
            )


def efa_supported(groups: Sequence[NodeGroup], catalog: Catalog) -> Iterator[Problem]:
    for i, group, itype in _groups(groups, catalog):
        if group.efa.mode == "on" and not (itype.efa_supported and itype.max_efa_interfaces > 0):
            yield Problem(
                key_path("nodeGroups", i, "efa", "mode"),
                f"{itype.name} does not support EFA; allowed: 'off' or 'auto' (or an EFA instance type)",
                "on",
            )


def efa_only_layout_documented(groups: Sequence[NodeGroup], catalog: Catalog) -> Iterator[Problem]:
    """EFA-only interfaces only where the EC2 guide documents them (``cluster/efa_layout.py``)."""
    for i, group, itype in _groups(groups, catalog):
        if group.efa.layout == "efa-only" and efa_enabled(group, itype) and not efa_only_documented(itype):
            families = ", ".join(sorted(EFA_ONLY_FAMILIES))
            yield Problem(
                key_path("nodeGroups", i, "efa", "layout"),
                f"the EC2 guide documents EFA-only interfaces for {families} only, not {itype.name}; "
                "allowed: 'legacy' (or omit the key)",
                "efa-only",
            )


def efa_single_subnet(groups: Sequence[NodeGroup], network: Network, catalog: Catalog) -> Iterator[Problem]:
    if len(network.subnet_ids) <= 1:
        return
    efa_groups = [g.name for _, g, t in _groups(groups, catalog) if efa_enabled(g, t)]
    if efa_groups:
        yield Problem(
            key_path("network", "subnetIds"),
            f"EFA does not work across subnets or Availability Zones (node groups with EFA: "
            f"{', '.join(efa_groups)}); give exactly one subnet, or set efa.mode: off",
            list(network.subnet_ids),
        )


def cluster_placement_supported(groups: Sequence[NodeGroup], catalog: Catalog) -> Iterator[Problem]:
    for i, group, itype in _groups(groups, catalog):
        if group.placement_group and not itype.supports_cluster_placement:
            yield Problem(
                key_path("nodeGroups", i, "placementGroup"),
                f"{itype.name} does not support cluster placement groups; allowed: false",
                True,
            )


def placement_group_with_capacity_block(groups: Sequence[NodeGroup]) -> Iterator[Problem]:
    for i, group in enumerate(groups):
        if group.placement_group and group.capacity.type == "capacity-block":
            yield Problem(
                key_path("nodeGroups", i, "placementGroup"),
                "a capacity block has its own placement; a placement group with it causes "
                "InsufficientInstanceCapacity; allowed: false (or omit the key)",
                True,
            )


def spot_with_reservation(groups: Sequence[NodeGroup]) -> Iterator[Problem]:
    for i, group in enumerate(groups):
        if group.capacity.type == "spot" and group.capacity.reservation_id is not None:
            yield Problem(
                key_path("nodeGroups", i, "capacity", "reservationId"),
                "spot capacity cannot use a reservation; remove reservationId or set capacity.type to "
                "'capacity-block' or 'capacity-reservation'",
                group.capacity.reservation_id,
            )


def reservation_id_present(groups: Sequence[NodeGroup]) -> Iterator[Problem]:
    for i, group in enumerate(groups):
        cap = group.capacity
        if cap.type in RESERVED_CAPACITY and cap.reservation_id is None:
            yield Problem(
                key_path("nodeGroups", i, "capacity", "reservationId"),
                f"required when capacity.type is '{cap.type}': the reservation id, e.g. cr-0123456789abcdef0",
            )


def usage_class_supported(groups: Sequence[NodeGroup], catalog: Catalog) -> Iterator[Problem]:
    needed = {"spot": "spot", "capacity-block": "capacity-block"}
    for i, group, itype in _groups(groups, catalog):
        usage = needed.get(group.capacity.type)
        if usage and usage not in itype.usage_classes:
            yield Problem(
                key_path("nodeGroups", i, "capacity", "type"),
                f"{itype.name} is not offered as {usage}; allowed: {', '.join(itype.usage_classes)}",
                group.capacity.type,
            )


def spot_settings_only_for_spot(groups: Sequence[NodeGroup]) -> Iterator[Problem]:
    for i, group in enumerate(groups):
        cap = group.capacity
        if cap.type != "spot" and cap.on_demand_base:
            yield Problem(
                key_path("nodeGroups", i, "capacity", "onDemandBase"),
                "only spot groups have an on-demand base; remove it or set capacity.type: spot",
                cap.on_demand_base,
            )
        if cap.on_demand_base > group.max_nodes:
            yield Problem(
                key_path("nodeGroups", i, "capacity", "onDemandBase"),
                f"must be between 0 and maxNodes ({group.max_nodes})",
                cap.on_demand_base,
            )
        if cap.spot_max_price is not None and cap.type != "spot":
            yield Problem(
                key_path("nodeGroups", i, "capacity", "spotMaxPrice"),
                "only spot groups have a maximum price; remove it or set capacity.type: spot",
                cap.spot_max_price,
            )


def capacity_block_end(groups: Sequence[NodeGroup]) -> Iterator[Problem]:
    now = _utcnow()
    for i, group in enumerate(groups):
        end = group.capacity.block_end
        if end is None:
            continue
        key = key_path("nodeGroups", i, "capacity", "blockEnd")
        shown = end.isoformat()
        if group.capacity.type != "capacity-block":
            yield Problem(
                key,
                "only capacity-block groups have an end time; remove it or set capacity.type: capacity-block",
                shown,
            )
        elif end.tzinfo is None:
            yield Problem(key, "give the time zone, e.g. 2026-12-01T11:30:00Z (the block's end in UTC)", shown)
        elif end <= now:
            yield Problem(
                key,
                f"the capacity block has ended (now is {now:%Y-%m-%dT%H:%M}Z); "
                "remove the group or give the end of a current block",
                shown,
            )
        elif end.utcoffset() is not None and _utc_year(end) > dt.MAXYEAR:
            yield Problem(key, "is past the year 9999 in UTC; give the end of a current block", shown)
        elif _lead_in_range(group):  # else capacity_block_lead reports it
            lead = group.capacity.block_end_lead_minutes or default_lead_minutes(group.drain_timeout_seconds)
            scale_down = wind_down_time(end, lead)
            if scale_down <= now:
                yield Problem(
                    key,
                    f"the group would have to scale to 0 at {scale_down:%Y-%m-%dT%H:%M}Z "
                    f"({lead} min before the end), which has passed; the block is too close to "
                    "its end to deploy",
                    shown,
                )


def _utc_year(moment: dt.datetime) -> int:
    """The UTC year of ``moment`` without converting it (9999-12-31T23:59-23:59 is year 10000 in UTC)."""
    offset = moment.utcoffset() or dt.timedelta(0)
    naive = moment.replace(tzinfo=None)
    if offset < dt.timedelta(0) and naive > dt.datetime.max + offset:
        return dt.MAXYEAR + 1
    return (naive - offset).year if naive - dt.datetime.min >= offset else dt.MINYEAR


def _lead_in_range(group: NodeGroup) -> bool:
    lead = group.capacity.block_end_lead_minutes
    return lead is None or 0 < lead <= LEAD_MINUTES_MAX


def capacity_block_lead(groups: Sequence[NodeGroup]) -> Iterator[Problem]:
    for i, group in enumerate(groups):
        lead = group.capacity.block_end_lead_minutes
        if lead is None:
            continue
        key = key_path("nodeGroups", i, "capacity", "blockEndLeadMinutes")
        drain = group.drain_timeout_seconds
        least = minimum_lead_minutes(drain)
        if group.capacity.block_end is None:
            yield Problem(
                key, "only used with capacity.blockEnd (the block's end time); add it or remove this key", lead
            )
        elif not least <= lead <= LEAD_MINUTES_MAX:
            yield Problem(
                key,
                f"allowed: {least} to {LEAD_MINUTES_MAX} minutes: AWS reclaims the nodes 30 min before the end "
                f"and draining may take drainTimeoutSeconds ({drain} s) more",
                lead,
            )


def _utcnow() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc)


def fsx_export_target(storage: Storage) -> Iterator[Problem]:
    """``exportOnDestroy: true`` exports into the checkpoint bucket, which the same destroy then empties
    and deletes unless it is protected: hours of export for nothing, in the way of a destroy that finishes."""
    fsx = storage.fsx
    if fsx is not None and fsx.export_on_destroy and not storage.checkpoint_bucket.protect:
        yield Problem(
            key_path("storage", "fsx", "exportOnDestroy"),
            "exports into the checkpoint bucket, which the destroy deletes unless storage.checkpointBucket.protect "
            "is true; set protect: true (and tear down with --keep-bucket) or leave exportOnDestroy out",
            True,
        )


def network_choice(net: Network) -> Iterator[Problem]:
    if net.vpc_id is not None and net.vpc_cidr is not None:
        yield Problem(
            key_path("network", "vpcCidr"),
            "give either vpcCidr (create a VPC) or vpcId + subnetIds (use an existing one), not both",
            net.vpc_cidr,
        )
    if net.vpc_id is not None and not net.subnet_ids:
        yield Problem(key_path("network", "subnetIds"), "required with vpcId: the private subnet(s) for the nodes")
    if net.vpc_id is None and net.subnet_ids:
        yield Problem(key_path("network", "vpcId"), "required with subnetIds: the VPC the subnets belong to")


def ssh_access(acc: Access) -> Iterator[Problem]:
    if acc.ssh_cidrs and acc.ssh_key_name is None:
        yield Problem(key_path("access", "sshKeyName"), "required with sshCidrs: the EC2 key pair name")
    if not acc.ssm and not acc.ssh_cidrs:
        yield Problem(
            key_path("access", "ssm"),
            "without SSM and without sshCidrs nobody can reach the nodes; keep ssm: true",
            False,
        )


def ami_choice(ami: Ami) -> Iterator[Problem]:
    chosen = [key for key in ("id", "flavour", "parameter") if getattr(ami, key) is not None]
    if len(chosen) > 1:
        yield Problem(
            key_path("ami", chosen[0]),
            f"give one of ami.id, ami.flavour or ami.parameter, not {' and '.join('ami.' + k for k in chosen)}",
            getattr(ami, chosen[0]),
        )


def image_pipeline_settings(
    image: ImageBuild | None, ami: Ami, network: Network, catalog: Catalog
) -> Iterator[Problem]:
    if image is None:
        return
    wheel = S3Object.parse(image.wheel_s3_uri)
    if wheel is None:
        yield Problem(
            key_path("image", "wheelS3Uri"),
            "the S3 URI of the gpucloud wheel, e.g. 's3://my-bucket/wheels/gpucloud-0.1.0-py3-none-any.whl'",
            image.wheel_s3_uri,
        )
    else:  # the same checks as a node's agent.package wheel: the image installs it the same way
        yield from _s3_wheel_problems(key_path("image", "wheelS3Uri"), image.wheel_s3_uri, wheel.bucket, wheel.key)
    for i, build_type in enumerate(image.build_instance_types):
        itype = catalog.instance_types.get(build_type)
        if itype is None or itype.gpus == 0:
            gpu_types = sorted(n for n, t in catalog.instance_types.items() if t.gpus > 0)
            yield Problem(
                key_path("image", "buildInstanceTypes", i),
                f"the image is validated on its build instance, which needs NVIDIA GPUs; one of {', '.join(gpu_types)}",
                build_type,
            )
    if network.egress == "endpoints":
        yield Problem(
            key_path("network", "egress"),
            "the image build downloads from NVIDIA, PyPI, EFA and FSx repositories; use egress 'nat' with image",
            network.egress,
        )
    if image.ami_parameter is not None and ami.parameter == image.ami_parameter:
        yield Problem(
            key_path("ami", "parameter"),
            "a stack cannot boot from the AMI its own pipeline has not built yet; "
            "build the image in its own stack (or boot a DLAMI until the first build)",
            ami.parameter,
        )


def agent_package(agent: Agent, ami: Ami) -> Iterator[Problem]:
    """The node agent's package must be installable on the node (``scripts/node-bootstrap.sh``)."""
    package = agent.package
    key = key_path("agent", "package")
    if package is None:
        if ami.id is None and ami.parameter is None:
            yield Problem(
                key,
                "required when the nodes boot a DLAMI (ami.flavour, the default), which has no "
                f"gpucloud: give {AGENT_PACKAGE_EXAMPLES}, or boot the gpucloud image (ami.parameter)",
            )
        return
    house = agent.s3_wheelhouse
    if house is not None:
        yield from _wheelhouse_problems(key, package, house.bucket, house.key)
        return
    wheel = agent.s3_wheel
    if wheel is not None:
        yield from _s3_wheel_problems(key, package, wheel.bucket, wheel.key)
        return
    if re.match(r"[a-z][a-z0-9+.-]*://", package):
        yield Problem(
            key,
            f"a URL alone is not a pip requirement; write 'gpucloud @ {package}' "
            "(or give an s3://bucket/key.whl wheel)",
            package,
        )
        return
    try:
        requirement = Requirement(package)
    except InvalidRequirement:
        yield Problem(key, f"not a pip requirement or an s3:// wheel URI; e.g. {AGENT_PACKAGE_EXAMPLES}", package)
        return
    if canonicalize_name(requirement.name) != AGENT_PROJECT:
        yield Problem(
            key, f"names the project {requirement.name!r}; the node agent is the {AGENT_PROJECT!r} package", package
        )
    elif requirement.url is not None and requirement.url.startswith("s3://"):
        yield Problem(
            key,
            "pip cannot download s3:// URLs; give the s3://bucket/key.whl URI alone "
            "(the node copies it with its instance role)",
            package,
        )


def agent_installable_offline(agent: Agent, network: Network) -> Iterator[Problem]:
    """With ``egress: endpoints`` the nodes reach AWS APIs only, never a package index: pip cannot
    fetch a requirement, nor the dependencies of an s3:// wheel. The agent comes in the AMI, or from
    a wheelhouse in S3 (reached through the S3 gateway endpoint) installed with ``--no-index``."""
    if network.egress != "endpoints" or network.existing:
        return
    if agent.package is not None and agent.s3_wheelhouse is None:
        yield Problem(
            key_path("agent", "package"),
            "egress 'endpoints' has no route to a package index, and pip needs one to install it (and "
            "gpucloud's dependencies); give a wheelhouse (s3://bucket/folder/ holding gpucloud and every "
            "dependency), boot the gpucloud image (ami.parameter) without it, or use egress 'nat'",
            agent.package,
        )


def fsx_client_offline(fsx: Fsx | None, network: Network, ami: Ami) -> Iterator[Problem]:
    """A DLAMI node installs the FSx for Lustre client at boot from AWS's package repository
    (``scripts/node-bootstrap.sh``, install_lustre_client), which ``egress: endpoints`` cannot
    reach: every node's bootstrap would fail at the mount. The gpucloud image brings the client."""
    if network.egress != "endpoints" or network.existing or fsx is None:
        return
    if ami.parameter is None and ami.id is None:
        yield Problem(
            key_path("storage", "fsx"),
            "egress 'endpoints' has no route to the FSx for Lustre client's package repository, which a "
            "node booting the DLAMI (ami.flavour, the default) installs the client from; boot the gpucloud "
            "image (ami.parameter), which has the client, or use egress 'nat'",
        )


def _wheelhouse_problems(key: str, package: str, bucket: str, prefix: str) -> Iterator[Problem]:
    if not BUCKET_RE.fullmatch(bucket) or "//" in prefix:
        yield Problem(
            key,
            "a wheelhouse URI names a bucket and a folder, e.g. 's3://my-artifacts/wheelhouse/gpucloud-0.1.0/'",
            package,
        )
    elif "*" in prefix or "?" in prefix:
        yield Problem(
            key,
            "no '*' or '?' in the folder: the stack grants s3:GetObject under exactly it, and IAM would read them "
            "as wildcards",
            package,
        )


def _s3_wheel_problems(key: str, package: str, bucket: str, object_key: str) -> Iterator[Problem]:
    if not BUCKET_RE.fullmatch(bucket) or not object_key or object_key.endswith("/"):
        yield Problem(
            key,
            "an s3:// wheel URI names a bucket and one .whl object, e.g. "
            "'s3://my-artifacts/wheels/gpucloud-0.1.0-py3-none-any.whl'",
            package,
        )
        return
    if "*" in object_key or "?" in object_key:
        yield Problem(
            key,
            "no '*' or '?' in the key: the stack grants s3:GetObject on exactly this object, "
            "and IAM would read them as wildcards",
            package,
        )
        return
    file_name = object_key.rsplit("/", 1)[-1]
    try:
        project = parse_wheel_filename(file_name)[0]
    except InvalidWheelFilename:
        yield Problem(
            key,
            "the object must keep the file name pip wheel gave it, "
            "gpucloud-<version>-<python>-<abi>-<platform>.whl: pip reads the project and "
            "version from it",
            package,
        )
        return
    if project != AGENT_PROJECT:
        yield Problem(key, f"a wheel of {project!r}; the node agent is the {AGENT_PROJECT!r} package", package)


def tag_keys(tags: Mapping[str, str]) -> Iterator[Problem]:
    for key in tags:
        if key.lower().startswith(TAG_KEY_RESERVED) or not 1 <= len(key) <= TAG_KEY_MAX_CHARS:
            yield Problem(
                key_path("tags", key),
                f"tag keys are 1-{TAG_KEY_MAX_CHARS} characters and may not start with 'aws:' or 'gpucloud:' "
                "(gpucloud sets gpucloud:stack and gpucloud:cluster itself)",
                key,
            )


def tag_values(tags: Mapping[str, str]) -> Iterator[Problem]:
    for key, value in tags.items():
        if len(value) > TAG_VALUE_MAX_CHARS:
            yield Problem(key_path("tags", key), f"tag values are at most {TAG_VALUE_MAX_CHARS} characters", value)


# The characters every AWS service accepts in tags (EC2 alone allows more): letters, digits and
# white space in UTF-8, and + - = . _ : / @ (https://docs.aws.amazon.com/tag-editor/latest/userguide/tagging.html).
TAG_CHARACTERS_RE = re.compile(r"[\w\s+\-=.:/@]*")


def tag_characters(tags: Mapping[str, str]) -> Iterator[Problem]:
    for key, value in tags.items():
        for what, text in (("key", key), ("value", value)):
            if not TAG_CHARACTERS_RE.fullmatch(text):
                yield Problem(
                    key_path("tags", key),
                    f"a tag {what} holds letters, digits, spaces and + - = . _ : / @ only (what every AWS "
                    "service accepts)",
                    text,
                )


def tag_count(tags: Mapping[str, str]) -> Iterator[Problem]:
    """AWS takes 50 tags on a resource; gpucloud adds up to ``OWN_TAGS_MAX`` of its own."""
    room = MAX_RESOURCE_TAGS - OWN_TAGS_MAX
    if len(tags) > room:
        yield Problem(
            key_path("tags"),
            f"{len(tags)} tags; at most {room}: AWS takes {MAX_RESOURCE_TAGS} on a resource and "
            f"gpucloud adds up to {OWN_TAGS_MAX} (stack, cluster, Name, node group, expiry)",
        )


def drillable_groups(spec: ClusterSpec) -> list[str]:
    """The node groups a drill job can run on and get interrupted in: spot, with room above their
    on-demand base (stack order; ``gpucloud drill`` submits to the first)."""
    return _drillable(spec.node_groups)


def _drillable(groups: Sequence[NodeGroup]) -> list[str]:
    return [g.name for g in groups if g.capacity.type == "spot" and g.max_nodes > g.capacity.on_demand_base]


def drill_needs_spot(drill: bool, groups: Sequence[NodeGroup]) -> Iterator[Problem]:
    """``drill: true`` makes an AWS FIS template that interrupts a *spot* instance (infra/drill.py):
    some group must be able to run one (spot, with room above its on-demand base)."""
    if drill and not _drillable(groups):
        yield Problem(
            key_path("drill"),
            "needs a node group with capacity.type: spot and maxNodes above its onDemandBase "
            "(the drill interrupts a spot instance); add one or remove gpucloud:drill",
            drill,
        )


def printable_text(spec: ClusterSpec) -> Iterator[Problem]:
    """No setting holds a line break or other control character: each ends up in a name, a tag,
    a script or a log line, where 'dev\\n' is not 'dev' (an ASG named 'dev\\n-asg')."""
    for path, text in _strings(spec.model_dump(by_alias=True, exclude_none=True), ()):
        if not text.isprintable() and any(unicodedata.category(c) in ("Cc", "Cf", "Zl", "Zp") for c in text):
            yield Problem(key_path(*path), "no line breaks or other control characters allowed", text)


def _strings(data: object, path: tuple[str | int, ...]) -> Iterator[tuple[tuple[str | int, ...], str]]:
    """Every string in the dumped spec (keys of ``tags`` included) with its key path."""
    if isinstance(data, str):
        yield path, data
    elif isinstance(data, dict):
        for key, value in data.items():
            if path == ("tags",):
                yield (*path, key), key
            yield from _strings(value, (*path, key))
    elif isinstance(data, list):
        for index, item in enumerate(data):
            yield from _strings(item, (*path, index))


def cost_ceiling(
    ceiling: float | None, region: str, groups: Sequence[NodeGroup], catalog: Catalog
) -> Iterator[Problem]:
    if ceiling is None:
        return
    sizings = [sizing_for(g, t) for _, g, t in _groups(groups, catalog)]
    # The stack's own region's prices: on-demand rates differ by region (us-west-2 is not us-east-1's).
    regional = catalog.region_prices(region)
    if regional is None:
        return  # no prices for the region (or not a region): plan warns that node costs are unknown
    priced = regional.instance_types
    unknown = [
        s.instance_type.name
        for s in sizings
        if (entry := priced.get(s.instance_type.name)) is None or entry.on_demand_usd_per_hour is None
    ]
    if unknown:
        yield Problem(
            key_path("costCeilingUsdPerHour"),
            f"cannot check: no on-demand price in the catalog for {', '.join(sorted(set(unknown)))} in {region}; "
            f"run `gpucloud catalog refresh --region {region}` or remove the ceiling",
            ceiling,
        )
        return
    worst = estimate_cost(sizings, region=region, catalog=catalog).on_demand.max
    if worst is not None and worst > ceiling:
        yield Problem(
            key_path("costCeilingUsdPerHour"),
            f"max nodes at on-demand price in {region} cost {worst:.2f} USD/hour, above the ceiling; "
            "lower maxNodes or raise the ceiling",
            ceiling,
        )


def monitoring_instance_type(mon: Monitoring) -> Iterator[Problem]:
    """The self-hosted monitor's type must be one `plan` can price (catalog/service_prices.json)."""
    known = monitor_instance_types()
    if mon.mode == "self-hosted" and mon.instance_type not in known:
        yield Problem(
            key_path("monitoring", "instanceType"),
            f"not a monitor instance type gpucloud knows; allowed: {', '.join(known)}",
            mon.instance_type,
        )


def monitoring_alert_emails(mon: Monitoring) -> Iterator[Problem]:
    if mon.alert_emails and mon.mode == "off":
        yield Problem(
            key_path("monitoring", "alertEmails"),
            "alerts need a monitor: set monitoring.mode to self-hosted or managed, or remove alertEmails",
            mon.alert_emails,
        )
        return
    yield from _emails_once(("monitoring", "alertEmails"), mon.alert_emails)


def _emails_once(where: tuple[str, str], emails: Sequence[str]) -> Iterator[Problem]:
    seen: set[str] = set()
    for j, email in enumerate(emails):
        if email.lower() in seen:
            yield Problem(key_path(*where, j), "given twice; list each address once (SNS subscribes it once)", email)
        seen.add(email.lower())


def monitoring_managed_grafana(mon: Monitoring) -> Iterator[Problem]:
    if mon.managed_grafana and mon.mode != "managed":
        yield Problem(
            key_path("monitoring", "managedGrafana"),
            f"Amazon Managed Grafana reads Amazon Managed Prometheus: it needs monitoring.mode managed "
            f"(mode is {mon.mode}; self-hosted runs its own Grafana)",
            mon.managed_grafana,
        )


def monitoring_daily_report(mon: Monitoring, agent: Agent) -> Iterator[Problem]:
    """The daily report runs on the self-hosted monitor, which installs gpucloud from agent.package."""
    if mon.daily_report is not True:
        return
    if mon.mode != "self-hosted":
        yield Problem(
            key_path("monitoring", "dailyReport"),
            f"the daily report runs on the self-hosted monitor instance: it needs monitoring.mode self-hosted "
            f"(mode is {mon.mode}, which has no instance to run it); run `gpucloud report` yourself, or set false",
            mon.daily_report,
        )
    elif agent.package is None:
        yield Problem(
            key_path("monitoring", "dailyReport"),
            "the monitor installs gpucloud from gpucloud:agent.package, and the stack sets none; set agent.package "
            "to an s3:// wheel or wheelhouse or a pip requirement, or set dailyReport false",
            mon.daily_report,
        )


AMP_MAX_RETENTION_DAYS = (
    1095  # https://docs.aws.amazon.com/prometheus/latest/userguide/AMP-workspace-configuration.html
)


def monitoring_managed_retention(mon: Monitoring) -> Iterator[Problem]:
    if mon.mode == "managed" and mon.retention_days > AMP_MAX_RETENTION_DAYS:
        yield Problem(
            key_path("monitoring", "retentionDays"),
            f"Amazon Managed Prometheus keeps metrics at most {AMP_MAX_RETENTION_DAYS} days; "
            f"allowed with mode managed: at most {AMP_MAX_RETENTION_DAYS}",
            mon.retention_days,
        )


def monitoring_egress(mode: MonitoringMode, network: Network) -> Iterator[Problem]:
    """The monitor downloads Prometheus, Alertmanager and Grafana at first boot, and managed nodes
    remote-write to the AMP endpoint: both need the NAT gateway (the endpoints egress has neither)."""
    if mode != "off" and network.egress != "nat" and not network.existing:
        yield Problem(
            key_path("monitoring", "mode"),
            f"{mode} monitoring needs network.egress nat (the endpoints egress reaches no package "
            "downloads and has no Amazon Managed Prometheus endpoint); set egress: nat or mode: off",
            mode,
        )


def budget_alert_percents(budget: Budget | None) -> Iterator[Problem]:
    if budget is None:
        return
    seen: set[float] = set()
    for j, percent in enumerate(budget.alert_at_percent):
        if percent in seen:
            yield Problem(
                key_path("budget", "alertAtPercent", j),
                "given twice; list each percentage once (one notification each)",
                percent,
            )
        seen.add(percent)


def budget_stop_scale_out(budget: Budget | None, groups: Sequence[NodeGroup], network: Network) -> Iterator[Problem]:
    """stop-scale-out acts on the groups' scale-out (with none scaling there is nothing to stop), and
    the agents read the budget from the AWS Budgets API, which the endpoints egress does not reach
    (no VPC endpoint for it among network.py's)."""
    if budget is None or budget.on_exceeded != "stop-scale-out":
        return
    key = key_path("budget", "onExceeded")
    if not any(g.scaling.enabled for g in groups):
        yield Problem(
            key,
            "no node group scales out (every scaling.enabled is false); use notify, or enable scaling",
            "stop-scale-out",
        )
    elif network.egress != "nat" and not network.existing:
        yield Problem(
            key,
            "the nodes read the budget from the AWS Budgets API, which network.egress endpoints does not reach; "
            "set egress: nat or onExceeded: notify",
            "stop-scale-out",
        )


def budget_alert_destination(budget: Budget | None, mon: Monitoring) -> Iterator[Problem]:
    """The budget's notifications go to its SNS topic: someone must be subscribed to it."""
    if budget is None:
        return
    if not budget.alert_emails and not mon.alert_emails:
        yield Problem(
            key_path("budget", "alertEmails"),
            "budget alerts need somewhere to go: list budget.alertEmails (or monitoring.alertEmails)",
            budget.alert_emails,
        )
    yield from _emails_once(("budget", "alertEmails"), budget.alert_emails)


def sizing_for(group: NodeGroup, itype: InstanceType) -> GroupSizing:
    return GroupSizing(
        name=group.name,
        instance_type=itype,
        capacity_type=group.capacity.type,
        min_nodes=group.min_nodes,
        desired_nodes=group.desired,
        max_nodes=group.max_nodes,
        on_demand_base=group.capacity.on_demand_base if group.capacity.type == "spot" else 0,
    )


def check(spec: ClusterSpec, catalog: Catalog) -> list[Problem]:
    """Every problem every rule finds, in this order."""
    groups, net, mon = spec.node_groups, spec.network, spec.monitoring
    found = [
        *availability_zone_in_region(spec.region, spec.availability_zone),
        *cluster_zones(spec.region, spec.availability_zone, spec.availability_zones, net),
        *at_least_one_group(groups),
        *group_names(groups),
        *known_instance_type(groups, catalog),
        *instance_mix(groups, catalog),
        *instance_mix_capabilities(groups, catalog),
        *group_zones(groups, spec.availability_zones, net, catalog),
        *node_counts(groups),
        *efa_supported(groups, catalog),
        *efa_only_layout_documented(groups, catalog),
        *efa_single_subnet(groups, net, catalog),
        *cluster_placement_supported(groups, catalog),
        *placement_group_with_capacity_block(groups),
        *spot_with_reservation(groups),
        *reservation_id_present(groups),
        *usage_class_supported(groups, catalog),
        *spot_settings_only_for_spot(groups),
        *capacity_block_end(groups),
        *capacity_block_lead(groups),
        *fsx_export_target(spec.storage),
        *network_choice(net),
        *ssh_access(spec.access),
        *ami_choice(spec.ami),
        *image_pipeline_settings(spec.image, spec.ami, net, catalog),
        *agent_package(spec.agent, spec.ami),
        *agent_installable_offline(spec.agent, net),
        *fsx_client_offline(spec.storage.fsx, net, spec.ami),
        *tag_keys(spec.tags),
        *tag_values(spec.tags),
        *tag_characters(spec.tags),
        *tag_count(spec.tags),
        *drill_needs_spot(spec.drill, groups),
        *cost_ceiling(spec.cost_ceiling_usd_per_hour, spec.region, groups, catalog),
        *monitoring_instance_type(mon),
        *monitoring_alert_emails(mon),
        *monitoring_managed_grafana(mon),
        *monitoring_daily_report(mon, spec.agent),
        *monitoring_managed_retention(mon),
        *monitoring_egress(mon.mode, net),
        *budget_alert_percents(spec.budget),
        *budget_stop_scale_out(spec.budget, groups, net),
        *budget_alert_destination(spec.budget, mon),
    ]
    # The catch-all comes last and skips keys already reported ('dev\n' breaks the name rule too).
    reported = {p.key for p in found}
    return found + [p for p in printable_text(spec) if p.key not in reported]
