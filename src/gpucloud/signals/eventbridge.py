"""Pure functions: one events-queue message body -> a ``Notice`` about one instance, or a skip.

What arrives on the events queue (the EventBridge event shapes EC2 and EC2 Auto Scaling document):

- EventBridge ``EC2 Spot Instance Interruption Warning`` -> ``spot-interruption``. The event's
  ``time`` is when EC2 *emitted* the warning, and unlike IMDS's ``spot/instance-action`` the event
  carries no action time. AWS documents the warning as issued two minutes before the instance is
  stopped or terminated, so deadline = ``time`` + 120 s; it is computed from the event, not from
  when we read it, so a message that waited in the queue leaves less time, never more.
  ``hibernate`` starts at once: deadline = ``time``.
- EventBridge ``EC2 Instance Rebalance Recommendation`` -> ``rebalance`` (no deadline).
- EventBridge ``EC2 Instance-terminate Lifecycle Action`` and the flat JSON that a lifecycle hook
  sends straight to SQS -> ``asg-terminate``; the token, hook and group names stay in the payload
  (``gpucloud.signals.lifecycle_action``) so the handler can complete the action after the commit. The
  instance is held in ``Terminating:Wait`` until the hook's heartbeat timeout, which the event does
  not carry: deadline = event time + ``QueueRules.lifecycle_timeout`` (the stack's hook timeout).
- EventBridge ``Capacity Block Reservation Expiration Warning`` (AWS's English page also shows it
  as ``Capacity Block Expiration Warning``; both are read) -> ``ReservationExpiring``: it names a
  capacity reservation, not an instance, so the handler finds the reservation's instances and
  makes one ``Notice`` per instance (``notice_for``). EC2 sends it 40 minutes before the block
  ends; its instances "will begin to terminate in 10 minutes": deadline = event time + 600 s.
  https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/capacity-blocks-monitor.html
  The page's example spells the envelope key ``detail_type``; EventBridge's own envelope, which
  rules match on, is ``detail-type``. Both are read.
- A body wrapped by SNS (``{"Type": "Notification", "Message": "<json>"}``) is unwrapped once.
- Skipped (to be deleted): the hook's ``autoscaling:TEST_NOTIFICATION``, launch lifecycle actions,
  and the EC2/ASG events that report rather than warn (state changes, launch/terminate results).
- Anything else raises ``UnreadableEvent`` with one line saying what is wrong -- whatever the body
  holds (JSON nested 100 000 deep, a 5000-digit number, a time in the year 10000): ``parse_message``
  raises nothing else. The consumer keeps such a message so it ends in the dead-letter queue for a
  person to read.
- Stale events are skipped, by the one age rule of every source (``interpret.is_stale``): a notice
  whose deadline (event time + the lead above) is more than ``QueueRules.stale_after`` (300 s) in
  the past, or a rebalance recommendation whose event time is, is ``Skipped`` (and deleted): a
  message that waited in a queue for an hour, or a replayed archive of last year's events, must not
  stop a job or ask for a replacement node.
- Times are RFC 3339 date-times only (what EventBridge sends, e.g. ``2026-11-24T08:22:00Z``), never
  in the year 10000 after the offset, and at most ``QueueRules.max_lead`` (an hour) ahead of now:
  the event ``time`` is when AWS sent it, so a time far ahead is not a real event.

Dedup keys (``Notice.event_id``) hash the instance id with what identifies the event (action and
time; the lifecycle action token), so a redelivered message, or the same lifecycle action arriving
both through EventBridge and directly, is acted on once, and two instances never share a key.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any, TypeVar

from gpucloud import payload
from gpucloud.aws_ids import check_hook_name, check_instance_id, check_name, check_token
from gpucloud.errors import UserError
from gpucloud.signals import lifecycle_action as lc
from gpucloud.signals.events import Notice, event_id_for
from gpucloud.signals.interpret import (
    DEFAULT_MAX_LEAD,
    DEFAULT_STALE_AFTER,
    SPOT_ACTIONS,
    InterpretRules,
    MalformedPayload,
    check_not_far_ahead,
    format_rfc3339,
    is_stale,
    parse_rfc3339,
)

SOURCE = "queue"
SPOT_WARNING_LEAD = 120.0  # seconds: AWS issues the warning two minutes before the action

SPOT_WARNING = "EC2 Spot Instance Interruption Warning"
REBALANCE = "EC2 Instance Rebalance Recommendation"
TERMINATE_ACTION = "EC2 Instance-terminate Lifecycle Action"
LAUNCH_ACTION = "EC2 Instance-launch Lifecycle Action"
TEST_NOTIFICATION = "autoscaling:TEST_NOTIFICATION"
CAPACITY_BLOCK_EXPIRING = "Capacity Block Reservation Expiration Warning"
CAPACITY_BLOCK_WARNINGS = (CAPACITY_BLOCK_EXPIRING, "Capacity Block Expiration Warning")
CAPACITY_BLOCK_ACTION = "capacity-block-expiring"  # Notice.action of the per-instance notices
CAPACITY_BLOCK_TERMINATE_AFTER = 600.0  # s: "will begin to terminate in 10 minutes"
_RESERVATION_ID = re.compile(r"cr-(?:[0-9a-f]{8}|[0-9a-f]{17})")

# detail-type -> the only source that sends it
_ACTIONABLE = {
    SPOT_WARNING: "aws.ec2",
    REBALANCE: "aws.ec2",
    TERMINATE_ACTION: "aws.autoscaling",
    **dict.fromkeys(CAPACITY_BLOCK_WARNINGS, "aws.ec2"),
}
_REPORTS = frozenset(
    {
        LAUNCH_ACTION,
        "EC2 Instance State-change Notification",
        "EC2 Instance Launch Successful",
        "EC2 Instance Launch Unsuccessful",
        "EC2 Instance Terminate Successful",
        "EC2 Instance Terminate Unsuccessful",
    }
)


class UnreadableEvent(ValueError):
    """A message body that is not one of the documented event formats; ``str()`` is one line."""


@dataclasses.dataclass(frozen=True)
class QueueRules:
    lifecycle_timeout: float = 600.0  # the termination hook's HeartbeatTimeout (the stack's drainTimeoutSeconds)
    max_lead: float = DEFAULT_MAX_LEAD  # an event time further ahead than this is not a real event
    stale_after: float = DEFAULT_STALE_AFTER  # the one age rule (interpret.is_stale)

    def __post_init__(self) -> None:
        if not self.stale_after > 0:
            raise UserError(f"stale_after {self.stale_after} must be positive seconds")
        if not 30 <= self.lifecycle_timeout <= 7200:
            raise UserError(
                f"lifecycle_timeout {self.lifecycle_timeout} is outside 30 to 7200 seconds (the hook heartbeat range)"
            )
        if not self.max_lead > 0:
            raise UserError(f"max_lead {self.max_lead} must be positive seconds")


@dataclasses.dataclass(frozen=True)
class ReservationExpiring:
    """A capacity block is about to end: every instance in ``reservation_id`` must save and leave
    by ``deadline`` (EC2 starts terminating them then)."""

    reservation_id: str
    deadline: float
    received_at: float
    event_id: str
    end_date: float | None  # the block's end (detail ``end-date``), when given
    payload: dict[str, Any]

    def notice_for(self, instance_id: str) -> Notice:
        """The stop notice of one instance in the reservation (the group is removing it, as at a
        wind-down: ``asg-terminate``, so no replacement is asked for)."""
        return Notice(
            kind="asg-terminate",
            source=SOURCE,
            deadline=self.deadline,
            received_at=self.received_at,
            event_id=event_id_for("asg-terminate", {"instance-id": instance_id, "reservation": self.event_id}),
            action=CAPACITY_BLOCK_ACTION,
            payload={**self.payload, "instance-id": instance_id},
        )


@dataclasses.dataclass(frozen=True)
class Skipped:
    """A well-formed message that asks for no action; ``reason`` says which kind it was."""

    reason: str


def parse_message(body: str, *, now: float, rules: QueueRules = QueueRules()) -> Notice | Skipped | ReservationExpiring:
    """The notice in ``body``, or a skip; ``UnreadableEvent`` (one line) and nothing else otherwise."""
    try:
        return _parse(body, now, rules)
    except UnreadableEvent:
        raise
    except Exception as err:  # noqa: BLE001 - a body must never break its consumer in another way
        detail = " ".join(str(err).split())[:200]
        raise UnreadableEvent(
            f"message body cannot be interpreted ({type(err).__name__}: {detail}): {_body_preview(body)}"
        ) from None


def _body_preview(body: object) -> str:
    return repr(body[: payload.PREVIEW_CHARS] if isinstance(body, str) else type(body).__name__)


def _parse(body: str, now: float, rules: QueueRules) -> Notice | Skipped | ReservationExpiring:
    data = _unwrap_sns(_json_object(body, "message body"))
    if "detail-type" not in data and isinstance(data.get("detail_type"), str):
        data = {**data, "detail-type": data["detail_type"]}  # the capacity-block page's spelling
    if "detail-type" in data:
        return _eventbridge(data, now, rules)
    if data.get("Event") == TEST_NOTIFICATION:
        return Skipped(f"lifecycle hook test notification for group {data.get('AutoScalingGroupName', '?')}")
    if "LifecycleTransition" in data:
        return _direct_lifecycle(data, now, rules)
    raise UnreadableEvent(
        "message is neither an EventBridge event (no 'detail-type') nor an Auto Scaling lifecycle "
        f"notification (no 'LifecycleTransition'): {_preview(data)}"
    )


def instance_of(notice: Notice) -> str:
    """The instance a notice from this module is about."""
    return str(notice.payload["instance-id"])


# -- envelopes -------------------------------------------------------------------------------
def _unwrap_sns(data: dict[str, Any]) -> dict[str, Any]:
    message = data.get("Message")
    if isinstance(message, str) and "detail-type" not in data and "LifecycleTransition" not in data:
        return _json_object(message, "SNS Message")
    return data


def _eventbridge(event: dict[str, Any], now: float, rules: QueueRules) -> Notice | Skipped | ReservationExpiring:
    detail_type = _text(event, "detail-type", "event")
    if detail_type in _REPORTS:
        return Skipped(f"{detail_type} (a report, not a warning)")
    expected_source = _ACTIONABLE.get(detail_type)
    if expected_source is None:
        raise UnreadableEvent(
            f"event detail-type {detail_type!r} is not one of {', '.join(sorted(_ACTIONABLE))} (nor a known report)"
        )
    source = _text(event, "source", "event")
    if source != expected_source:
        raise UnreadableEvent(f"event {detail_type!r} has source {source!r}; only {expected_source!r} sends it")
    detail = event.get("detail")
    if not isinstance(detail, dict):
        raise UnreadableEvent(f"event {detail_type!r} has no 'detail' object: {_preview(event)}")
    emitted = _time(event, "time", detail_type, now, rules)
    meta = {
        "detail-type": detail_type,
        "event-id": event.get("id", event.get("customer_event_id")),
        "event-time": format_rfc3339(emitted),
        "region": event.get("region"),
    }
    if detail_type in CAPACITY_BLOCK_WARNINGS:
        return _unless_stale(_capacity_block(detail, emitted, now, meta), emitted, now, rules)
    if detail_type == SPOT_WARNING:
        return _unless_stale(_spot_warning(detail, emitted, now, meta), emitted, now, rules)
    if detail_type == REBALANCE:
        return _unless_stale(_rebalance(detail, emitted, now, meta), emitted, now, rules)
    return _unless_stale(_lifecycle(detail, emitted, now, rules, meta, what=detail_type), emitted, now, rules)


_Parsed = TypeVar("_Parsed", Notice, Skipped, ReservationExpiring, Notice | Skipped)


def _unless_stale(parsed: _Parsed, emitted: float, now: float, rules: QueueRules) -> _Parsed | Skipped:
    """``parsed``, or a skip when it is stale: its deadline, or (no deadline) its event time, is more
    than ``rules.stale_after`` in the past. Checked after the body is read whole, so a stale event
    is still refused when it is malformed."""
    if isinstance(parsed, Skipped):
        return parsed
    moment = parsed.deadline if parsed.deadline is not None else emitted
    if not is_stale(moment, now, rules.stale_after):
        return parsed
    kind = parsed.kind if isinstance(parsed, Notice) else "capacity-block-expiring"
    return Skipped(
        f"stale {kind} event of {format_rfc3339(emitted)}: its "
        f"{'deadline' if parsed.deadline is not None else 'time'} passed {now - moment:.0f}s ago "
        f"(more than {rules.stale_after:g}s)"
    )


def _direct_lifecycle(data: dict[str, Any], now: float, rules: QueueRules) -> Notice | Skipped:
    what = "lifecycle notification"
    emitted = _time(data, "Time", what, now, rules)
    meta = {
        "detail-type": "Auto Scaling lifecycle notification",
        "event-id": data.get("RequestId"),
        "event-time": format_rfc3339(emitted),
    }
    return _unless_stale(_lifecycle(data, emitted, now, rules, meta, what=what), emitted, now, rules)


# -- event kinds -----------------------------------------------------------------------------
def _spot_warning(detail: dict[str, Any], emitted: float, now: float, meta: dict[str, Any]) -> Notice:
    instance = _instance(detail, "instance-id", SPOT_WARNING)
    action = _text(detail, "instance-action", SPOT_WARNING)
    if action not in SPOT_ACTIONS:
        raise UnreadableEvent(f"{SPOT_WARNING} instance-action {action!r} is not one of {', '.join(SPOT_ACTIONS)}")
    deadline = emitted if action == "hibernate" else emitted + SPOT_WARNING_LEAD
    key = {"instance-id": instance, "action": action, "time": meta["event-time"]}
    return Notice(
        kind="spot-interruption",
        source=SOURCE,
        deadline=deadline,
        received_at=now,
        event_id=event_id_for("spot-interruption", key),
        action=action,
        payload={**meta, "instance-id": instance, "instance-action": action},
    )


def _rebalance(detail: dict[str, Any], emitted: float, now: float, meta: dict[str, Any]) -> Notice:
    instance = _instance(detail, "instance-id", REBALANCE)
    key = {"instance-id": instance, "noticeTime": meta["event-time"]}
    return Notice(
        kind="rebalance",
        source=SOURCE,
        deadline=None,
        received_at=now,
        event_id=event_id_for("rebalance", key),
        action="rebalance",
        payload={**meta, "instance-id": instance},
    )


def _capacity_block(detail: dict[str, Any], emitted: float, now: float, meta: dict[str, Any]) -> ReservationExpiring:
    what = meta["detail-type"]
    reservation = _text(detail, "capacity-reservation-id", what)
    if not _RESERVATION_ID.fullmatch(reservation):
        raise UnreadableEvent(f"{what} capacity-reservation-id {reservation[:80]!r} is not a cr-... id")
    end: float | None = None
    if "end-date" in detail:
        try:
            end = parse_rfc3339(_text(detail, "end-date", what))
        except MalformedPayload as err:
            raise UnreadableEvent(f"{what} end-date: {err}") from None
    # Termination starts 10 minutes after the warning, and 30 minutes before the end at the latest.
    deadline = emitted + CAPACITY_BLOCK_TERMINATE_AFTER
    if end is not None:
        deadline = min(deadline, end - 1800.0)
    key = {"capacity-reservation-id": reservation, "time": meta["event-time"]}
    return ReservationExpiring(
        reservation_id=reservation,
        deadline=deadline,
        received_at=now,
        event_id=event_id_for("capacity-block-expiring", key),
        end_date=end,
        payload={**meta, "capacity-reservation-id": reservation, "end-date": detail.get("end-date")},
    )


def _lifecycle(
    detail: dict[str, Any], emitted: float, now: float, rules: QueueRules, meta: dict[str, Any], *, what: str
) -> Notice | Skipped:
    transition = _text(detail, lc.TRANSITION, what)
    if transition == lc.LAUNCHING:
        return Skipped(f"launch lifecycle action for {detail.get(lc.INSTANCE, '?')} (gpucloud holds only terminations)")
    if transition != lc.TERMINATING:
        raise UnreadableEvent(f"{what} LifecycleTransition {transition!r} is not {lc.TERMINATING} or {lc.LAUNCHING}")
    instance = _instance(detail, lc.INSTANCE, what)
    try:
        token = check_token(_text(detail, lc.TOKEN, what))
        group = check_name(_text(detail, lc.GROUP, what), "AutoScalingGroupName")
        hook = check_hook_name(_text(detail, lc.HOOK, what))
    except UserError as err:
        raise UnreadableEvent(f"{what}: {err}") from None
    action = lc.LifecycleAction(asg_name=group, hook_name=hook, instance_id=instance, token=token)
    return Notice(
        kind="asg-terminate",
        source=SOURCE,
        deadline=emitted + rules.lifecycle_timeout,
        received_at=now,
        event_id=event_id_for("asg-terminate", {"instance-id": instance, "token": token}),
        action="Terminated",
        payload={
            **meta,
            "instance-id": instance,
            **action.to_payload(),
            "assumed_deadline_seconds": rules.lifecycle_timeout,
        },
    )


# -- fields ----------------------------------------------------------------------------------
def _json_object(text: str, what: str) -> dict[str, Any]:
    return payload.json_object(text, what, UnreadableEvent)


def _text(data: dict[str, Any], key: str, what: str) -> str:
    return payload.required_string(data, key, what, UnreadableEvent)


def _instance(data: dict[str, Any], key: str, what: str) -> str:
    try:
        return check_instance_id(_text(data, key, what), f"{what} {key}")
    except UserError as err:
        raise UnreadableEvent(str(err)) from None


def _time(data: dict[str, Any], key: str, what: str, now: float, rules: QueueRules) -> float:
    try:
        when = parse_rfc3339(_text(data, key, what))
        return check_not_far_ahead(when, now, InterpretRules(max_lead=rules.max_lead), "time")
    except MalformedPayload as err:
        raise UnreadableEvent(f"{what} {key}: {err}") from None


_preview = payload.preview
