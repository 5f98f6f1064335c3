"""Bucket encryption, public access block and TLS-only: stack policies pairing buckets with config."""

from __future__ import annotations

import json

import pytest
from policy_args import check_stack, resource

BUCKET = "aws:s3/bucket:Bucket"
SSE = "aws:s3/bucketServerSideEncryptionConfiguration:BucketServerSideEncryptionConfiguration"
PAB = "aws:s3/bucketPublicAccessBlock:BucketPublicAccessBlock"
POLICY = "aws:s3/bucketPolicy:BucketPolicy"
FLAGS = ("blockPublicAcls", "blockPublicPolicy", "ignorePublicAcls", "restrictPublicBuckets")


def tls_only_document(bucket: str = "ckpt") -> str:
    return json.dumps(
        {
            "Version": "2012-10-17",
            "Statement": [
                {
                    "Sid": "DenyInsecureTransport",
                    "Effect": "Deny",
                    "Principal": "*",
                    "Action": "s3:*",
                    "Resource": [f"arn:aws:s3:::{bucket}", f"arn:aws:s3:::{bucket}/*"],
                    "Condition": {"Bool": {"aws:SecureTransport": "false"}},
                }
            ],
        }
    )


def bucket_stack(*, sse=True, flags=FLAGS, document=None, linked_by="dependency"):
    """A bucket plus its configuration resources, linked as the engine links them."""
    bucket = resource(BUCKET, "ckpt", {"bucket": "ckpt-123", "tags": {"gpucloud:stack": "dev"}})

    def ref():
        # the engine links by property dependency; a literal name links by value
        if linked_by == "dependency":
            return {"bucket": "ckpt-123"}, {"bucket": [bucket]}
        return {"bucket": "ckpt-123"}, {}

    out = [bucket]
    if sse:
        props, deps = ref()
        props["rules"] = [{"applyServerSideEncryptionByDefault": {"sseAlgorithm": "aws:kms"}, "bucketKeyEnabled": True}]
        out.append(resource(SSE, "ckpt-sse", props, deps))
    if flags is not None:
        props, deps = ref()
        props.update({flag: True for flag in flags})
        out.append(resource(PAB, "ckpt-pab", props, deps))
    props, deps = ref()
    props["policy"] = tls_only_document() if document is None else document
    out.append(resource(POLICY, "ckpt-policy", props, deps))
    return out


@pytest.mark.parametrize("linked_by", ["dependency", "value"])
def test_fully_configured_bucket_passes(linked_by):
    resources = bucket_stack(linked_by=linked_by)
    assert check_stack("bucket-encrypted", resources) == []
    assert check_stack("bucket-private-tls-only", resources) == []


def test_bucket_without_encryption_fails():
    resources = bucket_stack(sse=False)
    found = check_stack("bucket-encrypted", resources)
    assert [urn for _, urn in found] == [resources[0].urn]
    assert "no server-side encryption configuration" in found[0][0]


def test_inline_encryption_counts():
    bucket = resource(
        BUCKET,
        "old",
        {
            "serverSideEncryptionConfiguration": {
                "rule": {"applyServerSideEncryptionByDefault": {"sseAlgorithm": "AES256"}}
            }
        },
    )
    assert check_stack("bucket-encrypted", [bucket]) == []


def test_encryption_of_another_bucket_does_not_count():
    other = resource(BUCKET, "other", {"bucket": "other-1"})
    resources = bucket_stack() + [other]
    found = check_stack("bucket-encrypted", resources)
    assert [urn for _, urn in found] == [other.urn]


def test_missing_public_access_flag_fails_naming_it():
    found = check_stack("bucket-private-tls-only", bucket_stack(flags=FLAGS[:3]))
    assert len(found) == 1
    assert "restrictPublicBuckets not true" in found[0][0]


def test_no_public_access_block_fails():
    found = check_stack("bucket-private-tls-only", bucket_stack(flags=None))
    assert len(found) == 1 and "does not block public access" in found[0][0]


@pytest.mark.parametrize(
    "document",
    [
        json.dumps({"Statement": [{"Effect": "Allow", "Principal": "*", "Action": "s3:GetObject", "Resource": "*"}]}),
        json.dumps(
            {
                "Statement": [
                    {
                        "Effect": "Deny",
                        "Principal": "*",
                        "Action": "s3:*",
                        "Resource": "*",
                        "Condition": {"Bool": {"aws:SecureTransport": "true"}},
                    }
                ]
            }
        ),
        "not json at all",
        "",
    ],
)
def test_policy_without_tls_deny_fails(document):
    found = check_stack("bucket-private-tls-only", bucket_stack(document=document))
    assert len(found) == 1 and "accepts plain HTTP" in found[0][0]


def test_tls_deny_with_aws_principal_and_boolean_false_passes():
    document = {
        "Statement": [
            {
                "Effect": "Deny",
                "Principal": {"AWS": "*"},
                "Action": ["s3:*"],
                "Resource": "*",
                "Condition": {"Bool": {"aws:SecureTransport": False}},
            }
        ]
    }
    assert check_stack("bucket-private-tls-only", bucket_stack(document=json.dumps(document))) == []
