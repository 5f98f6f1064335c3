"""Reading Pulumi wire properties defensively.

Policies see properties the way the engine (or the Pulumi mocks) records them: camelCase keys,
numbers as floats, booleans sometimes as the strings ``"true"``/``"false"`` (launch template
fields are strings in the provider schema), JSON documents as strings, and any key may be missing.
These helpers turn that into plain Python values so a policy never crashes on a missing key.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any


def get_path(props: Mapping[str, Any] | None, *keys: str) -> Any:
    """``props[k1][k2]...``, or None as soon as a level is missing or not a mapping."""
    value: Any = props
    for key in keys:
        if not isinstance(value, Mapping):
            return None
        value = value.get(key)
    return value


def as_list(value: Any) -> list[Any]:
    """A list property as a list: None -> [], a single item -> [item]."""
    if value is None:
        return []
    if isinstance(value, (str, bytes, Mapping)):
        return [value]
    if isinstance(value, Sequence):
        return list(value)
    return [value]


def as_mappings(value: Any) -> list[Mapping[str, Any]]:
    """The mapping items of a list-of-objects property (anything else is skipped)."""
    return [item for item in as_list(value) if isinstance(item, Mapping)]


def is_true(value: Any) -> bool:
    """True for ``True`` and the schema strings ``"true"``; everything else (missing too) is False."""
    if isinstance(value, bool):
        return value
    if isinstance(value, str):
        return value.strip().lower() == "true"
    return False


def parse_json_document(value: Any) -> Mapping[str, Any] | None:
    """A policy document given as a JSON string (the provider's form) or already as a mapping."""
    if isinstance(value, Mapping):
        return value
    if isinstance(value, str) and value.strip():
        try:
            parsed = json.loads(value)
        except json.JSONDecodeError:
            return None
        return parsed if isinstance(parsed, Mapping) else None
    return None


def statements(document: Mapping[str, Any] | None) -> list[Mapping[str, Any]]:
    """The ``Statement`` entries of a policy document (a single statement may be an object)."""
    if document is None:
        return []
    return as_mappings(document.get("Statement"))


def string_set(value: Any) -> set[str]:
    """A string-or-list-of-strings IAM field (Action, Resource, ...) as a set of strings."""
    return {item for item in as_list(value) if isinstance(item, str)}
