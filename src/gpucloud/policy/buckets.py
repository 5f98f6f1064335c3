"""S3 buckets: encrypted, public access blocked (all four flags), and reachable over TLS only.

In pulumi-aws 7 each of these is its own resource pointing at the bucket, so this is a stack policy
that pairs every bucket with its configuration resources.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from pulumi_policy import PolicyResource, ReportViolation, StackValidationArgs

from gpucloud.policy import resource_types as rt
from gpucloud.policy.props import as_list, as_mappings, get_path, is_true, parse_json_document, statements, string_set
from gpucloud.policy.references import references

SSE_ALGORITHMS = frozenset({"AES256", "aws:kms", "aws:kms:dsse"})
PUBLIC_ACCESS_FLAGS = ("blockPublicAcls", "blockPublicPolicy", "ignorePublicAcls", "restrictPublicBuckets")


def _rules_encrypt(rules: Any) -> bool:
    return any(
        get_path(rule, "applyServerSideEncryptionByDefault", "sseAlgorithm") in SSE_ALGORITHMS
        for rule in as_mappings(rules)
    )


def bucket_is_encrypted(bucket: PolicyResource, resources: Sequence[PolicyResource]) -> bool:
    inline = bucket.props.get("serverSideEncryptionConfiguration")
    if isinstance(inline, Mapping) and _rules_encrypt(inline.get("rule") or inline.get("rules")):
        return True
    return any(
        r.resource_type in rt.S3_BUCKET_ENCRYPTION
        and references(r, "bucket", bucket)
        and _rules_encrypt(r.props.get("rules"))
        for r in resources
    )


def missing_public_access_flags(bucket: PolicyResource, resources: Sequence[PolicyResource]) -> list[str]:
    """The public-access-block flags not set for ``bucket`` (all four when there is no block)."""
    blocks = [r for r in resources if r.resource_type == rt.S3_PUBLIC_ACCESS_BLOCK and references(r, "bucket", bucket)]
    if not blocks:
        return list(PUBLIC_ACCESS_FLAGS)
    return min(([f for f in PUBLIC_ACCESS_FLAGS if not is_true(b.props.get(f))] for b in blocks), key=len)


def _denies_insecure_transport(statement: Mapping[str, Any]) -> bool:
    if statement.get("Effect") != "Deny":
        return False
    principal = statement.get("Principal")
    if not (principal == "*" or "*" in string_set(get_path(principal, "AWS"))):
        return False
    if not string_set(statement.get("Action")) & {"s3:*", "*"}:
        return False
    secure = get_path(statement, "Condition", "Bool", "aws:SecureTransport")
    return any(str(v).lower() == "false" for v in as_list(secure))


def bucket_is_tls_only(bucket: PolicyResource, resources: Sequence[PolicyResource]) -> bool:
    for policy in resources:
        if policy.resource_type == rt.S3_BUCKET_POLICY and references(policy, "bucket", bucket):
            document = parse_json_document(policy.props.get("policy"))
            if any(_denies_insecure_transport(s) for s in statements(document)):
                return True
    return False


def buckets_encrypted(args: StackValidationArgs, report: ReportViolation) -> None:
    resources = list(args.resources)
    for bucket in (r for r in resources if r.resource_type in rt.S3_BUCKETS):
        if not bucket_is_encrypted(bucket, resources):
            report(
                f"bucket {bucket.name!r} has no server-side encryption configuration; add an "
                "s3.BucketServerSideEncryptionConfiguration with sseAlgorithm AES256, aws:kms or aws:kms:dsse",
                bucket.urn,
            )


def buckets_private_and_tls_only(args: StackValidationArgs, report: ReportViolation) -> None:
    resources = list(args.resources)
    for bucket in (r for r in resources if r.resource_type in rt.S3_BUCKETS):
        missing = missing_public_access_flags(bucket, resources)
        if missing:
            report(
                f"bucket {bucket.name!r} does not block public access ({', '.join(missing)} not true); add an "
                "s3.BucketPublicAccessBlock with all four flags true",
                bucket.urn,
            )
        if not bucket_is_tls_only(bucket, resources):
            report(
                f"bucket {bucket.name!r} accepts plain HTTP; add a bucket policy statement that denies s3:* to "
                "principal * when aws:SecureTransport is false",
                bucket.urn,
            )
