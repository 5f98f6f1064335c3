"""Run the policy pack over resources recorded offline (Pulumi mocks), without the Pulumi CLI.

``gpucloud plan`` and the tests record each registered resource (type, name, camelCase inputs);
this module turns them into the ``ResourceValidationArgs`` / ``StackValidationArgs`` the engine
would build and collects every violation. References between resources (a rule's
``securityGroupId``, a bucket policy's ``bucket``) are rebuilt as the engine's property
dependencies by matching the recorded resource ids, so stack policies see the same graph.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Iterable, Mapping, Sequence
from inspect import isawaitable
from typing import Any, Protocol

from pulumi_policy import (
    EnforcementLevel,
    Policy,
    PolicyResource,
    PolicyResourceOptions,
    ResourceValidationArgs,
    ResourceValidationPolicy,
    StackValidationArgs,
    StackValidationPolicy,
)
from pulumi_policy.proxy import unknown_checking_proxy

from gpucloud.policy.pack import POLICIES
from gpucloud.policy.references import referenced_strings


class RecordedResourceLike(Protocol):
    """What the runner needs of a recorded resource (``gpucloud.infra.preview.RecordedResource``)."""

    @property
    def type(self) -> str: ...
    @property
    def name(self) -> str: ...
    @property
    def inputs(self) -> Mapping[str, Any]: ...
    @property
    def custom(self) -> bool: ...

    # optional, used when present: ``urn``; ``property_dependencies`` (camelCase property -> URNs it
    # was computed from, as the engine receives them); ``id`` (the id the provider returned)


@dataclasses.dataclass(frozen=True)
class Violation:
    policy: str
    enforcement: str  # "mandatory" | "advisory"
    resource_type: str | None  # None: reported against the stack as a whole
    resource_name: str | None
    message: str

    def describe(self) -> str:
        where = f"{self.resource_type} {self.resource_name!r}: " if self.resource_name else ""
        return f"[{self.policy}] {where}{self.message}"


def _options(parent: str | None) -> PolicyResourceOptions:
    return PolicyResourceOptions(
        protect=False,
        ignore_changes=[],
        delete_before_replace=None,
        aliases=[],
        custom_timeouts=None,  # type: ignore[arg-type]  # the engine sends none for a preview
        additional_secret_outputs=[],
        parent=parent,
    )


def urn_for(stack: str, project: str, resource_type: str, name: str) -> str:
    return f"urn:pulumi:{stack}::{project}::{resource_type}::{name}"


def to_policy_resources(resources: Iterable[RecordedResourceLike], *, stack: str, project: str) -> list[PolicyResource]:
    """Custom resources as the engine's ``PolicyResource``s, with property dependencies rebuilt."""
    custom = [r for r in resources if getattr(r, "custom", True)]
    policy_resources = [
        PolicyResource(
            r.type,
            unknown_checking_proxy(dict(r.inputs)),  # the same Mapping/Sequence wrappers the engine uses
            getattr(r, "urn", None) or urn_for(stack, project, r.type, r.name),
            r.name,
            _options(getattr(r, "parent", None)),
            None,
            None,
            [],
            {},
        )
        for r in custom
    ]
    by_urn = {r.urn: r for r in policy_resources}
    by_id: dict[str, PolicyResource] = {}
    for recorded, resource in zip(custom, policy_resources, strict=True):
        resource_id = getattr(recorded, "id", None)
        if isinstance(resource_id, str) and resource_id:
            by_id[resource_id] = resource
    for recorded, resource in zip(custom, policy_resources, strict=True):
        recorded_deps: Mapping[str, Sequence[str]] = getattr(recorded, "property_dependencies", None) or {}
        for key, value in resource.props.items():
            deps = [by_urn[urn] for urn in recorded_deps.get(key, ()) if urn in by_urn]
            deps += [by_id[s] for s in referenced_strings(value) if s in by_id]
            deps = [d for d in {d.urn: d for d in deps}.values() if d is not resource]
            if deps:
                resource.property_dependencies[key] = deps
                resource.dependencies.extend(d for d in deps if d not in resource.dependencies)
    return policy_resources


def _run(result: Any) -> None:
    """Finish an async validation on its own loop, as the analyzer service does."""
    if result is not None and isawaitable(result):
        loop = asyncio.new_event_loop()
        try:
            loop.run_until_complete(result)
        finally:
            loop.close()


def _level(policy: Policy) -> str:
    level = policy.enforcement_level or EnforcementLevel.ADVISORY
    return level.value


def run_policies(
    resources: Iterable[RecordedResourceLike],
    *,
    stack: str,
    project: str = "gpucloud",
    policies: Sequence[Policy] = POLICIES,
) -> list[Violation]:
    """Every violation the policy pack reports for these resources, resource policies first."""
    policy_resources = to_policy_resources(resources, stack=stack, project=project)
    by_urn = {r.urn: r for r in policy_resources}
    violations: list[Violation] = []

    def reporter(policy: Policy, default: PolicyResource | None):
        def report(message: str, urn: str | None = None) -> None:
            target = by_urn.get(urn) if urn else default
            violations.append(
                Violation(
                    policy=policy.name,
                    enforcement=_level(policy),
                    resource_type=target.resource_type if target else None,
                    resource_name=target.name if target else None,
                    message=message,
                )
            )

        return report

    for policy in policies:
        if isinstance(policy, ResourceValidationPolicy):
            for resource in policy_resources:
                args = ResourceValidationArgs(
                    resource.resource_type, resource.props, resource.urn, resource.name, resource.opts, None, {}
                )
                _run(policy.validate(args, reporter(policy, resource)))
        elif isinstance(policy, StackValidationPolicy):
            _run(policy.validate(StackValidationArgs(policy_resources, {}), reporter(policy, None)))
    return violations
