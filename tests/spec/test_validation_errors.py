"""Every validation rule, triggered through `gpucloud plan --stack-file`: one line, exit 2, no traceback."""

from __future__ import annotations

import datetime as dt
import inspect
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from gpucloud.cli import main
from gpucloud.spec import load_stack_file, rules

Mutation = Callable[[dict[str, Any]], None]


def _set(path: str, value: Any) -> Mutation:
    """_set("gpucloud:nodeGroups.1.capacity.type", "x") sets that key of the base config."""

    def mutate(config: dict[str, Any]) -> None:
        head, *rest = path.split(".")
        node: Any = config
        keys: list[Any] = [head] + [int(p) if p.isdigit() else p for p in rest]
        for key in keys[:-1]:
            node = node[key]
        node[keys[-1]] = value

    return mutate


def _drop(key: str) -> Mutation:
    return lambda config: config.pop(key)


def _both(*mutations: Mutation) -> Mutation:
    def mutate(config: dict[str, Any]) -> None:
        for m in mutations:
            m(config)

    return mutate


CR = "cr-0123456789abcdef0"
G1 = "gpucloud:nodeGroups.1"
FUTURE = "2099-01-01T00:00:00Z"


def _minutes_from_now(minutes: int) -> str:
    return (dt.datetime.now(dt.timezone.utc) + dt.timedelta(minutes=minutes)).strftime("%Y-%m-%dT%H:%M:%SZ")


def _block(end: str | dt.date | None = None, **more: Any) -> dict[str, Any]:
    """A capacity-block ``capacity`` section for node group 1 (p4d.24xlarge)."""
    capacity: dict[str, Any] = {"type": "capacity-block", "reservationId": CR, **more}
    if end is not None:
        capacity["blockEnd"] = end
    return capacity


# (rule that must fire or None for schema errors, mutation, key shown, text that must appear)
CASES: dict[str, tuple[str | None, Mutation, str, str]] = {
    "unknown-instance-type": (
        "known_instance_type",
        _set("gpucloud:nodeGroups.0.instanceType", "p5.24xlarge"),
        "gpucloud:nodeGroups[0].instanceType = 'p5.24xlarge'",
        "known types: g5.12xlarge",
    ),
    "efa-unsupported": (
        "efa_supported",
        _set("gpucloud:nodeGroups.0.efa", {"mode": "on"}),
        "gpucloud:nodeGroups[0].efa.mode",
        "g6.xlarge does not support EFA",
    ),
    "zone-and-zones": (
        "cluster_zones",
        _set("gpucloud:availabilityZones", ["us-east-1a", "us-east-1b"]),
        "gpucloud:availabilityZones",
        "give availabilityZone (one zone) or availabilityZones (several), not both",
    ),
    "efa-group-in-two-zones": (
        "group_zones",
        _both(
            _drop("gpucloud:availabilityZone"),
            _set("gpucloud:availabilityZones", ["us-east-1a", "us-east-1b"]),
            _set(f"{G1}.availabilityZones", ["us-east-1a", "us-east-1b"]),
        ),
        "gpucloud:nodeGroups[1].availabilityZones",
        "EFA traffic does not cross Availability Zones and a cluster placement group lies in one zone",
    ),
    "instance-types-not-spot": (
        "instance_mix",
        _both(
            _set("gpucloud:nodeGroups.0.capacity", {"type": "on-demand"}),
            _set("gpucloud:nodeGroups.0.instanceTypes", [{"instanceType": "g6.xlarge"}, {"instanceType": "g5.xlarge"}]),
        ),
        "gpucloud:nodeGroups[0].instanceTypes",
        "several instance types are for spot groups",
    ),
    "instance-types-without-efa": (
        "instance_mix_capabilities",
        _set(f"{G1}.instanceTypes", [{"instanceType": "p4d.24xlarge"}, {"instanceType": "g6.xlarge"}]),
        "gpucloud:nodeGroups[1].instanceTypes[1].instanceType",
        "the group uses EFA (p4d.24xlarge has it) and g6.xlarge has none",
    ),
    "efa-only-undocumented": (
        "efa_only_layout_documented",
        _set(f"{G1}.efa", {"mode": "on", "layout": "efa-only"}),
        "gpucloud:nodeGroups[1].efa.layout = 'efa-only'",
        "documents EFA-only interfaces for p5, p5e, p5en only, not p4d.24xlarge; allowed: 'legacy'",
    ),
    "efa-several-subnets": (
        "efa_single_subnet",
        _set("gpucloud:network", {"vpcId": "vpc-0123abcd", "subnetIds": ["subnet-0123abcd", "subnet-0456abcd"]}),
        "gpucloud:network.subnetIds",
        "EFA does not work across subnets",
    ),
    "placement-with-capacity-block": (
        "placement_group_with_capacity_block",
        _both(
            _set(f"{G1}.capacity", {"type": "capacity-block", "reservationId": CR}), _set(f"{G1}.placementGroup", True)
        ),
        "gpucloud:nodeGroups[1].placementGroup = True",
        "capacity block",
    ),
    "placement-unsupported": (
        "cluster_placement_supported",
        _both(_set("gpucloud:nodeGroups.0.placementGroup", True), lambda c: None),
        "",
        "",
    ),  # replaced below: every catalog type supports cluster placement
    "spot-with-reservation": (
        "spot_with_reservation",
        _set(f"{G1}.capacity.reservationId", CR),
        "gpucloud:nodeGroups[1].capacity.reservationId",
        "spot capacity cannot use a reservation",
    ),
    "reservation-without-id": (
        "reservation_id_present",
        _set(f"{G1}.capacity", {"type": "capacity-reservation"}),
        "gpucloud:nodeGroups[1].capacity.reservationId",
        "required when capacity.type",
    ),
    "reservation-id-format": (
        None,
        _set(f"{G1}.capacity", {"type": "capacity-block", "reservationId": "cr-123"}),
        "= 'cr-123'",
        "17 hex digits",
    ),
    "usage-class": (
        "usage_class_supported",
        _set("gpucloud:nodeGroups.0.capacity", {"type": "capacity-block", "reservationId": CR}),
        "gpucloud:nodeGroups[0].capacity.type",
        "g6.xlarge is not offered as capacity-block",
    ),
    "on-demand-base-not-spot": (
        "spot_settings_only_for_spot",
        _set(f"{G1}.capacity", {"type": "on-demand", "onDemandBase": 1}),
        "gpucloud:nodeGroups[1].capacity.onDemandBase",
        "only spot groups",
    ),
    "fsx-size": (
        None,
        _set("gpucloud:storage.fsx.sizeGiB", 3000),
        "gpucloud:storage.fsx.sizeGiB = 3000",
        "1200 or a multiple of 2400",
    ),
    "fsx-throughput": (
        None,
        _set("gpucloud:storage.fsx.throughputPerTiB", 200),
        "gpucloud:storage.fsx.throughputPerTiB = 200",
        "allowed: 125, 250, 500, 1000",
    ),
    "fsx-path": (
        None,
        _set("gpucloud:storage.fsx.mountPath", "fsx"),
        "gpucloud:storage.fsx.mountPath",
        "an absolute path",
    ),
    "fsx-export-into-a-deleted-bucket": (
        "fsx_export_target",
        _set("gpucloud:storage.fsx.exportOnDestroy", True),
        "gpucloud:storage.fsx.exportOnDestroy = True",
        "which the destroy deletes unless storage.checkpointBucket.protect is true",
    ),
    "negative-count": (
        None,
        _set("gpucloud:nodeGroups.0.minNodes", -1),
        "gpucloud:nodeGroups[0].minNodes = -1",
        "too small; allowed: 0 to 5000 nodes",
    ),
    "min-above-desired": (
        "node_counts",
        _set("gpucloud:nodeGroups.0.minNodes", 2),
        "gpucloud:nodeGroups[0]",
        "minNodes <= desiredNodes <= maxNodes, got 2 <= 1 <= 2",
    ),
    "max-zero": (
        None,
        _both(_set("gpucloud:nodeGroups.0.maxNodes", 0), _set("gpucloud:nodeGroups.0.desiredNodes", 0)),
        "gpucloud:nodeGroups[0].maxNodes = 0",
        "too small; allowed: 1 to 5000 nodes",
    ),
    "cidr-invalid": (
        None,
        _set("gpucloud:network.vpcCidr", "10.0.0.300/16"),
        "gpucloud:network.vpcCidr = '10.0.0.300/16'",
        "not a valid IPv4 network",
    ),
    "cidr-host-bits": (
        None,
        _set("gpucloud:network.vpcCidr", "10.0.0.1/16"),
        "gpucloud:network.vpcCidr",
        "host bits zero",
    ),
    "cidr-too-small": (
        None,
        _set("gpucloud:network.vpcCidr", "10.0.0.0/26"),
        "gpucloud:network.vpcCidr",
        "/16 to /24",
    ),
    "cost-ceiling": (
        "cost_ceiling",
        _set("gpucloud:costCeilingUsdPerHour", 10),
        "gpucloud:costCeilingUsdPerHour = 10",
        "max nodes at on-demand price in us-east-1 cost 45.52 USD/hour, above the ceiling",
    ),
    "cost-ceiling-unknown-price": (
        "cost_ceiling",
        _set("gpucloud:nodeGroups.0.instanceType", "p5e.48xlarge"),
        "gpucloud:costCeilingUsdPerHour",
        "no on-demand price in the catalog for p5e",
    ),
    "group-name": (
        None,
        _set("gpucloud:nodeGroups.0.name", "Dev Group"),
        "gpucloud:nodeGroups[0].name",
        "lower-case letters",
    ),
    "group-name-duplicate": (
        "group_names",
        _set("gpucloud:nodeGroups.1.name", "dev"),
        "gpucloud:nodeGroups[1].name = 'dev'",
        "must be unique",
    ),
    "no-groups": (
        "at_least_one_group",
        _set("gpucloud:nodeGroups", []),
        "gpucloud:nodeGroups",
        "at least one node group",
    ),
    "cluster-name": (
        None,
        _set("gpucloud:clusterName", "My_Cluster"),
        "gpucloud:clusterName",
        "lower-case letters",
    ),
    "region": (
        None,
        _both(_set("aws:region", "useast1"), _drop("gpucloud:availabilityZone")),
        "aws:region = 'useast1'",
        "not an AWS region",
    ),
    "az-other-region": (
        "availability_zone_in_region",
        _set("gpucloud:availabilityZone", "eu-west-1a"),
        "gpucloud:availabilityZone = 'eu-west-1a'",
        "must be a zone of region us-east-1",
    ),
    "root-volume": (
        None,
        _set("gpucloud:nodeGroups.0.rootVolumeGiB", 8),
        "gpucloud:nodeGroups[0].rootVolumeGiB = 8",
        "30 to 16384",
    ),
    "checkpoint-days": (
        None,
        _set("gpucloud:storage.checkpointBucket", {"expiryDays": 0}),
        "gpucloud:storage.checkpointBucket.expiryDays = 0",
        "too small; allowed: at least 1 (days)",
    ),
    "vpc-and-cidr": (
        "network_choice",
        _set("gpucloud:network", {"vpcCidr": "10.0.0.0/16", "vpcId": "vpc-0123abcd", "subnetIds": ["subnet-0123abcd"]}),
        "gpucloud:network.vpcCidr",
        "either vpcCidr",
    ),
    "subnets-without-vpc": (
        "network_choice",
        _set("gpucloud:network", {"subnetIds": ["subnet-0123abcd"]}),
        "gpucloud:network.vpcId",
        "required with subnetIds",
    ),
    "ssh-open-world": (
        None,
        _set("gpucloud:access", {"sshKeyName": "me", "sshCidrs": ["0.0.0.0/0"]}),
        "gpucloud:access.sshCidrs[0] = '0.0.0.0/0'",
        "not allowed",
    ),
    "ssh-cidrs-without-key": (
        "ssh_access",
        _set("gpucloud:access", {"sshCidrs": ["10.1.0.0/16"]}),
        "gpucloud:access.sshKeyName",
        "required with sshCidrs: the EC2 key pair name",
    ),
    "ami-both": (
        "ami_choice",
        _set("gpucloud:ami", {"id": "ami-0123456789abcdef0", "flavour": "x"}),
        "gpucloud:ami.id",
        "one of ami.id, ami.flavour or ami.parameter, not ami.id and ami.flavour",
    ),
    "ami-parameter": (
        None,
        _set("gpucloud:ami", {"parameter": "gpucloud/ami"}),
        "gpucloud:ami.parameter = 'gpucloud/ami'",
        "starting with '/'",
    ),
    "image-wheel": (
        "image_pipeline_settings",
        _set("gpucloud:image", {"wheelS3Uri": "https://x/gpucloud.whl"}),
        "gpucloud:image.wheelS3Uri = 'https://x/gpucloud.whl'",
        "S3 URI of the gpucloud wheel",
    ),
    "image-wheel-renamed": (
        "image_pipeline_settings",
        _set("gpucloud:image", {"wheelS3Uri": "s3://wheels-bucket/agent.whl"}),
        "gpucloud:image.wheelS3Uri = 's3://wheels-bucket/agent.whl'",
        "must keep the file name pip wheel gave it",
    ),
    "image-build-type": (
        "image_pipeline_settings",
        _set(
            "gpucloud:image",
            {"wheelS3Uri": "s3://wheels-bucket/gpucloud-0.1.0-py3-none-any.whl", "buildInstanceTypes": ["m5.large"]},
        ),
        "gpucloud:image.buildInstanceTypes[0] = 'm5.large'",
        "needs NVIDIA GPUs",
    ),
    "image-own-parameter": (
        "image_pipeline_settings",
        _both(
            _set(
                "gpucloud:image",
                {
                    "wheelS3Uri": "s3://wheels-bucket/gpucloud-0.1.0-py3-none-any.whl",
                    "amiParameter": "/gpucloud/x/ami-id",
                },
            ),
            _set("gpucloud:ami", {"parameter": "/gpucloud/x/ami-id"}),
        ),
        "gpucloud:ami.parameter = '/gpucloud/x/ami-id'",
        "its own pipeline has not built yet",
    ),
    "ami-id": (None, _set("gpucloud:ami", {"id": "ami-xyz"}), "gpucloud:ami.id = 'ami-xyz'", "8 or 17 hex"),
    "agent-package-without-internet": (
        "agent_installable_offline",
        _both(
            _set("gpucloud:network", {"vpcCidr": "10.20.0.0/16", "egress": "endpoints"}),
            lambda config: config["gpucloud:storage"].pop("fsx"),  # its client: the case below
        ),
        "gpucloud:agent.package = 's3://wheels-bucket/gpucloud-0.1.0-py3-none-any.whl'",
        "egress 'endpoints' has no route to a package index",
    ),
    "fsx-client-without-internet": (
        "fsx_client_offline",
        _both(
            _set("gpucloud:network", {"vpcCidr": "10.20.0.0/16", "egress": "endpoints"}),
            _set("gpucloud:agent.package", "s3://wheels-bucket/wheelhouse/"),  # the agent itself is installable
        ),
        "gpucloud:storage.fsx",
        "no route to the FSx for Lustre client's package repository",
    ),
    "tag-characters": (
        "tag_characters",
        _set("gpucloud:tags", {"team": "ml<research>"}),
        "gpucloud:tags.team = 'ml<research>'",
        "letters, digits, spaces and + - = . _ : / @ only",
    ),
    "tag-count": (
        "tag_count",
        _set("gpucloud:tags", {f"k{i}": "v" for i in range(46)}),
        "gpucloud:tags",
        "46 tags; at most 45",
    ),
    "agent-package-missing": (
        "agent_package",
        _drop("gpucloud:agent"),
        "gpucloud:agent.package",
        "required when the nodes boot a DLAMI (ami.flavour, the default), which has no gpucloud",
    ),
    "agent-package-url-alone": (
        "agent_package",
        _set("gpucloud:agent.package", "https://example.com/gpucloud.whl"),
        "gpucloud:agent.package = 'https://example.com/gpucloud.whl'",
        "write 'gpucloud @ https://example.com/gpucloud.whl'",
    ),
    "agent-package-not-a-requirement": (
        "agent_package",
        _set("gpucloud:agent.package", "gpucloud from s3"),
        "gpucloud:agent.package = 'gpucloud from s3'",
        "not a pip requirement or an s3:// wheel URI; e.g. 's3://",
    ),
    "agent-package-other-project": (
        "agent_package",
        _set("gpucloud:agent.package", "requests==2.32"),
        "gpucloud:agent.package = 'requests==2.32'",
        "names the project 'requests'; the node agent is the 'gpucloud' package",
    ),
    "agent-package-s3-direct-reference": (
        "agent_package",
        _set("gpucloud:agent.package", "gpucloud @ s3://b1/g.whl"),
        "gpucloud:agent.package",
        "pip cannot download s3:// URLs",
    ),
    "agent-package-s3-no-key": (
        "agent_package",
        _set("gpucloud:agent.package", "s3://wheels-bucket/"),
        "gpucloud:agent.package = 's3://wheels-bucket/'",
        "names a bucket and one .whl object",
    ),
    "agent-package-s3-bad-bucket": (
        "agent_package",
        _set("gpucloud:agent.package", "s3://Wheels_Bucket/gpucloud-0.1.0-py3-none-any.whl"),
        "gpucloud:agent.package",
        "names a bucket and one .whl object",
    ),
    "agent-package-s3-wildcard": (
        "agent_package",
        _set("gpucloud:agent.package", "s3://wheels-bucket/*/gpucloud-0.1.0-py3-none-any.whl"),
        "gpucloud:agent.package",
        "IAM would read them as wildcards",
    ),
    "agent-package-s3-renamed-wheel": (
        "agent_package",
        _set("gpucloud:agent.package", "s3://wheels-bucket/agent.whl"),
        "gpucloud:agent.package = 's3://wheels-bucket/agent.whl'",
        "must keep the file name pip wheel gave it",
    ),
    "agent-package-s3-other-wheel": (
        "agent_package",
        _set("gpucloud:agent.package", "s3://wheels-bucket/requests-2.32.0-py3-none-any.whl"),
        "gpucloud:agent.package",
        "a wheel of 'requests'",
    ),
    "tag-reserved": (
        "tag_keys",
        _set("gpucloud:tags", {"gpucloud:stack": "x"}),
        "gpucloud:tags.gpucloud:stack",
        "may not start with",
    ),
    "job-plane": (
        None,
        _set("gpucloud:jobPlane", {"maxReceiveCount": 0}),
        "gpucloud:jobPlane.maxReceiveCount = 0",
        "1 to 1000",
    ),
    "scaling-idle": (
        None,
        _set("gpucloud:nodeGroups.0.scaling", {"idleMinutes": 0}),
        "gpucloud:nodeGroups[0].scaling.idleMinutes = 0",
        "allowed: 1 to 1440 minutes",
    ),
    "scaling-warmup": (
        None,
        _set("gpucloud:nodeGroups.0.scaling", {"instanceWarmupSeconds": -5}),
        "gpucloud:nodeGroups[0].scaling.instanceWarmupSeconds = -5",
        "allowed: 0 to 3600 seconds",
    ),
    "block-end-past": (
        "capacity_block_end",
        _set(f"{G1}.capacity", _block(end="2020-01-01T00:00:00Z")),
        "gpucloud:nodeGroups[1].capacity.blockEnd = '2020-01-01T00:00:00+00:00'",
        "the capacity block has ended",
    ),
    "block-end-no-zone": (
        "capacity_block_end",
        _set(f"{G1}.capacity", _block(end="2099-01-01T00:00:00")),
        "gpucloud:nodeGroups[1].capacity.blockEnd",
        "give the time zone",
    ),
    "block-end-too-close": (
        "capacity_block_end",
        _set(f"{G1}.capacity", _block(end=_minutes_from_now(20))),
        "gpucloud:nodeGroups[1].capacity.blockEnd",
        "45 min before the end), which has passed",
    ),
    "block-end-not-a-block": (
        "capacity_block_end",
        _set("gpucloud:nodeGroups.0.capacity.blockEnd", FUTURE),
        "gpucloud:nodeGroups[0].capacity.blockEnd",
        "only capacity-block groups have an end",
    ),
    "block-lead-short": (
        "capacity_block_lead",
        _set(f"{G1}.capacity", _block(end=FUTURE, blockEndLeadMinutes=20)),
        "gpucloud:nodeGroups[1].capacity.blockEndLeadMinutes = 20",
        "allowed: 40 to 1440 minutes",
    ),
    "block-lead-without-end": (
        "capacity_block_lead",
        _set(f"{G1}.capacity", _block(blockEndLeadMinutes=60)),
        "gpucloud:nodeGroups[1].capacity.blockEndLeadMinutes = 60",
        "only used with capacity.blockEnd",
    ),
    "block-end-not-a-time": (
        None,
        _set(f"{G1}.capacity", _block(end="next tuesday")),
        "gpucloud:nodeGroups[1].capacity.blockEnd = 'next tuesday'",
        "not a time; expected an ISO 8601 time with zone, e.g. 2026-12-01T11:30:00Z",
    ),
    "block-end-date-only": (
        None,
        _set(f"{G1}.capacity", _block(end=dt.date(2099, 1, 1))),
        "gpucloud:nodeGroups[1].capacity.blockEnd",
        "a date without a time",
    ),
    "scaling-typo": (
        None,
        _set("gpucloud:nodeGroups.0.scaling", {"idleMinute": 5}),
        "gpucloud:nodeGroups[0].scaling.idleMinute",
        "did you mean 'idleMinutes'?",
    ),
    # schema errors (pydantic), formatted the same way
    "typo-top-level": (
        None,
        _set("gpucloud:costCeilingUSD", 5),
        "gpucloud:costCeilingUSD",
        "unknown key (did you mean 'costCeilingUsdPerHour'?); allowed keys here: access, agent, ami",
    ),
    "typo-nested": (
        None,
        _set(f"{G1}.capacity.reservationID", CR),
        "gpucloud:nodeGroups[1].capacity.reservationID",
        "did you mean 'reservationId'?",
    ),
    "bad-enum": (
        None,
        _set(f"{G1}.capacity.type", "spott"),
        "gpucloud:nodeGroups[1].capacity.type = 'spott'",
        "allowed: 'spot', 'on-demand', 'capacity-block' or 'capacity-reservation'",
    ),
    "bad-type": (
        None,
        _set("gpucloud:nodeGroups.0.maxNodes", "many"),
        "gpucloud:nodeGroups[0].maxNodes = 'many'",
        "valid integer",
    ),
    "missing-region": (None, _drop("aws:region"), "aws:region", "required"),
    "missing-required": (
        None,
        _set("gpucloud:nodeGroups.0", {"name": "x"}),
        "gpucloud:nodeGroups[0].instanceType",
        "required key is missing",
    ),
    "unknown-namespace": (None, _set("gpucould:costCeiling", 1), "gpucould:costCeiling", "unknown namespace"),
    "region-in-our-namespace": (None, _set("gpucloud:region", "us-east-1"), "gpucloud:region", "aws:region"),
    "secret-value": (None, _set("gpucloud:tags", {"secure": "AAAB"}), "gpucloud:tags", "secrets are not used"),
    # hostile values: each of these was once accepted, or crashed `plan` with a traceback
    "node-count-limit": (
        None,
        _set("gpucloud:nodeGroups.0.maxNodes", 10**400),  # with the cost ceiling: OverflowError before
        "gpucloud:nodeGroups[0].maxNodes = 1000",
        "too large; allowed: 1 to 5000 nodes",
    ),
    "ssh-union-whole-internet": (
        None,
        _set("gpucloud:access", {"sshKeyName": "me", "sshCidrs": ["0.0.0.0/1", "128.0.0.0/1"]}),
        "gpucloud:access.sshCidrs = ['0.0.0.0/1', '128.0.0.0/1']",
        "together these ranges are the whole internet",
    ),
    "ssh-netmask-form": (
        None,
        _set("gpucloud:access", {"sshKeyName": "me", "sshCidrs": ["0.0.0.0/0.0.0.0"]}),
        "gpucloud:access.sshCidrs[0] = '0.0.0.0/0.0.0.0'",
        "not a valid CIDR with a prefix length",
    ),
    "cidr-netmask-form": (
        None,
        _set("gpucloud:network.vpcCidr", "10.0.0.0/255.255.0.0"),
        "gpucloud:network.vpcCidr = '10.0.0.0/255.255.0.0'",
        "a prefix length",
    ),
    "tag-value-long": (
        "tag_values",
        _set("gpucloud:tags.team", "x" * 1000),
        "gpucloud:tags.team = 'xxxx",
        "tag values are at most 256 characters",
    ),
    "tag-value-crlf": (
        "printable_text",
        _set("gpucloud:tags.team", "research\r\nowner: me"),
        "gpucloud:tags.team = 'research\\r\\nowner: me'",
        "no line breaks or other control characters",
    ),
    "tag-key-reserved-any-case": (
        "tag_keys",
        _set("gpucloud:tags", {"AWS:team": "x"}),
        "gpucloud:tags.AWS:team",
        "may not start with",
    ),
    "group-name-trailing-newline": (
        None,
        _set("gpucloud:nodeGroups.0.name", "dev\n"),
        "gpucloud:nodeGroups[0].name = 'dev\\n'",
        "lower-case letters",
    ),
    "region-trailing-newline": (
        None,
        _both(_set("aws:region", "us-east-1\n"), _drop("gpucloud:availabilityZone")),
        "aws:region = 'us-east-1\\n'",
        "not an AWS region",
    ),
    "reservation-id-trailing-newline": (
        None,
        _set(f"{G1}.capacity", {"type": "capacity-block", "reservationId": CR + "\n"}),
        "gpucloud:nodeGroups[1].capacity.reservationId = 'cr-0123456789abcdef0\\n'",
        "17 hex digits",
    ),
    "block-lead-huge": (
        "capacity_block_lead",
        _set(f"{G1}.capacity", _block(end=FUTURE, blockEndLeadMinutes=10**20)),  # OverflowError before
        "gpucloud:nodeGroups[1].capacity.blockEndLeadMinutes = 100000000000000000000",
        "allowed: 40 to 1440 minutes",
    ),
    "drain-timeout-huge-with-block": (
        None,
        _both(_set(f"{G1}.capacity", _block(end=FUTURE)), _set(f"{G1}.drainTimeoutSeconds", 10**20)),
        "gpucloud:nodeGroups[1].drainTimeoutSeconds = 100000000000000000000",
        "allowed: 30 to 7200 seconds",
    ),
    "block-end-year-10000-in-utc": (
        "capacity_block_end",
        _set(f"{G1}.capacity", _block(end="9999-12-31T23:59:59-23:59")),
        "gpucloud:nodeGroups[1].capacity.blockEnd = '9999-12-31T23:59:59-23:59'",
        "past the year 9999 in UTC",
    ),
    "max-nodes-boolean": (
        None,
        _set("gpucloud:nodeGroups.0.maxNodes", True),
        "gpucloud:nodeGroups[0].maxNodes = True",
        "expected a number, got true",
    ),
    "expiry-days-boolean": (
        None,
        _set("gpucloud:storage.checkpointBucket", {"expiryDays": True}),
        "gpucloud:storage.checkpointBucket.expiryDays = True",
        "expected a number, got true",
    ),
    "cost-ceiling-nan": (
        None,
        _set("gpucloud:costCeilingUsdPerHour", float("nan")),
        "gpucloud:costCeilingUsdPerHour = nan",
        "finite number",
    ),
    "cost-ceiling-infinite": (
        None,
        _set("gpucloud:costCeilingUsdPerHour", float("inf")),
        "gpucloud:costCeilingUsdPerHour = inf",
        "finite number",
    ),
    "spot-max-price-nan": (
        None,
        _set("gpucloud:nodeGroups.0.capacity.spotMaxPrice", float("nan")),
        "gpucloud:nodeGroups[0].capacity.spotMaxPrice = nan",
        "finite number",
    ),
    "empty-namespace": (
        None,
        _set(":storage", {"nvmeScratch": False}),
        ": :storage: ",
        "empty namespace; write gpucloud:storage",
    ),
    "same-key-with-and-without-namespace": (
        None,
        _set("costCeilingUsdPerHour", 100_000),  # the base sets gpucloud:costCeilingUsdPerHour: 100
        "costCeilingUsdPerHour",
        "'costCeilingUsdPerHour' is given twice (with and without 'gpucloud:'); keep one",
    ),
    "ours-in-aws-namespace": (
        None,
        _set("aws:storage", {"nvmeScratch": False}),
        "aws:storage",
        "a gpucloud setting in the aws: namespace is ignored; write gpucloud:storage",
    ),
    "json-text-nested-too-deeply": (
        None,
        _set("gpucloud:network", "[" * 100_000 + "]" * 100_000),  # RecursionError before
        "gpucloud:network",
        "JSON nested too deeply",
    ),
    "json-text-huge-integer": (
        None,
        _set("gpucloud:jobPlane", '{"maxReceiveCount": ' + "7" * 5000 + "}"),  # ValueError before
        "gpucloud:jobPlane",
        "JSON that cannot be read",
    ),
    "json-text-duplicate-key": (
        None,
        _set("gpucloud:network", '{"vpcCidr": "10.1.0.0/16", "vpcCidr": "10.2.0.0/16"}'),
        "gpucloud:network",
        "duplicate key 'vpcCidr' in the JSON value",
    ),
    "unknown-key-with-line-break": (
        None,
        _set("gpucloud:nodeGroups.0.bad\nkey", 1),
        "gpucloud:nodeGroups[0].bad\\nkey",
        "unknown key",
    ),
    "expected-checkpoint-not-positive": (
        None,
        _set("gpucloud:expectedCheckpointGiB", 0),
        "gpucloud:expectedCheckpointGiB = 0",
        "more than 0 and at most 1048576 GiB",
    ),
    "expected-checkpoint-group-too-large": (
        None,
        _set("gpucloud:nodeGroups.1.expectedCheckpointGiB", 10**7),
        "gpucloud:nodeGroups[1].expectedCheckpointGiB",
        "at most 1048576 GiB",
    ),
    "expected-checkpoint-not-a-number": (
        None,
        _set("gpucloud:expectedCheckpointGiB", "lots"),
        "gpucloud:expectedCheckpointGiB",
        "number",
    ),
    "monitor-instance-type-unknown": (
        "monitoring_instance_type",
        _set("gpucloud:monitoring", {"mode": "self-hosted", "instanceType": "t2.nano"}),
        "gpucloud:monitoring.instanceType = 't2.nano'",
        "not a monitor instance type gpucloud knows; allowed: m7i.2xlarge",
    ),
    "alert-email-not-an-address": (
        None,
        _set("gpucloud:monitoring", {"mode": "self-hosted", "alertEmails": ["oncall@example.com", "oncall"]}),
        "gpucloud:monitoring.alertEmails[1] = 'oncall'",
        "not an email address",
    ),
    "alert-email-twice": (
        "monitoring_alert_emails",
        _set("gpucloud:monitoring", {"mode": "managed", "alertEmails": ["a@example.com", "A@example.com"]}),
        "gpucloud:monitoring.alertEmails[1]",
        "given twice",
    ),
    "alert-emails-without-monitor": (
        "monitoring_alert_emails",
        _set("gpucloud:monitoring", {"mode": "off", "alertEmails": ["oncall@example.com"]}),
        "gpucloud:monitoring.alertEmails",
        "alerts need a monitor",
    ),
    "managed-grafana-without-managed": (
        "monitoring_managed_grafana",
        _set("gpucloud:monitoring", {"mode": "self-hosted", "managedGrafana": True}),
        "gpucloud:monitoring.managedGrafana = True",
        "needs monitoring.mode managed",
    ),
    "daily-report-without-monitor": (
        "monitoring_daily_report",
        _set("gpucloud:monitoring", {"mode": "managed", "dailyReport": True}),
        "gpucloud:monitoring.dailyReport = True",
        "needs monitoring.mode self-hosted (mode is managed, which has no instance to run it)",
    ),
    "daily-report-without-package": (
        "monitoring_daily_report",
        _both(
            _set("gpucloud:ami", {"parameter": "/gpucloud/images/p5/ami-id"}),
            _set("gpucloud:agent", {}),
            _set("gpucloud:monitoring", {"mode": "self-hosted", "dailyReport": True}),
        ),
        "gpucloud:monitoring.dailyReport = True",
        "the monitor installs gpucloud from gpucloud:agent.package",
    ),
    "monitoring-without-nat": (
        "monitoring_egress",
        _both(
            _set("gpucloud:network", {"vpcCidr": "10.20.0.0/16", "egress": "endpoints"}),
            _set("gpucloud:agent", {"package": "s3://wheels-bucket/wheelhouse/"}),
            _set("gpucloud:monitoring", {"mode": "self-hosted"}),
            lambda config: config["gpucloud:storage"].pop("fsx"),  # no Lustre client to install
        ),
        "gpucloud:monitoring.mode = 'self-hosted'",
        "needs network.egress nat",
    ),
    "managed-retention-too-long": (
        "monitoring_managed_retention",
        _set("gpucloud:monitoring", {"mode": "managed", "retentionDays": 2000}),
        "gpucloud:monitoring.retentionDays = 2000",
        "at most 1095 days",
    ),
    "budget-zero": (
        None,
        _set("gpucloud:budget", {"monthlyUsd": 0, "alertEmails": ["finance@example.com"]}),
        "gpucloud:budget.monthlyUsd = 0",
        "more than 0",
    ),
    "budget-percent-out-of-range": (
        None,
        _set("gpucloud:budget", {"monthlyUsd": 5000, "alertAtPercent": [50, 1200], "alertEmails": ["f@example.com"]}),
        "gpucloud:budget.alertAtPercent[1] = 1200",
        "at most 1000",
    ),
    "budget-percent-zero": (
        None,
        _set("gpucloud:budget", {"monthlyUsd": 5000, "alertAtPercent": [0], "alertEmails": ["f@example.com"]}),
        "gpucloud:budget.alertAtPercent[0] = 0",
        "more than 0",
    ),
    "budget-percent-twice": (
        "budget_alert_percents",
        _set("gpucloud:budget", {"monthlyUsd": 5000, "alertAtPercent": [80, 80.0], "alertEmails": ["f@example.com"]}),
        "gpucloud:budget.alertAtPercent[1]",
        "given twice",
    ),
    "budget-on-exceeded-unknown": (
        None,
        _set("gpucloud:budget", {"monthlyUsd": 5000, "onExceeded": "terminate", "alertEmails": ["f@example.com"]}),
        "gpucloud:budget.onExceeded",
        "stop-scale-out",
    ),
    "budget-stop-without-scaling": (
        "budget_stop_scale_out",
        _both(
            lambda c: [g.__setitem__("scaling", {"enabled": False}) for g in c["gpucloud:nodeGroups"]],
            _set("gpucloud:budget", {"monthlyUsd": 5000, "onExceeded": "stop-scale-out", "alertEmails": ["f@x.io"]}),
            lambda config: config["gpucloud:storage"].pop("fsx"),  # no Lustre client to install
        ),
        "gpucloud:budget.onExceeded = 'stop-scale-out'",
        "no node group scales out",
    ),
    "budget-stop-without-nat": (
        "budget_stop_scale_out",
        _both(
            _set("gpucloud:network", {"vpcCidr": "10.20.0.0/16", "egress": "endpoints"}),
            _set("gpucloud:agent", {"package": "s3://wheels-bucket/wheelhouse/"}),
            _set("gpucloud:budget", {"monthlyUsd": 5000, "onExceeded": "stop-scale-out", "alertEmails": ["f@x.io"]}),
            lambda config: config["gpucloud:storage"].pop("fsx"),  # no Lustre client to install
        ),
        "gpucloud:budget.onExceeded = 'stop-scale-out'",
        "set egress: nat",
    ),
    "budget-alerts-nowhere": (
        "budget_alert_destination",
        _set("gpucloud:budget", {"monthlyUsd": 5000}),
        "gpucloud:budget.alertEmails",
        "need somewhere to go",
    ),
    # a setting's own range comes from the schema and reads as a range, with its unit
    "spot-max-price-zero": (
        None,
        _set(f"{G1}.capacity.spotMaxPrice", 0),
        "gpucloud:nodeGroups[1].capacity.spotMaxPrice = 0",
        "too small; allowed: more than 0 USD/hour",
    ),
    "spot-max-price-not-spot": (
        "spot_settings_only_for_spot",
        _set("gpucloud:nodeGroups.0.capacity", {"type": "on-demand", "spotMaxPrice": 1.5}),
        "gpucloud:nodeGroups[0].capacity.spotMaxPrice = 1.5",
        "only spot groups have a maximum price",
    ),
    "on-demand-base-negative": (
        None,
        _set(f"{G1}.capacity.onDemandBase", -1),
        "gpucloud:nodeGroups[1].capacity.onDemandBase = -1",
        "too small; allowed: 0 to 5000 nodes",
    ),
    "on-demand-base-above-max": (
        "spot_settings_only_for_spot",
        _set(f"{G1}.capacity.onDemandBase", 3),
        "gpucloud:nodeGroups[1].capacity.onDemandBase = 3",
        "must be between 0 and maxNodes (2)",
    ),
    "cost-ceiling-zero": (
        None,
        _set("gpucloud:costCeilingUsdPerHour", 0),
        "gpucloud:costCeilingUsdPerHour = 0",
        "too small; allowed: more than 0 USD/hour",
    ),
    "visibility-timeout-over-the-sqs-limit": (
        None,
        _set("gpucloud:jobPlane", {"visibilityTimeoutSeconds": 43201}),
        "gpucloud:jobPlane.visibilityTimeoutSeconds = 43201",
        "too large; allowed: 0 to 43200 seconds (the SQS limit)",
    ),
    "desired-nodes-too-many": (
        None,
        _set("gpucloud:nodeGroups.0.desiredNodes", 5001),
        "gpucloud:nodeGroups[0].desiredNodes = 5001",
        "too large; allowed: 0 to 5000 nodes",
    ),
    "ttl-hours-zero": (None, _set("gpucloud:ttlHours", 0), "gpucloud:ttlHours = 0", "more than 0"),
    "ttl-hours-over-a-year": (None, _set("gpucloud:ttlHours", 9000), "gpucloud:ttlHours = 9000", "at most 8760"),
    "drill-without-spot": (
        "drill_needs_spot",
        _both(
            lambda c: [g.__setitem__("capacity", {"type": "on-demand"}) for g in c["gpucloud:nodeGroups"]],
            _set("gpucloud:drill", True),
        ),
        "gpucloud:drill = True",
        "needs a node group with capacity.type: spot",
    ),
    "drill-spot-all-on-demand-base": (
        "drill_needs_spot",
        _both(
            _set("gpucloud:nodeGroups.0.capacity", {"type": "on-demand"}),
            _set("gpucloud:nodeGroups.1.capacity.onDemandBase", 2),
            _set("gpucloud:drill", True),
        ),
        "gpucloud:drill = True",
        "maxNodes above its onDemandBase",
    ),
    "budget-alert-email-bad": (
        None,
        _set("gpucloud:budget", {"monthlyUsd": 5000, "alertEmails": ["finance"]}),
        "gpucloud:budget.alertEmails[0] = 'finance'",
        "not an email address",
    ),
    "monitoring-mode-unknown": (
        None,
        _set("gpucloud:monitoring", {"mode": "prometheus"}),
        "gpucloud:monitoring.mode",
        "self-hosted",
    ),
}
del CASES["placement-unsupported"]


def run_plan(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    out, err = capsys.readouterr()
    return int(exit_info.value.code or 0), out, err


@pytest.mark.parametrize("case", sorted(CASES))
def test_each_bad_setting_is_one_clear_line(case: str, write_stack, capsys) -> None:
    _, mutate, key, text = CASES[case]
    path: Path = write_stack(mutate)
    code, out, err = run_plan(["plan", "--stack-file", str(path), "--output", "json"], capsys)
    assert code == 2
    assert out == ""
    assert "Traceback" not in err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith(f"gpucloud: error: {path}: ")
    assert key in lines[0] and text in lines[0], lines[0]


def _rule_names() -> set[str]:
    """The public functions of rules.py that yield problems: each one is a rule."""
    return {
        name
        for name, function in inspect.getmembers(rules, inspect.isfunction)
        if function.__module__ == rules.__name__
        and not name.startswith("_")
        and function.__annotations__.get("return") == "Iterator[Problem]"
    }


def test_every_rule_has_a_case_that_triggers_it() -> None:
    covered = {rule for rule, *_ in CASES.values() if rule}
    assert covered <= _rule_names(), covered - _rule_names()  # a case names a rule that exists
    # every catalog type supports cluster placement, so that rule is tested directly below
    missing = _rule_names() - covered - {"cluster_placement_supported"}
    assert not missing


def test_cluster_placement_rule_fires_for_a_type_without_it(write_stack) -> None:
    from gpucloud.catalog import load_catalog
    from gpucloud.spec.rules import cluster_placement_supported

    catalog = load_catalog()
    no_cluster = catalog.instance_types["g6.xlarge"].model_copy(update={"placement_strategies": ["spread"]})
    patched = catalog.model_copy(update={"instance_types": {**catalog.instance_types, "g6.xlarge": no_cluster}})
    group = load_stack_file(write_stack()).node_groups[0].model_copy(update={"placement_group": True})
    problems = list(cluster_placement_supported([group], patched))
    assert [p.key for p in problems] == ["gpucloud:nodeGroups[0].placementGroup"]
    assert "does not support cluster placement" in problems[0].message


def test_several_problems_are_each_reported_on_their_own_line(write_stack, capsys) -> None:
    path = write_stack(_both(_set("gpucloud:storage.fsx.sizeGiB", 3000), _set("gpucloud:network.vpcCidr", "bad")))
    code, _, err = run_plan(["plan", "--stack-file", str(path)], capsys)
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 2
    assert {"sizeGiB", "vpcCidr"} == {key for key in ("sizeGiB", "vpcCidr") for line in lines if key in line}
    assert all(str(path) in line for line in lines)


@pytest.mark.parametrize(
    ("content", "text"),
    [
        ("config: [1, 2\n", "not valid YAML at line"),
        ("- just\n- a list\n", "expected a mapping with a 'config:' section"),
        ("config:\n  aws:region: us-east-1\nconfg: {}\n", "unknown top-level key 'confg'"),
        ("config: 3\n", "'config:' must be a mapping"),
        (b"\xff\xfe garbage", "cannot read the stack file"),
    ],
)
def test_unreadable_stack_files(tmp_path: Path, capsys, content: str | bytes, text: str) -> None:
    path = tmp_path / "Pulumi.bad.yaml"
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content)
    code, _, err = run_plan(["plan", "--stack-file", str(path)], capsys)
    assert code == 2 and text in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err


def test_missing_stack_file(tmp_path: Path, capsys) -> None:
    code, _, err = run_plan(["plan", "--stack-file", str(tmp_path / "Pulumi.none.yaml")], capsys)
    assert code == 2 and "stack file not found" in err


def test_unknown_stack_lists_the_shipped_ones(capsys) -> None:
    code, _, err = run_plan(["plan", "--stack", "p5-spot"], capsys)
    assert code == 2
    assert "no stack named 'p5-spot'" in err and "dev, p4d-spot, p5-capacity-block" in err


def test_stack_and_stack_file_are_exclusive(write_stack, capsys) -> None:
    code, _, err = run_plan(["plan", "--stack", "dev", "--stack-file", str(write_stack())], capsys)
    assert code == 2 and "exactly one of --stack NAME or --stack-file PATH" in err
