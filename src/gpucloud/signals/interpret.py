"""Pure functions: IMDS interruption items (text as served) -> ``Notice`` or nothing.

No I/O here, so every rule is a plain unit test. The rules (NTH's, plus the AWS docs' caveats):

- ``spot/instance-action`` ``{"action","time"}``: ``terminate``/``stop`` -> deadline = ``time``;
  ``hibernate`` -> deadline = now (hibernation starts at once, there is no lead).
- A notice whose ``time`` is more than ``stale_after`` seconds (default 300) in the past is stale and
  ignored: EC2 acts within seconds of that time, so a node still running minutes later is looking at
  the left-over of a failed termination (the docs say ``termination-time`` keeps its old value) or
  at a node resumed from hibernation. A notice a little in the past is not stale: it is urgent.
- ``spot/termination-time`` (legacy, plain text) counts as ``terminate`` at that time, with the same
  dedup key as the matching ``instance-action``, so both paths together make one notice.
- ``events/recommendations/rebalance`` ``{"noticeTime"}`` -> ``rebalance``, no deadline.
- ``autoscaling/target-lifecycle-state`` ``Terminated`` -> ``asg-terminate``; IMDS does not show the
  lifecycle hook's heartbeat timeout, so the deadline is first sight + ``asg_deadline`` (a parameter).
- ``events/maintenance/scheduled`` (JSON array): ``active`` events with a stop, reboot or retirement
  code -> ``scheduled-maintenance`` with deadline = ``NotBefore`` (layout ``2 Jan 2006 15:04:05 GMT``);
  ``system-maintenance`` (the instance keeps running), ``completed``/``canceled`` events and events
  whose ``NotAfter`` has passed are ignored.

Dedup keys hash the *parsed* payload (canonical time strings), so whitespace or key order in the
served JSON never makes one notice look like two.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
from typing import Any

from gpucloud import payload
from gpucloud.signals.events import Notice, event_id_for

INSTANCE_ACTION = "/latest/meta-data/spot/instance-action"
TERMINATION_TIME = "/latest/meta-data/spot/termination-time"
REBALANCE = "/latest/meta-data/events/recommendations/rebalance"
TARGET_LIFECYCLE_STATE = "/latest/meta-data/autoscaling/target-lifecycle-state"
SCHEDULED_EVENTS = "/latest/meta-data/events/maintenance/scheduled"

SPOT_ACTIONS = ("terminate", "stop", "hibernate")
LIFECYCLE_STATES = (
    "InService",
    "Terminated",
    "Detached",
    "Standby",
    "Pending",
    "Warmed:Hibernated",
    "Warmed:Running",
    "Warmed:Stopped",
    "Warmed:Terminated",
)
STOP_EVENT_CODES = ("instance-stop", "instance-retirement", "instance-reboot", "system-reboot")
EVENT_CODES = STOP_EVENT_CODES + ("system-maintenance",)
EVENT_STATES = ("active", "completed", "canceled")

DEFAULT_STALE_AFTER = 300.0
DEFAULT_ASG_DEADLINE = 120.0

IMDS_EVENT_TIME_LAYOUT = "%d %b %Y %H:%M:%S GMT"  # Go's "2 Jan 2006 15:04:05 GMT"


class MalformedPayload(ValueError):
    """An interruption item answered 200 with a body that is not the documented format."""


@dataclasses.dataclass(frozen=True)
class InterpretRules:
    stale_after: float = DEFAULT_STALE_AFTER  # seconds past a spot notice's time before it is stale
    asg_deadline: float = DEFAULT_ASG_DEADLINE  # seconds from seeing lifecycle Terminated to the deadline

    def __post_init__(self) -> None:
        if self.stale_after <= 0:
            raise ValueError(f"stale_after must be positive seconds, got {self.stale_after}")
        if self.asg_deadline < 0:
            raise ValueError(f"asg_deadline must be >= 0 seconds, got {self.asg_deadline}")


# -- time formats ----------------------------------------------------------------------------
def parse_rfc3339(text: str) -> float:
    """``2017-09-18T08:22:00Z`` (or with an offset / fraction) -> epoch seconds; naive means UTC."""
    try:
        value = dt.datetime.fromisoformat(text.strip().replace("z", "Z"))
    except (ValueError, AttributeError) as err:
        raise MalformedPayload(f"time {text!r} is not RFC 3339 (e.g. 2017-09-18T08:22:00Z)") from err
    if value.tzinfo is None:
        value = value.replace(tzinfo=dt.timezone.utc)
    return value.timestamp()


def format_rfc3339(epoch: float) -> str:
    return dt.datetime.fromtimestamp(epoch, dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_event_time(text: str) -> float:
    """``21 Jan 2019 09:00:43 GMT`` (the scheduled-events layout) -> epoch seconds."""
    try:
        value = dt.datetime.strptime(text.strip(), IMDS_EVENT_TIME_LAYOUT)
    except (ValueError, AttributeError) as err:
        raise MalformedPayload(f"event time {text!r} is not in the layout '2 Jan 2006 15:04:05 GMT'") from err
    return value.replace(tzinfo=dt.timezone.utc).timestamp()


def format_event_time(epoch: float) -> str:
    value = dt.datetime.fromtimestamp(epoch, dt.timezone.utc)
    return f"{value.day} {value.strftime('%b %Y %H:%M:%S')} GMT"


def _json_object(text: str, what: str) -> dict[str, Any]:
    return payload.json_object(text, what, MalformedPayload)


def _string_field(data: dict[str, Any], key: str, what: str) -> str:
    return payload.required_string(data, key, what, MalformedPayload)


# -- spot ------------------------------------------------------------------------------------
def spot_notice(
    action: str, when: float, now: float, rules: InterpretRules, *, payload: dict[str, Any]
) -> Notice | None:
    """A spot interruption for ``action`` at ``when``; None when stale."""
    if when < now - rules.stale_after:
        return None
    key = {"action": action, "time": format_rfc3339(when)}
    deadline = now if action == "hibernate" else when
    return Notice(
        kind="spot-interruption",
        source="imds",
        deadline=deadline,
        received_at=now,
        event_id=event_id_for("spot-interruption", key),
        action=action,
        payload=payload,
    )


def instance_action_notice(text: str, now: float, rules: InterpretRules = InterpretRules()) -> Notice | None:
    data = _json_object(text, "spot/instance-action")
    action = _string_field(data, "action", "spot/instance-action")
    if action not in SPOT_ACTIONS:
        raise MalformedPayload(f"spot/instance-action action {action!r} is not one of {', '.join(SPOT_ACTIONS)}")
    when = parse_rfc3339(_string_field(data, "time", "spot/instance-action"))
    return spot_notice(action, when, now, rules, payload=data)


def termination_time_notice(text: str, now: float, rules: InterpretRules = InterpretRules()) -> Notice | None:
    stamp = text.strip()
    when = parse_rfc3339(stamp)
    return spot_notice("terminate", when, now, rules, payload={"termination-time": stamp})


# -- rebalance -------------------------------------------------------------------------------
def rebalance_notice(text: str, now: float) -> Notice:
    data = _json_object(text, "events/recommendations/rebalance")
    notice_time = parse_rfc3339(_string_field(data, "noticeTime", "events/recommendations/rebalance"))
    return Notice(
        kind="rebalance",
        source="imds",
        deadline=None,
        received_at=now,
        event_id=event_id_for("rebalance", {"noticeTime": format_rfc3339(notice_time)}),
        action="rebalance",
        payload=data,
    )


# -- autoscaling target lifecycle state ------------------------------------------------------
def lifecycle_notice(text: str, now: float, rules: InterpretRules = InterpretRules()) -> Notice | None:
    state = text.strip()
    if state not in LIFECYCLE_STATES:
        raise MalformedPayload(
            f"autoscaling/target-lifecycle-state {state[:40]!r} is not one of {', '.join(LIFECYCLE_STATES)}"
        )
    if state != "Terminated":
        return None
    return Notice(
        kind="asg-terminate",
        source="imds",
        deadline=now + rules.asg_deadline,
        received_at=now,
        event_id=event_id_for("asg-terminate", {"target-lifecycle-state": state}),
        action=state,
        payload={"target-lifecycle-state": state, "assumed_deadline_seconds": rules.asg_deadline},
    )


# -- scheduled events ------------------------------------------------------------------------
def scheduled_notices(text: str, now: float) -> tuple[list[Notice], list[str]]:
    """Notices for active stop/reboot/retirement events, and one problem line per bad event."""
    try:
        data = json.loads(text) if text.strip() else []
    except json.JSONDecodeError as err:
        raise MalformedPayload(
            f"events/maintenance/scheduled is not JSON ({err.msg} at char {err.pos}): {text[:80]!r}"
        ) from err
    if not isinstance(data, list):
        raise MalformedPayload(f"events/maintenance/scheduled is JSON {type(data).__name__}, expected an array")
    notices: list[Notice] = []
    problems: list[str] = []
    for index, item in enumerate(data):
        try:
            notice = _scheduled_notice(item, now)
        except MalformedPayload as err:
            problems.append(f"scheduled event #{index}: {err}")
            continue
        if notice is not None:
            notices.append(notice)
    return notices, problems


def _scheduled_notice(item: Any, now: float) -> Notice | None:
    if not isinstance(item, dict):
        raise MalformedPayload(f"is JSON {type(item).__name__}, expected an object")
    what = "scheduled event"
    code = _string_field(item, "Code", what)
    state = _string_field(item, "State", what)
    if state not in EVENT_STATES:
        raise MalformedPayload(f"State {state!r} is not one of {', '.join(EVENT_STATES)}")
    if code not in EVENT_CODES:
        raise MalformedPayload(f"Code {code!r} is not one of {', '.join(EVENT_CODES)}")
    not_before = parse_event_time(_string_field(item, "NotBefore", what))
    not_after_text = item.get("NotAfter")
    not_after = parse_event_time(not_after_text) if isinstance(not_after_text, str) and not_after_text.strip() else None
    if state != "active" or code not in STOP_EVENT_CODES:
        return None
    if not_after is not None and not_after < now:
        return None  # the maintenance window is over
    key = {"EventId": item.get("EventId"), "Code": code, "NotBefore": format_event_time(not_before)}
    return Notice(
        kind="scheduled-maintenance",
        source="imds",
        deadline=not_before,
        received_at=now,
        event_id=event_id_for("scheduled-maintenance", key),
        action=code,
        payload=item,
    )
