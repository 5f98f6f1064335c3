"""Every shipped stack passes every policy (the program recorded offline under Pulumi mocks)."""

from __future__ import annotations

import dataclasses
from functools import cache
from pathlib import Path

import pytest
from pulumi_policy import ResourceValidationPolicy, StackValidationPolicy

from gpucloud.infra.preview import preview_stack
from gpucloud.policy.pack import POLICIES
from gpucloud.policy.runner import run_policies
from gpucloud.spec import load_stack_file

STACKS = sorted((Path(__file__).resolve().parents[2] / "stacks").glob("Pulumi.*.yaml"))
RESOURCE_POLICIES = [p for p in POLICIES if isinstance(p, ResourceValidationPolicy)]
STACK_POLICIES = [p for p in POLICIES if isinstance(p, StackValidationPolicy)]


def stack_name(path: Path) -> str:
    return path.name[len("Pulumi.") : -len(".yaml")]


@cache
def recorded(path: Path):
    return preview_stack(load_stack_file(path), stack_name(path))


def test_stacks_are_shipped():
    assert {stack_name(p) for p in STACKS} >= {"dev", "p4d-spot", "p5-capacity-block"}


@pytest.mark.parametrize("path", STACKS, ids=stack_name)
def test_shipped_stack_passes_resource_policies(path):
    preview = recorded(path)
    violations = run_policies(preview.resources, stack=stack_name(path), policies=RESOURCE_POLICIES)
    assert [v.describe() for v in violations] == []


@pytest.mark.parametrize("path", STACKS, ids=stack_name)
def test_shipped_stack_passes_stack_policies(path):
    preview = recorded(path)
    violations = run_policies(preview.resources, stack=stack_name(path), policies=STACK_POLICIES)
    assert [v.describe() for v in violations] == []


@pytest.mark.parametrize("path", STACKS, ids=stack_name)
def test_policies_see_the_stacks_security_relevant_resources(path):
    # guards against a vacuous pass: the policies must actually have had something to check
    types = {r.type for r in recorded(path).resources}
    assert {
        "aws:ec2/launchTemplate:LaunchTemplate",
        "aws:s3/bucket:Bucket",
        "aws:sqs/queue:Queue",
        "aws:ec2/securityGroup:SecurityGroup",
    } <= types


def test_dropping_the_efa_egress_rule_from_a_shipped_stack_is_caught():
    # stack policies follow the recorded references on real program output, not just on fixtures
    path = next(p for p in STACKS if stack_name(p) == "p5-capacity-block")
    resources = [
        r
        for r in recorded(path).resources
        if not (
            r.type == "aws:vpc/securityGroupEgressRule:SecurityGroupEgressRule"
            and r.inputs.get("referencedSecurityGroupId")
        )
    ]
    violations = run_policies(resources, stack="p5-capacity-block", policies=STACK_POLICIES)
    assert [v.policy for v in violations] == ["efa-security-group-self-rules"]
    assert "egress rule referencing itself" in violations[0].message


def test_unencrypted_bucket_in_a_shipped_stack_is_caught():
    path = next(p for p in STACKS if stack_name(p) == "dev")
    resources = [
        dataclasses.replace(r, inputs={**r.inputs, "rules": []})
        if r.type.startswith("aws:s3/bucketServerSideEncryptionConfiguration")
        else r
        for r in recorded(path).resources
    ]
    violations = run_policies(resources, stack="dev", policies=STACK_POLICIES)
    assert [v.policy for v in violations] == ["bucket-encrypted"]
