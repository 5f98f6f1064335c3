"""Every storage resource is encrypted at rest.

Per type:
- launch template / image recipe EBS block devices and ``ebs.Volume``: ``encrypted`` true (the
  provider schema uses the string ``"true"`` in launch templates);
- instances (the self-hosted monitor): ``rootBlockDevice`` and every ``ebsBlockDevices`` entry
  ``encrypted`` true;
- SNS topics (alerts can name nodes and jobs): a ``kmsMasterKeyId``;
- DynamoDB tables: ``serverSideEncryption.enabled`` (a KMS key we can audit and rotate, instead of
  the AWS-owned default key that no CloudTrail event shows);
- SQS queues: ``sqsManagedSseEnabled`` or a ``kmsMasterKeyId``;
- FSx for Lustre: nothing to require. Every FSx for Lustre deployment type is encrypted at rest
  by the service and it cannot be turned off; ``kmsKeyId`` only picks a customer key (PERSISTENT
  only), which is a key-management choice, not an encryption one.
- S3 buckets are checked by the stack policy in ``buckets.py``: their encryption is usually a
  separate ``BucketServerSideEncryptionConfiguration`` resource.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pulumi_policy import ReportViolation, ResourceValidationArgs

from gpucloud.policy import resource_types as rt
from gpucloud.policy.props import as_mappings, get_path, is_true


def _unencrypted_devices(mappings: Any) -> list[str]:
    return [
        str(mapping.get("deviceName") or "(unnamed device)")
        for mapping in as_mappings(mappings)
        if isinstance(mapping.get("ebs"), Mapping) and not is_true(mapping["ebs"].get("encrypted"))
    ]


def storage_encrypted(args: ResourceValidationArgs, report: ReportViolation) -> None:
    props = args.props
    kind = args.resource_type
    if kind in (rt.LAUNCH_TEMPLATE, rt.IMAGE_RECIPE):
        for device in _unencrypted_devices(props.get("blockDeviceMappings")):
            report(f"EBS volume {device} in blockDeviceMappings is not encrypted; set ebs.encrypted to 'true'", None)
    elif kind == rt.INSTANCE:
        devices: list[tuple[str, Any]] = [("rootBlockDevice", get_path(props, "rootBlockDevice", "encrypted"))]
        devices += [
            (f"ebsBlockDevices[{i}]", d.get("encrypted"))
            for i, d in enumerate(as_mappings(props.get("ebsBlockDevices")))
        ]
        for where, encrypted in devices:
            if not is_true(encrypted):
                report(f"instance {where} is not encrypted; set encrypted to true", None)
    elif kind == rt.SNS_TOPIC:
        if not props.get("kmsMasterKeyId"):
            report("SNS topic is not encrypted; give a kmsMasterKeyId (alias/aws/sns or a customer key)", None)
    elif kind == rt.EBS_VOLUME:
        if not is_true(props.get("encrypted")):
            report("EBS volume is not encrypted; set encrypted to true", None)
    elif kind == rt.DYNAMODB_TABLE:
        if not is_true(get_path(props, "serverSideEncryption", "enabled")):
            report("DynamoDB table has no KMS server-side encryption; set serverSideEncryption.enabled to true", None)
    elif kind == rt.SQS_QUEUE:
        if not is_true(props.get("sqsManagedSseEnabled")) and not props.get("kmsMasterKeyId"):
            report("SQS queue is not encrypted; set sqsManagedSseEnabled to true or give a kmsMasterKeyId", None)
