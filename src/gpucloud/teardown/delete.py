"""Deleting one found resource, the way its service wants it, and retrying what is still in use. boto3 I/O.

Deletes are idempotent here: "not found" means someone (AWS, a previous sweep) already did it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from botocore.exceptions import ClientError

from gpucloud.teardown.discover import group_instance_tags, role_profile_tags
from gpucloud.teardown.model import Found, sweepable

# Error codes that mean "a dependency still holds it; try again shortly": subnets and security groups
# while instances terminate and ENIs detach, an address while its NAT gateway deletes, a role still in
# a profile. https://docs.aws.amazon.com/AWSEC2/latest/APIReference/errors-overview.html
RETRYABLE = frozenset(
    {
        "DependencyViolation",
        "ResourceInUse",
        "ResourceInUseException",
        "ResourceInUseFault",
        "ScalingActivityInProgress",
        "ScalingActivityInProgressFault",
        "InvalidIPAddress.InUse",
        "InvalidNetworkInterface.InUse",
        "VolumeInUse",
        "IncorrectState",
        "IncorrectInstanceState",
        "DeleteConflict",
        "BadRequest",  # FSx: a file system still being created or with an export in progress
    }
)
KEY_DELETION_DAYS = 7  # ScheduleKeyDeletion's PendingWindowInDays: 7 to 30
NOT_FOUND_SUFFIXES = ("NotFound", "NotFoundException", "NoSuchEntity", "NoSuchBucket", "FileSystemNotFound")
NOT_FOUND = frozenset({"AWS.SimpleQueueService.NonExistentQueue", "ResourceNotFoundException", "NotFound"})


def _code(err: ClientError) -> str:
    return str(err.response.get("Error", {}).get("Code", ""))


def is_not_found(err: ClientError) -> bool:
    code = _code(err)
    return code in NOT_FOUND or code.endswith(NOT_FOUND_SUFFIXES)


class Deleter:
    """``client(service)`` makes boto3 clients for the region; ``sleep`` and the bounds make retries testable."""

    def __init__(
        self,
        client: Callable[[str], Any],
        *,
        attempts: int = 8,
        first_wait: float = 2.0,
        max_wait: float = 30.0,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.client = client
        self.attempts = attempts
        self.first_wait = first_wait
        self.max_wait = max_wait
        self.sleep = sleep

    def delete(self, found: Found) -> str:
        """``deleted``, ``already gone``, or ``failed: CODE: message`` (after the bounded retries)."""
        wait = self.first_wait
        for attempt in range(1, self.attempts + 1):
            try:
                said = getattr(self, "_" + found.kind.replace(":", "_").replace("-", "_"))(found)
                return said or "deleted"  # a kind whose deletion only starts says so
            except ClientError as err:
                if is_not_found(err):
                    return "already gone"
                if _code(err) not in RETRYABLE or attempt == self.attempts:
                    message = err.response.get("Error", {}).get("Message", "")
                    return f"failed: {_code(err)}: {message}"[:300]
            self.sleep(wait)  # exponential backoff: https://docs.aws.amazon.com/general/latest/gr/api-retries.html
            wait = min(wait * 2, self.max_wait)
        return "failed"  # pragma: no cover - the loop returns on its last attempt

    # ---- one method per kind in model.DELETE_ORDER -------------------------------------------

    def _autoscaling_autoScalingGroup(self, f: Found) -> None:
        # ForceDelete terminates every instance in the group, without waiting for scale-in protection
        # or hooks (https://docs.aws.amazon.com/autoscaling/ec2/APIReference/API_DeleteAutoScalingGroup.html).
        # So first detach what sweep keeps: an instance tagged keep, or one of another stack that was
        # attached to the group. Read now, not at listing time, so the dry run's word still holds.
        # DetachInstances takes up to 20 ids and, decrementing the desired capacity, launches no
        # replacement (https://docs.aws.amazon.com/autoscaling/ec2/APIReference/API_DetachInstances.html).
        # A detach that fails fails the group's delete: nothing kept is terminated.
        autoscaling = self.client("autoscaling")
        groups = autoscaling.describe_auto_scaling_groups(AutoScalingGroupNames=[f.ident])["AutoScalingGroups"]
        spared = sorted(
            i for g in groups for i, tags in group_instance_tags(self.client, g).items() if not sweepable(tags, f.stack)
        )
        for start in range(0, len(spared), 20):
            autoscaling.detach_instances(
                AutoScalingGroupName=f.ident,
                InstanceIds=spared[start : start + 20],
                ShouldDecrementDesiredCapacity=True,
            )
        autoscaling.delete_auto_scaling_group(AutoScalingGroupName=f.ident, ForceDelete=True)

    def _ec2_instance(self, f: Found) -> None:
        self.client("ec2").terminate_instances(InstanceIds=[f.ident])

    def _ec2_volume(self, f: Found) -> None:
        self.client("ec2").delete_volume(VolumeId=f.ident)  # VolumeInUse until its instance is gone: retried

    def _fsx_file_system(self, f: Found) -> None:
        # no final backup: a leaked scratch/cache file system; checkpoints live in the bucket
        fsx = self.client("fsx")
        fsx.delete_file_system(FileSystemId=f.ident)

    def _ec2_launch_template(self, f: Found) -> None:
        self.client("ec2").delete_launch_template(LaunchTemplateId=f.ident)

    def _ec2_network_interface(self, f: Found) -> None:
        ec2 = self.client("ec2")
        eni = ec2.describe_network_interfaces(NetworkInterfaceIds=[f.ident])["NetworkInterfaces"][0]
        attachment = eni.get("Attachment") or {}
        if attachment.get("AttachmentId") and attachment.get("DeviceIndex", 0) != 0:
            ec2.detach_network_interface(AttachmentId=attachment["AttachmentId"], Force=True)
        ec2.delete_network_interface(NetworkInterfaceId=f.ident)  # InUse while its instance terminates: retried

    def _ec2_vpc_endpoint(self, f: Found) -> None:
        self.client("ec2").delete_vpc_endpoints(VpcEndpointIds=[f.ident])

    def _ec2_natgateway(self, f: Found) -> None:
        self.client("ec2").delete_nat_gateway(NatGatewayId=f.ident)

    def _ec2_elastic_ip(self, f: Found) -> None:
        self.client("ec2").release_address(AllocationId=f.ident)

    def _ec2_subnet(self, f: Found) -> None:
        self.client("ec2").delete_subnet(SubnetId=f.ident)

    def _ec2_route_table(self, f: Found) -> None:
        ec2 = self.client("ec2")
        table = ec2.describe_route_tables(RouteTableIds=[f.ident])["RouteTables"][0]
        for assoc in table.get("Associations", []):
            if not assoc.get("Main") and assoc.get("RouteTableAssociationId"):
                ec2.disassociate_route_table(AssociationId=assoc["RouteTableAssociationId"])
        ec2.delete_route_table(RouteTableId=f.ident)

    def _ec2_internet_gateway(self, f: Found) -> None:
        ec2 = self.client("ec2")
        gateway = ec2.describe_internet_gateways(InternetGatewayIds=[f.ident])["InternetGateways"][0]
        for attachment in gateway.get("Attachments", []):
            ec2.detach_internet_gateway(InternetGatewayId=f.ident, VpcId=attachment["VpcId"])
        ec2.delete_internet_gateway(InternetGatewayId=f.ident)

    def _ec2_security_group(self, f: Found) -> None:
        # Rules naming another group hold that group (DependencyViolation): revoke them first.
        ec2 = self.client("ec2")
        group = ec2.describe_security_groups(GroupIds=[f.ident])["SecurityGroups"][0]
        for perms, revoke in (
            (group.get("IpPermissions"), ec2.revoke_security_group_ingress),
            (group.get("IpPermissionsEgress"), ec2.revoke_security_group_egress),
        ):
            referencing = [p for p in perms or [] if p.get("UserIdGroupPairs")]
            if referencing:
                revoke(GroupId=f.ident, IpPermissions=referencing)
        ec2.delete_security_group(GroupId=f.ident)

    def _ec2_placement_group(self, f: Found) -> None:
        self.client("ec2").delete_placement_group(GroupName=f.ident)

    def _ec2_vpc(self, f: Found) -> None:
        self.client("ec2").delete_vpc(VpcId=f.ident)

    def _sqs_queue(self, f: Found) -> None:
        sqs = self.client("sqs")
        url = sqs.get_queue_url(QueueName=f.ident)["QueueUrl"]
        sqs.delete_queue(QueueUrl=url)

    def _dynamodb_table(self, f: Found) -> None:
        self.client("dynamodb").delete_table(TableName=f.ident)

    def _events_rule(self, f: Found) -> None:
        events = self.client("events")  # a rule with targets cannot be deleted: remove them first
        targets = [t["Id"] for t in events.list_targets_by_rule(Rule=f.ident).get("Targets", [])]
        if targets:
            events.remove_targets(Rule=f.ident, Ids=targets, Force=True)
        events.delete_rule(Name=f.ident, Force=True)

    def _fis_experiment_template(self, f: Found) -> None:
        self.client("fis").delete_experiment_template(id=f.ident)

    def _budgets_budget(self, f: Found) -> None:
        account = f.arn.split(":")[4]  # arn:aws:budgets::ACCOUNT:budget/NAME
        self.client("budgets").delete_budget(AccountId=account, BudgetName=f.ident)

    def _sns_topic(self, f: Found) -> None:
        self.client("sns").delete_topic(TopicArn=f.arn)

    def _lambda_function(self, f: Found) -> None:
        self.client("lambda").delete_function(FunctionName=f.ident)

    def _cloudwatch_alarm(self, f: Found) -> None:
        self.client("cloudwatch").delete_alarms(AlarmNames=[f.ident])

    def _logs_log_group(self, f: Found) -> None:
        self.client("logs").delete_log_group(logGroupName=f.ident)

    def _iam_instance_profile(self, f: Found) -> None:
        iam = self.client("iam")
        profile = iam.get_instance_profile(InstanceProfileName=f.ident)["InstanceProfile"]
        for role in profile.get("Roles", []):
            iam.remove_role_from_instance_profile(InstanceProfileName=f.ident, RoleName=role["RoleName"])
        iam.delete_instance_profile(InstanceProfileName=f.ident)

    def _iam_role(self, f: Found) -> None:
        # DeleteRole wants no attached or inline policies and no instance profile holding it:
        # https://docs.aws.amazon.com/IAM/latest/UserGuide/id_roles_manage_delete.html
        iam = self.client("iam")
        profiles = role_profile_tags(iam, f.ident)
        spared = sorted(name for name, tags in profiles.items() if not sweepable(tags, f.stack))
        if spared:  # deleting the role would empty a profile sweep keeps: leave both
            raise ClientError(
                {
                    "Error": {
                        "Code": "KeptProfile",
                        "Message": f"held by instance profile {', '.join(spared)}, which sweep keeps",
                    }
                },
                "DeleteRole",
            )
        for page in iam.get_paginator("list_attached_role_policies").paginate(RoleName=f.ident):
            for policy in page["AttachedPolicies"]:
                iam.detach_role_policy(RoleName=f.ident, PolicyArn=policy["PolicyArn"])
        for page in iam.get_paginator("list_role_policies").paginate(RoleName=f.ident):
            for name in page["PolicyNames"]:
                iam.delete_role_policy(RoleName=f.ident, PolicyName=name)
        for name in profiles:
            iam.remove_role_from_instance_profile(InstanceProfileName=name, RoleName=f.ident)
        iam.delete_role(RoleName=f.ident)

    def _s3_bucket(self, f: Found) -> None:
        empty_bucket(self.client("s3"), f.ident)
        self.client("s3").delete_bucket(Bucket=f.ident)

    def _kms_key(self, f: Found) -> str:
        # A key cannot be deleted at once: KMS deletes it after a waiting period of 7 to 30 days
        # (https://docs.aws.amazon.com/kms/latest/APIReference/API_ScheduleKeyDeletion.html); the
        # shortest, since nothing of the stack that it encrypted is left.
        self.client("kms").schedule_key_deletion(KeyId=f.ident, PendingWindowInDays=KEY_DELETION_DAYS)
        return f"deletion scheduled: KMS deletes it in {KEY_DELETION_DAYS} days (the shortest wait KMS allows)"


def empty_bucket(s3: Any, bucket: str) -> None:
    """Every object version, delete marker and incomplete multipart upload, so DeleteBucket succeeds
    (https://docs.aws.amazon.com/AmazonS3/latest/userguide/delete-bucket.html)."""
    abort_multipart_uploads(s3, bucket)
    for page in s3.get_paginator("list_object_versions").paginate(Bucket=bucket):
        batch = [
            {"Key": v["Key"], "VersionId": v["VersionId"]}
            for v in page.get("Versions", []) + page.get("DeleteMarkers", [])
        ]
        for start in range(0, len(batch), 1000):  # DeleteObjects takes at most 1000 keys
            s3.delete_objects(Bucket=bucket, Delete={"Objects": batch[start : start + 1000], "Quiet": True})


def abort_multipart_uploads(s3: Any, bucket: str) -> int:
    """Abort every incomplete multipart upload of ``bucket`` (``gpucloud teardown`` runs this alone,
    before a destroy whose bucket delete empties versions but not uploads); how many were aborted."""
    aborted = 0
    for page in s3.get_paginator("list_multipart_uploads").paginate(Bucket=bucket):
        for upload in page.get("Uploads", []):
            s3.abort_multipart_upload(Bucket=bucket, Key=upload["Key"], UploadId=upload["UploadId"])
            aborted += 1
    return aborted
