"""EventBridge's capacity block expiration warning, read from the payload AWS documents
(https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/capacity-blocks-monitor.html): the page's
example, placeholders filled in, with its ``detail_type`` spelling, and the same event in the
``detail-type`` envelope EventBridge delivers; under both names the page gives the event."""

from __future__ import annotations

import json

import pytest

from gpucloud.signals.eventbridge import (
    CAPACITY_BLOCK_ACTION,
    ReservationExpiring,
    UnreadableEvent,
    parse_message,
)
from gpucloud.signals.interpret import parse_rfc3339

RESERVATION = "cr-0123456789abcdef0"
SENT = "2026-11-24T09:20:00Z"
END = "2026-11-24T10:00:00Z"  # the warning comes 40 minutes before the end
NOW = parse_rfc3339(SENT) + 3


def documented(detail_type: str = "Capacity Block Reservation Expiration Warning") -> dict:
    """The page's example, as printed (``customer_event_id``, ``detail_type``)."""
    return {
        "customer_event_id": f"{RESERVATION}-approaching-expiry",
        "detail_type": detail_type,
        "source": "aws.ec2",
        "account": "123456789012",
        "time": SENT,
        "resources": [f"arn:aws:ec2:us-east-1:123456789012:capacity-reservation/{RESERVATION}"],
        "detail": {"capacity-reservation-id": RESERVATION, "end-date": END},
    }


def delivered(detail_type: str = "Capacity Block Reservation Expiration Warning") -> dict:
    """The same event in the envelope EventBridge delivers to a rule's target."""
    event = documented(detail_type)
    del event["customer_event_id"], event["detail_type"]
    return {"version": "0", "id": "7bf73129-1428-4cd3-a780-95db273d1602", "detail-type": detail_type, **event}


@pytest.mark.parametrize("shape", [documented, delivered])
@pytest.mark.parametrize("name", ["Capacity Block Reservation Expiration Warning", "Capacity Block Expiration Warning"])
def test_the_documented_expiration_warning_names_the_reservation_and_a_ten_minute_deadline(shape, name):
    parsed = parse_message(json.dumps(shape(name)), now=NOW)
    assert isinstance(parsed, ReservationExpiring)
    assert parsed.reservation_id == RESERVATION
    assert parsed.deadline == parse_rfc3339(SENT) + 600  # "will begin to terminate in 10 minutes"
    assert parsed.end_date == parse_rfc3339(END)
    notice = parsed.notice_for("i-0123456789abcdef0")
    assert (notice.kind, notice.action, notice.is_stop) == ("asg-terminate", CAPACITY_BLOCK_ACTION, True)
    assert notice.payload["instance-id"] == "i-0123456789abcdef0" and notice.deadline == parsed.deadline
    assert notice.event_id != parsed.notice_for("i-0fedcba0987654321").event_id


def test_a_redelivered_warning_keeps_its_keys():
    first = parse_message(json.dumps(delivered()), now=NOW)
    again = parse_message(json.dumps(delivered()), now=NOW + 30)
    assert isinstance(first, ReservationExpiring) and isinstance(again, ReservationExpiring)
    assert first.event_id == again.event_id and first.deadline == again.deadline


@pytest.mark.parametrize(
    "detail, message",
    [
        ({"end-date": END}, "capacity-reservation-id"),
        ({"capacity-reservation-id": "[ODCR ID]", "end-date": END}, "is not a cr-... id"),
        ({"capacity-reservation-id": RESERVATION, "end-date": "tomorrow"}, "end-date"),
    ],
)
def test_a_bad_expiration_warning_is_unreadable_with_one_line(detail, message):
    body = {**delivered(), "detail": detail}
    with pytest.raises(UnreadableEvent, match=message) as err:
        parse_message(json.dumps(body), now=NOW)
    assert "\n" not in str(err.value)
