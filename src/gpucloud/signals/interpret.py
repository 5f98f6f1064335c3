"""Pure functions: IMDS interruption items (text as served) -> ``Notice`` or nothing.

No I/O here, so every rule is a plain unit test. The rules (NTH's, plus the AWS docs' caveats):

- ``spot/instance-action`` ``{"action","time"}``: ``terminate``/``stop`` -> deadline = ``time``;
  ``hibernate`` -> deadline = now (hibernation starts at once, there is no lead).
- **One age rule for every source** (``is_stale``, also used by ``eventbridge.py`` for queue
  messages): a notice whose *moment* is more than ``stale_after`` seconds (default 300) in the past
  is stale and ignored. The moment is its deadline where it has one (the spot ``time``; an
  EventBridge warning's time + 120 s; a lifecycle event's time + the hook timeout; a capacity
  block warning's time + 600 s), else the time it was issued (a rebalance recommendation's
  ``noticeTime`` or event time). EC2 acts within seconds of a deadline, so a node still running
  minutes later is looking at the left-over of a failed termination (the docs say
  ``termination-time`` keeps its old value), a node resumed from hibernation, or a message that
  waited in a queue; a recommendation minutes old was acted on, or not, when it was new. A notice
  a little in the past is not stale: it is urgent.
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
import re
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
DEFAULT_MAX_LEAD = 3600.0  # AWS sends spot times ~120 s ahead; an hour leaves room for clock skew

MAX_EVENT_PROBLEMS = 10  # problem lines reported per scheduled-events answer, however many events are bad
IMDS_EVENT_TIME_LAYOUT = "%d %b %Y %H:%M:%S GMT"  # Go's "2 Jan 2006 15:04:05 GMT"


class MalformedPayload(ValueError):
    """An interruption item answered 200 with a body that is not the documented format."""


@dataclasses.dataclass(frozen=True)
class InterpretRules:
    stale_after: float = DEFAULT_STALE_AFTER  # seconds past a spot notice's time before it is stale
    asg_deadline: float = DEFAULT_ASG_DEADLINE  # seconds from seeing lifecycle Terminated to the deadline
    max_lead: float = DEFAULT_MAX_LEAD  # a spot/rebalance time further ahead than this is not a notice

    def __post_init__(self) -> None:
        if self.stale_after <= 0:
            raise ValueError(f"stale_after must be positive seconds, got {self.stale_after}")
        if self.asg_deadline < 0:
            raise ValueError(f"asg_deadline must be >= 0 seconds, got {self.asg_deadline}")
        if not self.max_lead > 0:  # NaN too: it would never refuse anything
            raise ValueError(f"max_lead must be positive seconds, got {self.max_lead}")


# -- time formats ----------------------------------------------------------------------------
# RFC 3339 section 5.6 "date-time", the only form AWS documents for the spot, rebalance and
# EventBridge times (e.g. 2017-09-18T08:22:00Z). Python's ``fromisoformat`` also takes dates without
# a time (2026-11-25), ISO week dates (2030-W01-1) and the basic format (20261123T203000); none of
# those is what AWS sends, so they are refused rather than read as a notice.
_RFC3339 = re.compile(r"\d{4}-\d{2}-\d{2}[Tt]\d{2}:\d{2}:\d{2}(\.\d{1,9})?([Zz]|[+-]\d{2}:\d{2})", re.ASCII)


def parse_rfc3339(text: str) -> float:
    """``2017-09-18T08:22:00Z`` (or with an offset / fraction) -> epoch seconds.

    Only RFC 3339 date-times with ``Z`` or an offset; a time whose UTC date falls outside the years
    1..9999 (``9999-12-31T23:59:59-23:59``) is refused as well, so every accepted time can be
    written back (``format_rfc3339``)."""
    stamp = text.strip() if isinstance(text, str) else ""
    match = _RFC3339.fullmatch(stamp)
    if match is None:
        raise MalformedPayload(f"time {_quote(text)} is not an RFC 3339 date-time (e.g. 2017-09-18T08:22:00Z)")
    fraction, zone = match.group(1) or "", match.group(2)
    try:
        value = dt.datetime.strptime(stamp[:10] + "T" + stamp[11:19], "%Y-%m-%dT%H:%M:%S")
        offset = dt.timedelta() if zone in ("Z", "z") else _offset(zone)
        epoch = value.replace(tzinfo=dt.timezone(offset)).timestamp() + float(fraction or 0)
        dt.datetime.fromtimestamp(epoch, dt.timezone.utc)  # its UTC date must exist too
    except (ValueError, OverflowError, OSError) as err:
        raise MalformedPayload(f"time {_quote(text)} is not a valid date-time ({err})") from None
    return epoch


def _offset(zone: str) -> dt.timedelta:
    hours, minutes = int(zone[1:3]), int(zone[4:6])
    if hours > 23 or minutes > 59:
        raise ValueError(f"offset {zone} is not a valid UTC offset")
    sign = -1 if zone[0] == "-" else 1
    return sign * dt.timedelta(hours=hours, minutes=minutes)


def _quote(text: object) -> str:
    return repr(text[:60] if isinstance(text, str) else text)[:80]


def format_rfc3339(epoch: float) -> str:
    return dt.datetime.fromtimestamp(epoch, dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def check_not_far_ahead(when: float, now: float, rules: InterpretRules, what: str) -> float:
    """``when``, unless it lies more than ``rules.max_lead`` ahead of ``now``.

    AWS sends these times about two minutes ahead (the spot action) or at the moment of sending
    (rebalance, EventBridge); a time a day or 8000 years ahead is not a documented value, and
    reading it as a notice would either never come due or stand for a corrupt answer."""
    if when > now + rules.max_lead:
        raise MalformedPayload(
            f"{what} {format_rfc3339(when)} is more than {rules.max_lead:g}s ahead; "
            "AWS sends it at most minutes ahead, so it is not a notice"
        )
    return when


def parse_event_time(text: str) -> float:
    """``21 Jan 2019 09:00:43 GMT`` (the scheduled-events layout) -> epoch seconds."""
    try:
        value = dt.datetime.strptime(text.strip(), IMDS_EVENT_TIME_LAYOUT)
        return value.replace(tzinfo=dt.timezone.utc).timestamp()
    except (ValueError, AttributeError, OverflowError) as err:
        raise MalformedPayload(f"event time {_quote(text)} is not in the layout '2 Jan 2006 15:04:05 GMT'") from err


def format_event_time(epoch: float) -> str:
    value = dt.datetime.fromtimestamp(epoch, dt.timezone.utc)
    return f"{value.day} {value.strftime('%b %Y %H:%M:%S')} GMT"


def _json_object(text: str, what: str) -> dict[str, Any]:
    return payload.json_object(text, what, MalformedPayload)


def _string_field(data: dict[str, Any], key: str, what: str) -> str:
    return payload.required_string(data, key, what, MalformedPayload)


# -- spot ------------------------------------------------------------------------------------
def is_stale(moment: float, now: float, stale_after: float = DEFAULT_STALE_AFTER) -> bool:
    """The one age rule (module docstring): ``moment`` (a deadline, or the issue time of a notice
    without one) is more than ``stale_after`` seconds before ``now``."""
    return moment < now - stale_after


def spot_notice(
    action: str, when: float, now: float, rules: InterpretRules, *, payload: dict[str, Any]
) -> Notice | None:
    """A spot interruption for ``action`` at ``when``; None when stale."""
    if is_stale(when, now, rules.stale_after):
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
    check_not_far_ahead(when, now, rules, "spot/instance-action time")
    return spot_notice(action, when, now, rules, payload=data)


def termination_time_notice(text: str, now: float, rules: InterpretRules = InterpretRules()) -> Notice | None:
    stamp = text.strip()
    when = check_not_far_ahead(parse_rfc3339(stamp), now, rules, "spot/termination-time")
    return spot_notice("terminate", when, now, rules, payload={"termination-time": stamp})


# -- rebalance -------------------------------------------------------------------------------
def rebalance_notice(text: str, now: float, rules: InterpretRules = InterpretRules()) -> Notice | None:
    """A rebalance recommendation; None when stale (its ``noticeTime`` is the moment: no deadline)."""
    data = _json_object(text, "events/recommendations/rebalance")
    notice_time = parse_rfc3339(_string_field(data, "noticeTime", "events/recommendations/rebalance"))
    check_not_far_ahead(notice_time, now, rules, "events/recommendations/rebalance noticeTime")
    if is_stale(notice_time, now, rules.stale_after):
        return None
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
    """Notices for active stop/reboot/retirement events, and problem lines for bad events.

    Each event is read on its own: a bad one is a problem line and the others still count. At most
    ``MAX_EVENT_PROBLEMS`` lines come back; the last one then says how many more were bad."""
    data = payload.parse_json(text, "events/maintenance/scheduled", MalformedPayload) if text.strip() else []
    if not isinstance(data, list):
        raise MalformedPayload(f"events/maintenance/scheduled is JSON {type(data).__name__}, expected an array")
    notices: list[Notice] = []
    problems: list[str] = []
    bad = 0
    for index, item in enumerate(data):
        try:
            notice = _scheduled_notice(item, now)
        except Exception as err:  # noqa: BLE001 - one bad event must not hide the others
            bad += 1
            if len(problems) < MAX_EVENT_PROBLEMS:
                problems.append(f"scheduled event #{index}: {_one_line(err)}")
            continue
        if notice is not None:
            notices.append(notice)
    if bad > len(problems):
        problems.append(f"and {bad - len(problems)} more unreadable scheduled events (of {len(data)})")
    return notices, problems


def _one_line(err: Exception) -> str:
    if isinstance(err, MalformedPayload):
        return str(err)
    return f"cannot be read ({type(err).__name__}: {' '.join(str(err).split())[:120]})"


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
