"""Storage: the checkpoint bucket and, optionally, FSx for Lustre linked to it.

The bucket is versioned (an overwritten LATEST pointer can be recovered), encrypted, private,
TLS-only, and expires old checkpoint versions. The file system is PERSISTENT_2 (survives node loss;
SCRATCH loses data on a server failure) with a data repository association, so checkpoints written
under the link path are exported to the bucket and the bucket's contents appear on every node.

What a destroy does to them (docs/teardown.md, "A destroy that finishes"): the bucket is emptied and
deleted, or, with ``checkpointBucket.protect``, refused; the association exports first
(``infra/fsx_export.py``, a ``before_delete`` hook) where ``fsx.exportOnDestroy`` holds: by default
when the bucket is protected, the only case where the export outlives the destroy.
"""

from __future__ import annotations

import dataclasses

import pulumi
import pulumi_aws as aws

from gpucloud.cluster.tags import Tagging
from gpucloud.infra.fsx_export import export_hook
from gpucloud.spec.model import CheckpointBucket as BucketSettings
from gpucloud.spec.model import Fsx as FsxSettings

S3_EVENTS = ["NEW", "CHANGED", "DELETED"]


@dataclasses.dataclass
class CheckpointStoreArgs:
    tagging: Tagging
    settings: BucketSettings


class CheckpointStore(pulumi.ComponentResource):
    bucket_name: pulumi.Output[str]
    bucket_arn: pulumi.Output[str]
    protected: bool  # a destroy refuses the bucket (stack output checkpointBucketProtected)

    def __init__(self, name: str, args: CheckpointStoreArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("gpucloud:storage:CheckpointStore", name, None, opts)
        s = args.settings
        # protect covers the bucket's settings too: a destroy that skips protected resources
        # (exclude_protected) must not strip the kept bucket of its versioning, encryption, public
        # access block or TLS-only policy
        child = pulumi.ResourceOptions(parent=self, protect=s.protect)
        # DeleteBucket needs the bucket empty: "All objects (including all object versions and delete
        # markers) in the bucket must be deleted before the bucket itself can be deleted"
        # (https://docs.aws.amazon.com/AmazonS3/latest/API/API_DeleteBucket.html); the bucket is
        # versioned, so a plain destroy would stop there. force_destroy makes the provider delete every
        # version and delete marker first (terraform-provider-aws EmptyBucket; pulumi-aws s3.Bucket
        # force_destroy, https://www.pulumi.com/registry/packages/aws/api-docs/s3/bucket/#force_destroy_python).
        # It acts only once a `pulumi up` has stored it. Incomplete multipart uploads are not aborted by
        # it (AWS documents them as blocking DeleteBucket for directory buckets only; the lifecycle rule
        # below aborts them after abortMultipartDays, `gpucloud teardown` aborts them before destroying).
        # protect: Pulumi refuses to delete the bucket at all (resource option protect,
        # https://www.pulumi.com/docs/iac/concepts/resources/options/protect/): checkpoints outlive the stack.
        self.protected = s.protect
        bucket = aws.s3.Bucket(
            f"{name}-bucket",
            force_destroy=not s.protect,
            tags=args.tagging.tags("checkpoints"),
            opts=child,
        )
        aws.s3.BucketOwnershipControls(
            f"{name}-ownership",
            bucket=bucket.id,
            rule=aws.s3.BucketOwnershipControlsRuleArgs(object_ownership="BucketOwnerEnforced"),
            opts=child,
        )
        aws.s3.BucketVersioning(
            f"{name}-versioning",
            bucket=bucket.id,
            versioning_configuration=aws.s3.BucketVersioningVersioningConfigurationArgs(status="Enabled"),
            opts=child,
        )
        # SSE-S3 rather than SSE-KMS: the FSx data repository association and every node can then
        # read and write without a key policy to maintain; the data is encrypted at rest either way.
        aws.s3.BucketServerSideEncryptionConfiguration(
            f"{name}-encryption",
            bucket=bucket.id,
            rules=[
                aws.s3.BucketServerSideEncryptionConfigurationRuleArgs(
                    apply_server_side_encryption_by_default=(
                        aws.s3.BucketServerSideEncryptionConfigurationRuleApplyServerSideEncryptionByDefaultArgs(
                            sse_algorithm="AES256"
                        )
                    ),
                    bucket_key_enabled=True,
                )
            ],
            opts=child,
        )
        block = aws.s3.BucketPublicAccessBlock(
            f"{name}-public-access",
            bucket=bucket.id,
            block_public_acls=True,
            block_public_policy=True,
            ignore_public_acls=True,
            restrict_public_buckets=True,
            opts=child,
        )
        aws.s3.BucketPolicy(
            f"{name}-tls-only",
            bucket=bucket.id,
            policy=pulumi.Output.json_dumps(
                {
                    "Version": "2012-10-17",
                    "Statement": [
                        {
                            "Sid": "DenyInsecureTransport",
                            "Effect": "Deny",
                            "Principal": "*",
                            "Action": "s3:*",
                            "Resource": [bucket.arn, pulumi.Output.concat(bucket.arn, "/*")],
                            "Condition": {"Bool": {"aws:SecureTransport": "false"}},
                        }
                    ],
                }
            ),
            # the public access block must exist first or S3 may judge the policy as public
            opts=pulumi.ResourceOptions.merge(child, pulumi.ResourceOptions(depends_on=[block])),
        )
        rules = [
            aws.s3.BucketLifecycleConfigurationRuleArgs(
                id="expire-replaced-checkpoints",
                status="Enabled",
                filter=aws.s3.BucketLifecycleConfigurationRuleFilterArgs(prefix=""),
                noncurrent_version_expiration=aws.s3.BucketLifecycleConfigurationRuleNoncurrentVersionExpirationArgs(
                    noncurrent_days=s.noncurrent_expiry_days
                ),
                abort_incomplete_multipart_upload=(
                    aws.s3.BucketLifecycleConfigurationRuleAbortIncompleteMultipartUploadArgs(
                        days_after_initiation=s.abort_multipart_days
                    )
                ),
            )
        ]
        if s.expiry_days is not None:
            rules.append(
                aws.s3.BucketLifecycleConfigurationRuleArgs(
                    id="expire-old-checkpoints",
                    status="Enabled",
                    filter=aws.s3.BucketLifecycleConfigurationRuleFilterArgs(prefix=""),
                    expiration=aws.s3.BucketLifecycleConfigurationRuleExpirationArgs(days=s.expiry_days),
                )
            )
        aws.s3.BucketLifecycleConfiguration(f"{name}-lifecycle", bucket=bucket.id, rules=rules, opts=child)
        self.bucket_name = bucket.bucket
        self.bucket_arn = bucket.arn
        self.register_outputs({"bucketName": bucket.bucket, "bucketArn": bucket.arn, "protected": s.protect})


@dataclasses.dataclass
class SharedFilesystemArgs:
    tagging: Tagging
    settings: FsxSettings
    subnet_id: pulumi.Input[str]
    security_group_id: pulumi.Input[str]
    bucket_name: pulumi.Input[str]
    region: str  # where the export hook's FSx client calls
    export_on_destroy: bool = False  # bind the export hook (``Storage.fsx_exports_on_destroy``)


class SharedFilesystem(pulumi.ComponentResource):
    dns_name: pulumi.Output[str]
    mount_name: pulumi.Output[str]
    file_system_id: pulumi.Output[str]
    association_id: pulumi.Output[str]
    export_path: pulumi.Output[str]  # s3://bucket/prefix the association exports to
    file_system_path: str  # where the bucket appears inside the file system
    export_on_destroy: bool  # the association's delete exports first (the before_delete hook)

    def __init__(self, name: str, args: SharedFilesystemArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("gpucloud:storage:SharedFilesystem", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        s = args.settings
        fs = aws.fsx.LustreFileSystem(
            f"{name}-lustre",
            subnet_ids=args.subnet_id,  # a single subnet: one AZ, the nodes' AZ
            security_group_ids=[args.security_group_id],
            storage_type="SSD",
            storage_capacity=s.size_gib,
            deployment_type="PERSISTENT_2",
            per_unit_storage_throughput=s.throughput_per_tib,
            file_system_type_version="2.15",
            data_compression_type="LZ4",
            metadata_configuration=aws.fsx.LustreFileSystemMetadataConfigurationArgs(mode="AUTOMATIC"),
            # "File system backups aren't supported on file systems that are linked to an Amazon S3
            # data repository" (https://docs.aws.amazon.com/fsx/latest/LustreGuide/fsx-data-repositories.html):
            # no final backup to wait for on delete; the bucket holds the data. Explicit, because the
            # provider's default has changed before.
            skip_final_backup=True,
            tags=args.tagging.tags("lustre"),
            opts=child,
        )
        export_path = pulumi.Output.concat("s3://", args.bucket_name, "/", s.s3_prefix)
        association = aws.fsx.DataRepositoryAssociation(
            f"{name}-checkpoints",
            file_system_id=fs.id,
            file_system_path=s.link_path,
            data_repository_path=export_path,
            batch_import_meta_data_on_create=True,
            # False (the default, said out loud): deleting the association leaves the files on Lustre.
            # Its delete then stays quick and cannot lose what the export hook could not write; in a
            # destroy the file system is deleted right after anyway, and a replaced association
            # (another bucket or path) keeps the data on the file system.
            # https://docs.aws.amazon.com/fsx/latest/APIReference/API_DeleteDataRepositoryAssociation.html
            delete_data_in_filesystem=False,
            s3=aws.fsx.DataRepositoryAssociationS3Args(
                auto_export_policy=aws.fsx.DataRepositoryAssociationS3AutoExportPolicyArgs(events=S3_EVENTS),
                auto_import_policy=aws.fsx.DataRepositoryAssociationS3AutoImportPolicyArgs(events=S3_EVENTS),
            ),
            tags=args.tagging.tags("lustre-checkpoints"),
            # export what automatic export has not written yet before the engine deletes the link
            # (runs under `pulumi destroy --run-program`: https://www.pulumi.com/docs/iac/concepts/options/hooks/)
            opts=pulumi.ResourceOptions(
                parent=self,
                hooks=pulumi.ResourceHookBinding(before_delete=[export_hook(name, args.region)])
                if args.export_on_destroy
                else None,
            ),
        )
        self.dns_name = fs.dns_name
        self.mount_name = fs.mount_name
        self.file_system_id = fs.id
        self.association = association  # the node groups wait for it: a node boots onto the linked path
        self.association_id = association.id
        self.export_path = export_path
        self.file_system_path = s.link_path
        self.export_on_destroy = args.export_on_destroy
        self.register_outputs({"dnsName": fs.dns_name, "mountName": fs.mount_name, "associationId": association.id})
