"""Every taggable AWS resource carries the stack tag, so cost and cleanup can find it.

Whether a type is taggable is read from the pulumi-aws SDK itself (the resource takes a ``tags``
argument), so a resource type added to the program later is covered without editing a list here.
The tag value must name the stack in the resource's URN. Autoscaling groups take tags as a list
of ``{key, value, propagateAtLaunch}``; the stack tag must propagate so the nodes carry it too.
"""

from __future__ import annotations

import importlib
import inspect
import re
from collections.abc import Mapping
from functools import cache
from typing import Any

from pulumi_policy import ReportViolation, ResourceValidationArgs, StackValidationArgs

from gpucloud.policy import resource_types as rt
from gpucloud.policy.props import as_mappings, is_true

STACK_TAG = "gpucloud:stack"
EXPIRES_AT_TAG = "gpucloud:expires-at"  # gpucloud:ttlHours (cluster/tags.py)
_TOKEN = re.compile(r"^aws:(?P<module>[A-Za-z0-9]+)(?:/[A-Za-z0-9]+)?:(?P<cls>[A-Za-z0-9]+)$")
_URN_STACK = re.compile(r"^urn:pulumi:(?P<stack>[^:]+)::")


@cache
def is_taggable(resource_type: str) -> bool | None:
    """True/False from the pulumi-aws SDK; None when the type is not an AWS type the SDK knows."""
    match = _TOKEN.match(resource_type)
    if match is None:
        return None
    module_name = "pulumi_aws" if match["module"] == "index" else f"pulumi_aws.{match['module']}"
    try:
        cls = getattr(importlib.import_module(module_name), match["cls"])
        return "tags" in inspect.signature(cls._internal_init).parameters
    except (ImportError, AttributeError, TypeError, ValueError):
        return None


def stack_from_urn(urn: str) -> str | None:
    match = _URN_STACK.match(urn or "")
    return match["stack"] if match else None


def _stack_tag(props: Any, resource_type: str) -> tuple[Any, bool]:
    """The stack tag's value (None when absent) and whether it propagates (ASG only)."""
    if resource_type == rt.AUTOSCALING_GROUP:
        for tag in as_mappings(props.get("tags")):
            if tag.get("key") == STACK_TAG:
                return tag.get("value"), is_true(tag.get("propagateAtLaunch"))
        return None, False
    for key in ("tags", "tagsAll"):  # tagsAll: provider default tags, seen in outputs
        tags = props.get(key)
        if isinstance(tags, Mapping) and STACK_TAG in tags:
            return tags[STACK_TAG], True
    return None, True


def tagged_with_stack(args: ResourceValidationArgs, report: ReportViolation) -> None:
    taggable = is_taggable(args.resource_type)
    if taggable is None:
        taggable = "tags" in args.props  # not in the SDK we have: trust the shape we see
    if not taggable:
        return
    value, propagates = _stack_tag(args.props, args.resource_type)
    stack = stack_from_urn(args.urn)
    if not isinstance(value, str) or not value:
        report(f"missing tag {STACK_TAG!r}; tag it with the stack name{f' ({stack!r})' if stack else ''}", None)
    elif stack is not None and value != stack:
        report(f"tag {STACK_TAG!r} is {value!r} but the resource belongs to stack {stack!r}", None)
    elif not propagates:
        report(f"tag {STACK_TAG!r} must set propagateAtLaunch true so the group's instances carry it", None)


def _tag_value(props: Any, resource_type: str, key: str) -> Any:
    if resource_type == rt.AUTOSCALING_GROUP:
        return next((t.get("value") for t in as_mappings(props.get("tags")) if t.get("key") == key), None)
    tags = props.get("tags")
    return tags.get(key) if isinstance(tags, Mapping) else None


def expiry_on_every_resource(args: StackValidationArgs, report: ReportViolation) -> None:
    """With gpucloud:ttlHours, every resource carrying the stack tag carries the one gpucloud:expires-at:
    `gpucloud sweep --expired` deletes by resource, so one without it would outlive its stack."""
    tagged = [r for r in args.resources if _stack_tag(r.props, r.resource_type)[0] is not None]
    values = {_tag_value(r.props, r.resource_type, EXPIRES_AT_TAG) for r in tagged} - {None}
    if not values:
        return  # no TTL on this stack
    expected = sorted(map(str, values))[0]
    for r in tagged:
        value = _tag_value(r.props, r.resource_type, EXPIRES_AT_TAG)
        if value != expected:
            found = "no" if value is None else f"{value!r} as"
            report(
                f"{r.name!r} has {found} {EXPIRES_AT_TAG!r}; every resource of a stack with a TTL has {expected!r}",
                r.urn,
            )
