"""Builders of DynamoDB write operations (pure), shaped for ``TransactWriteItems`` entries and for
``UpdateItem`` alike.

Every attribute name in an expression goes through ``ExpressionAttributeNames`` (``state``,
``data`` and ``number`` are DynamoDB reserved words), and only the names and values an expression
uses are passed: DynamoDB rejects unused ones, even where a local emulator would not.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from gpucloud.queue.aws.items import Item, av
from gpucloud.queue.aws.schema import HASH_KEY, RANGE_KEY

_NAME_TOKEN = re.compile(r"#(\w+)")
_VALUE_TOKEN = re.compile(r":(\w+)")


def names_in(expression: str) -> dict[str, str]:
    return {f"#{name}": name for name in _NAME_TOKEN.findall(expression)}


def values_in(expression: str, values: Mapping[str, Any]) -> dict[str, Any]:
    used = set(_VALUE_TOKEN.findall(expression))
    missing = used - set(values)
    if missing:
        raise KeyError(f"expression {expression!r} uses :{sorted(missing)[0]} without a value")
    return {f":{name}": av(values[name]) for name in sorted(used)}


def update(
    table: str,
    key: Item,
    fields: Mapping[str, Any],
    *,
    condition: str | None = None,
    values: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """An ``Update``: ``fields`` set (a None value removes the attribute), guarded by ``condition``
    (written with ``#name`` and ``:value`` placeholders; ``values`` holds the latter, unprefixed)."""
    set_values = {f"set_{name}": value for name, value in fields.items() if value is not None}
    assignments = [f"#{name} = :set_{name}" for name, value in fields.items() if value is not None]
    removals = [f"#{name}" for name, value in fields.items() if value is None]
    expression = " ".join(
        part
        for part in (
            "SET " + ", ".join(assignments) if assignments else "",
            "REMOVE " + ", ".join(removals) if removals else "",
        )
        if part
    )
    if not expression:
        raise ValueError("an update must set or remove at least one attribute")
    op: dict[str, Any] = {"TableName": table, "Key": key, "UpdateExpression": expression}
    names = names_in(expression)
    all_values = dict(set_values)
    if condition:
        op["ConditionExpression"] = condition
        names.update(names_in(condition))
        all_values.update(values or {})
    op["ExpressionAttributeNames"] = names
    used = values_in(expression + " " + (condition or ""), all_values)
    if used:
        op["ExpressionAttributeValues"] = used
    return op


def put(
    table: str, item: Item, *, condition: str | None = None, values: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    op: dict[str, Any] = {"TableName": table, "Item": item}
    if condition:
        op.update(_guard(condition, values))
    return op


def delete(
    table: str, key: Item, *, condition: str | None = None, values: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    op: dict[str, Any] = {"TableName": table, "Key": key}
    if condition:
        op.update(_guard(condition, values))
    return op


def check(table: str, key: Item, condition: str, values: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """A ``ConditionCheck`` (transactions only): the write fails unless ``condition`` holds."""
    return {"TableName": table, "Key": key, **_guard(condition, values)}


def _guard(condition: str, values: Mapping[str, Any] | None) -> dict[str, Any]:
    guard: dict[str, Any] = {"ConditionExpression": condition, "ExpressionAttributeNames": names_in(condition)}
    used = values_in(condition, values or {})
    if used:
        guard["ExpressionAttributeValues"] = used
    return guard


def key_condition(table: str, pk: str, sk_prefix: str | None) -> dict[str, Any]:
    """``Query`` parameters for the items of one partition whose sort key starts with ``sk_prefix``
    (None: every item of the partition)."""
    if sk_prefix is None:
        return {
            "TableName": table,
            "KeyConditionExpression": "#pk = :pk",
            "ExpressionAttributeNames": {"#pk": HASH_KEY},
            "ExpressionAttributeValues": {":pk": {"S": pk}},
            "ConsistentRead": True,
        }
    return {
        "TableName": table,
        "KeyConditionExpression": "#pk = :pk AND begins_with(#sk, :prefix)",
        "ExpressionAttributeNames": {"#pk": HASH_KEY, "#sk": RANGE_KEY},
        "ExpressionAttributeValues": {":pk": {"S": pk}, ":prefix": {"S": sk_prefix}},
        "ConsistentRead": True,
    }
