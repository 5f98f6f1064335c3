"""Which found resources sweep deletes, in which order, and why it skips the others. Pure.

A resource is deleted only when it carries ``gpucloud:stack`` (with the stack asked for, or any with
``--all``), is not kept (``model.keep_tag``: ``gpucloud:keep`` in any case, any value but false / no / 0
/ off), and passes the age and expiry filters. Age: a resource's own
creation time where AWS gives one, else its stack's oldest known one (a VPC or a queue has none, but
it is as old as the stack it belongs to).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import re
from collections.abc import Iterable

from gpucloud.cluster.tags import EXPIRES_AT_TAG, STACK_TAG
from gpucloud.errors import UserError
from gpucloud.teardown.model import DELETE_ORDER, Found, keep_tag

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhdw])\s*$")
_UNIT_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


def parse_duration(text: str) -> dt.timedelta:
    """``6h``, ``30m``, ``2d``, ``1w``, ``90s``: a UserError naming the form otherwise."""
    match = _DURATION.match(text)
    if match is None or float(match.group(1)) <= 0:
        raise UserError(
            f"--older-than {text!r} is not a duration; allowed: a positive number and a unit s, m, h, d or w (e.g. 6h)"
        )
    return dt.timedelta(seconds=float(match.group(1)) * _UNIT_SECONDS[match.group(2)])


@dataclasses.dataclass(frozen=True)
class Selection:
    """What the user asked to sweep. ``stack`` None means every stack (``--all``)."""

    stack: str | None
    older_than: dt.timedelta | None = None
    expired_only: bool = False


@dataclasses.dataclass(frozen=True)
class Decision:
    found: Found
    delete: bool
    reason: str  # why skipped, or "" when deleted
    age_from: dt.datetime | None  # the creation time the age filter used


def _order(kind: str) -> int:
    return DELETE_ORDER.index(kind) if kind in DELETE_ORDER else len(DELETE_ORDER)


def _stack_created(found: Iterable[Found]) -> dict[str, dt.datetime]:
    oldest: dict[str, dt.datetime] = {}
    for f in found:
        if f.stack is not None and f.created is not None:
            oldest[f.stack] = min(oldest.get(f.stack, f.created), f.created)
    return oldest


def _skip_reason(f: Found, selection: Selection, now: dt.datetime, created: dt.datetime | None) -> str:
    if f.stack is None:
        return f"no {STACK_TAG} tag"
    if selection.stack is not None and f.stack != selection.stack:
        return f"another stack ({f.stack})"
    kept = keep_tag(f.tags)
    if kept is not None:
        return kept
    if f.kind == "iam:role" and f.spared_members():
        return f"held by instance profile {', '.join(f.spared_members())}, which sweep keeps"
    if f.kind not in DELETE_ORDER:
        return f"sweep does not delete {f.kind} resources; delete it by hand"
    if selection.older_than is not None:
        if created is None:
            return "creation time unknown (for it and its stack), so --older-than cannot vouch for it"
        if now - created < selection.older_than:
            return f"younger than --older-than (created {created.isoformat()})"
    if selection.expired_only:
        expires = f.expires_at
        if expires is None:
            return f"no {EXPIRES_AT_TAG} tag (or not a time)"
        if expires > now:
            return f"not expired (expires {expires.isoformat()})"
    return ""


def plan_sweep(found: Iterable[Found], selection: Selection, now: dt.datetime) -> list[Decision]:
    """Every found resource with its decision, in deletion order (skipped ones too, for the report).
    Resources of other stacks are left out of the list entirely: they are none of this sweep's business."""
    items = [f for f in found if selection.stack is None or f.stack == selection.stack]
    stack_created = _stack_created(items)
    decisions = []
    for f in items:
        created = f.created or (stack_created.get(f.stack) if f.stack is not None else None)
        reason = _skip_reason(f, selection, now, created)
        decisions.append(Decision(found=f, delete=not reason, reason=reason, age_from=created))
    decisions.sort(key=lambda d: (_order(d.found.kind), d.found.stack or "", d.found.arn))
    return decisions
