"""The other code that must reach a node: gpucloud itself (``gpucloud:agent.package``). Pure.

The shipped stacks name ``s3://my-gpucloud-artifacts/wheels/...``, a bucket that is not the
user's: until it is replaced, every node's bootstrap fails to copy the wheel (AccessDenied or
NoSuchBucket) and no agent ever starts. Validation cannot refuse it (a bucket of that name may
exist and be someone's), so ``gpucloud plan`` warns.
"""

from __future__ import annotations

from gpucloud.spec.model import S3Object

# The shipped stacks' bucket, and the examples of the docs and the validation messages.
PLACEHOLDER_BUCKETS = frozenset({"my-gpucloud-artifacts", "my-artifacts", "my-bucket", "acme-artifacts"})


def placeholder_warning(package: str | None) -> str | None:
    """One line when ``package`` (the stack's ``gpucloud:agent.package``) names a placeholder bucket."""
    found = S3Object.parse(package)
    if found is None or found.bucket not in PLACEHOLDER_BUCKETS:
        return None
    return (
        f"gpucloud:agent.package names the placeholder bucket {found.bucket} ({package}): nodes will not find "
        "their agent; upload the wheel to your bucket and name it there (docs/cluster-as-code.md, Node bootstrap)"
    )
