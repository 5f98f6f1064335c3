"""Policy pack entry point for `pulumi preview --policy-pack src/gpucloud/policy` (serves until stopped)."""

from pulumi_policy import PolicyPack

from gpucloud.policy.pack import PACK_NAME, POLICIES

PolicyPack(name=PACK_NAME, policies=POLICIES)
