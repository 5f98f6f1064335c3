"""Build by hand the argument bags the Pulumi engine hands to policies (as the reference shows)."""

from __future__ import annotations

from typing import Any

from pulumi_policy import (
    PolicyResource,
    PolicyResourceOptions,
    ResourceValidationArgs,
    StackValidationArgs,
)
from pulumi_policy.proxy import unknown_checking_proxy

from gpucloud.policy.pack import POLICIES

STACK = "dev"


def urn(resource_type: str, name: str, stack: str = STACK) -> str:
    return f"urn:pulumi:{stack}::gpucloud::{resource_type}::{name}"


def options() -> PolicyResourceOptions:
    return PolicyResourceOptions(
        protect=False,
        ignore_changes=[],
        delete_before_replace=None,
        aliases=[],
        custom_timeouts=None,
        additional_secret_outputs=[],
    )


def policy_named(name: str):
    return next(p for p in POLICIES if p.name == name)


def check_resource(
    policy_name: str, resource_type: str, props: dict[str, Any], *, name: str = "r", stack: str = STACK
) -> list[str]:
    """Messages the named resource policy reports for one resource."""
    found: list[str] = []
    # the engine wraps props in Mapping/Sequence proxies (not dict/list): test through the same wrapper
    args = ResourceValidationArgs(
        resource_type, unknown_checking_proxy(props), urn(resource_type, name, stack), name, options(), None, {}
    )
    policy_named(policy_name).validate(args, lambda message, urn=None: found.append(message))
    return found


def resource(
    resource_type: str, name: str, props: dict[str, Any], deps: dict[str, list[PolicyResource]] | None = None
) -> PolicyResource:
    return PolicyResource(
        resource_type,
        unknown_checking_proxy(props),
        urn(resource_type, name),
        name,
        options(),
        None,
        None,
        [],
        deps or {},
    )


def check_stack(policy_name: str, resources: list[PolicyResource]) -> list[tuple[str, str | None]]:
    """(message, urn) pairs the named stack policy reports."""
    found: list[tuple[str, str | None]] = []
    policy_named(policy_name).validate(
        StackValidationArgs(resources, {}), lambda message, urn=None: found.append((message, urn))
    )
    return found
