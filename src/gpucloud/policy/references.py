"""Following references between resources inside a stack policy.

A rule resource names its security group by id, a bucket policy names its bucket by name; during
``pulumi preview``/``up`` those values come from other resources' outputs, and the engine records
which resources each property was computed from (``PolicyResource.property_dependencies``). We
trust those dependencies first and fall back to comparing values with the target's identity
outputs (``id``, ``arn``, ``bucket``), which is what a hand-written literal reference looks like.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from pulumi_policy import PolicyResource

_IDENTITY_KEYS = ("id", "arn", "bucket")


def identity_values(resource: PolicyResource) -> set[str]:
    """Strings another resource could use to name ``resource``."""
    return {v for key in _IDENTITY_KEYS if isinstance(v := resource.props.get(key), str) and v}


def referenced_strings(value: Any) -> set[str]:
    """Every string inside a (possibly nested) property value."""
    found: set[str] = set()
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            found.add(item)
        elif isinstance(item, Mapping):
            stack.extend(item.values())
        elif isinstance(item, Sequence) and not isinstance(item, bytes):
            stack.extend(item)  # engine props are Sequence proxies, not lists
    return found


def references(source: PolicyResource, key: str, target: PolicyResource) -> bool:
    """Whether property ``key`` of ``source`` names ``target``."""
    if any(dep is target or dep.urn == target.urn for dep in source.property_dependencies.get(key, [])):
        return True
    return bool(identity_values(target) & referenced_strings(source.props.get(key)))


def referenced_resources(
    source: PolicyResource, key: str, candidates: Iterable[PolicyResource], value: Any = None
) -> list[PolicyResource]:
    """The ``candidates`` named by ``value`` (default: ``source.props[key]``).

    Value matches win; the property's recorded dependencies are used when no value matched
    (the values may be computed outputs that are only linked through the dependency graph).
    """
    candidates = list(candidates)
    wanted = referenced_strings(source.props.get(key) if value is None else value)
    by_value = [c for c in candidates if identity_values(c) & wanted]
    if by_value:
        return by_value
    deps = {dep.urn for dep in source.property_dependencies.get(key, [])}
    return [c for c in candidates if c.urn in deps]
