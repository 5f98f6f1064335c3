"""A hostile metadata service: one bad item never blinds the poller.

Every test goes through a real HTTP server (``AdversarialImds``) that serves exact bytes, so what
is tested is the client, the poller and the interpreters together, as on a node.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import threading
import time

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fuzzing import fuzz_settings
from gpucloud.signals import interpret
from gpucloud.signals.imds import ImdsClient, ImdsUnavailable
from gpucloud.signals.interpret import InterpretRules, MalformedPayload
from gpucloud.signals.poller import ImdsPoller
from helpers.waiting import wait_for

from .adversarial_imds import AdversarialImds

DEEP = "[" * 100_000 + "]" * 100_000
DEEP_OBJECT = '{"a":' * 5_000 + "1" + "}" * 5_000
BIG_INT = "1" * 5_000
YEAR_10000 = "9999-12-31T23:59:59-23:59"  # a valid RFC 3339 string whose UTC date is in the year 10000


def stamp(epoch: float) -> str:
    return dt.datetime.fromtimestamp(epoch, dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def imds_time(epoch: float) -> str:
    return interpret.format_event_time(epoch)


@pytest.fixture
def server():
    with AdversarialImds() as srv:
        yield srv


def new_poller(srv: AdversarialImds, **kwargs) -> tuple[ImdsPoller, list]:
    seen: list = []
    client = ImdsClient(srv.endpoint, connect_timeout=1.0, read_timeout=1.0)
    return ImdsPoller(client, on_notice=seen.append, **kwargs), seen


def kinds(notices) -> list[str]:
    return sorted(n.kind for n in notices)


# -- each item is read and interpreted on its own --------------------------------------------
BAD_ANSWERS = {
    "instance-action year 10000": (interpret.INSTANCE_ACTION, json.dumps({"action": "terminate", "time": YEAR_10000})),
    "termination-time year 10000": (interpret.TERMINATION_TIME, YEAR_10000),
    "rebalance year 10000": (interpret.REBALANCE, json.dumps({"noticeTime": YEAR_10000})),
    "rebalance year 0": (interpret.REBALANCE, json.dumps({"noticeTime": "0001-01-01T00:00:00+01:00"})),
    "instance-action deep JSON": (interpret.INSTANCE_ACTION, DEEP),
    "instance-action deep object": (interpret.INSTANCE_ACTION, DEEP_OBJECT),
    "instance-action 5000-digit time": (interpret.INSTANCE_ACTION, '{"action":"terminate","time":' + BIG_INT + "}"),
    "rebalance 5000-digit integer": (interpret.REBALANCE, BIG_INT),
    "scheduled deep JSON": (interpret.SCHEDULED_EVENTS, DEEP),
    "scheduled 5000-digit integer": (interpret.SCHEDULED_EVENTS, "[" + BIG_INT + "]"),
    "scheduled deep event": (interpret.SCHEDULED_EVENTS, "[" + DEEP_OBJECT + "]"),
    "scheduled not UTF-8": (interpret.SCHEDULED_EVENTS, b"\xff\xfe[{"),
}


@pytest.mark.parametrize("case", sorted(BAD_ANSWERS))
def test_a_bad_item_costs_that_item_only(server, case, caplog):
    path, body = BAD_ANSWERS[case]
    server.serve(path, body)
    server.serve(interpret.TARGET_LIFECYCLE_STATE, "Terminated")  # read after every spot item
    poller, seen = new_poller(server)
    with caplog.at_level(logging.WARNING, logger="gpucloud.signals"):
        fresh = poller.poll_once()
    assert kinds(fresh) == ["asg-terminate"] and kinds(seen) == ["asg-terminate"]
    assert poller.health.malformed == 1
    problems = [r.getMessage() for r in caplog.records if not r.getMessage().startswith("interruption notice")]
    assert len(problems) == 1 and "no notice assumed" in problems[0], problems
    assert "\n" not in problems[0] and len(problems[0]) < 1200


def test_a_bad_lifecycle_state_does_not_hide_the_spot_notice(server):
    server.serve(interpret.INSTANCE_ACTION, json.dumps({"action": "stop", "time": stamp(time.time() + 100)}))
    server.serve(interpret.TARGET_LIFECYCLE_STATE, DEEP)
    server.serve(interpret.SCHEDULED_EVENTS, "[" + BIG_INT + "]")
    poller, _ = new_poller(server)
    assert kinds(poller.poll_once()) == ["spot-interruption"]


def test_a_notice_arriving_while_a_bad_item_is_served_is_seen_within_one_interval(server):
    """The poller thread runs rounds while instance-action answers a time in the year 10000; the
    lifecycle notice is then reported by the round in flight or the next one, never later."""
    server.serve(interpret.INSTANCE_ACTION, json.dumps({"action": "terminate", "time": YEAR_10000}))
    reported_after_rounds: list[int] = []
    arrived = threading.Event()
    poller = ImdsPoller(ImdsClient(server.endpoint), interval=0.05, on_notice=lambda n: arrived.set())

    def on_notice(notice) -> None:
        reported_after_rounds.append(poller.health.rounds)
        arrived.set()

    poller.on_notice = on_notice
    poller.start()
    try:
        wait_for(lambda: poller.health.rounds >= 2, timeout=5, what="two rounds over the bad item")
        rounds_done = poller.health.rounds
        server.serve(interpret.TARGET_LIFECYCLE_STATE, "Terminated")
        assert arrived.wait(10), "the lifecycle notice was never reported"
    finally:
        poller.stop()
    # Reported during round rounds_done + 1 (in flight) or rounds_done + 2 (the next one).
    assert reported_after_rounds == [pytest.approx(rounds_done, abs=1)] and reported_after_rounds[0] <= rounds_done + 1


# -- a token that cannot go back in a header -------------------------------------------------
@pytest.mark.parametrize("token", [b"abc\ndef", b"abc\r\ndef", "t\u00f6k\u20acn".encode(), b"a" * 5000, b"   "])
def test_a_token_that_cannot_be_a_header_is_refused_cleanly(server, token, caplog):
    server.token.body = token
    server.serve("/latest/meta-data/instance-type", "p5.48xlarge")
    server.serve(interpret.TARGET_LIFECYCLE_STATE, "Terminated")
    client = ImdsClient(server.endpoint, connect_timeout=1.0, read_timeout=1.0)
    with caplog.at_level(logging.WARNING, logger="gpucloud.signals"):
        response = client.get("/latest/meta-data/instance-type")  # tokenless: this server allows IMDSv1
        assert response.ok and response.text == "p5.48xlarge"
        assert client.tokens_fetched == 0 and client.token_problem is not None
        poller = ImdsPoller(client, on_notice=lambda n: None)
        assert kinds(poller.poll_once()) == ["asg-terminate"]
    token_lines = [r.getMessage() for r in caplog.records if "token" in r.getMessage()]
    assert len(token_lines) == 1  # rate-limited: one line, not one per request


# -- total time per request -------------------------------------------------------------------
def test_a_dripping_answer_is_cut_at_the_total_time(server):
    """Each byte comes within the read timeout, so only a total limit ends the request."""
    body = json.dumps({"action": "terminate", "time": stamp(time.time() + 100)})[:20]
    server.serve(interpret.INSTANCE_ACTION, body, drip_seconds=0.3)
    client = ImdsClient(server.endpoint, connect_timeout=1.0, read_timeout=1.0, total_timeout=1.5)
    with pytest.raises(ImdsUnavailable) as err:
        client.get(interpret.INSTANCE_ACTION)
    assert err.value.reason == "read-timeout" and "1.5s (the whole request)" in str(err.value)


def test_a_dripping_item_does_not_end_the_round(server):
    server.serve(interpret.INSTANCE_ACTION, b"{" * 50, drip_seconds=0.3)
    server.serve(interpret.TARGET_LIFECYCLE_STATE, "Terminated")
    client = ImdsClient(server.endpoint, connect_timeout=1.0, read_timeout=1.0, total_timeout=1.0)
    poller = ImdsPoller(client, on_notice=lambda n: None)
    assert kinds(poller.poll_once()) == ["asg-terminate"]
    assert poller.health.failed_requests >= 1


def test_an_oversized_answer_is_refused_not_buffered(server):
    server.serve(interpret.SCHEDULED_EVENTS, b"[" + b" " * (2 * 1024 * 1024) + b"]")
    client = ImdsClient(server.endpoint, connect_timeout=1.0, read_timeout=2.0, total_timeout=10.0)
    with pytest.raises(ImdsUnavailable) as err:
        client.get(interpret.SCHEDULED_EVENTS)
    assert err.value.reason == "too-large"


# -- only the documented time formats -----------------------------------------------------------
NOT_RFC3339 = ["2026-11-25", "2030-W01-1", "20261123T203000", "2026-11-24 20:30:00Z", "2026-11-24T20:30:00"]


@pytest.mark.parametrize("text", NOT_RFC3339 + ["\uff12\uff10\uff12\uff16-11-24T20:30:00Z", "2026-02-30T00:00:00Z"])
def test_instance_action_time_must_be_rfc3339(text):
    # ``now`` is just before the time Python's fromisoformat would read, so it is neither stale nor far ahead.
    now = dt.datetime(2026, 11, 24, 20, 0, tzinfo=dt.timezone.utc).timestamp()
    body = json.dumps({"action": "terminate", "time": text})
    with pytest.raises(MalformedPayload, match="RFC 3339|not a valid date-time"):
        interpret.instance_action_notice(body, now)


def test_termination_time_must_be_rfc3339():
    now = dt.datetime(2026, 11, 23, 23, 59, tzinfo=dt.timezone.utc).timestamp()
    with pytest.raises(MalformedPayload, match="RFC 3339"):
        interpret.termination_time_notice("2026-11-24", now)


def test_rfc3339_forms_aws_sends_are_read():
    assert interpret.parse_rfc3339("2017-09-18T08:22:00Z") == 1505722920.0
    assert interpret.parse_rfc3339("2017-09-18T09:22:00.500+01:00") == 1505722920.5
    assert interpret.parse_rfc3339("2017-09-18t08:22:00z") == 1505722920.0


def test_bad_time_formats_make_no_notice_through_the_poller(server):
    server.serve(interpret.INSTANCE_ACTION, json.dumps({"action": "terminate", "time": "2030-W01-1"}))
    server.serve(interpret.TERMINATION_TIME, dt.date.today().isoformat())
    server.serve(interpret.REBALANCE, json.dumps({"noticeTime": dt.date.today().isoformat()}))
    poller, seen = new_poller(server)
    assert poller.poll_once() == [] and seen == []
    assert poller.health.malformed == 3


def test_decision_an_instance_action_in_the_year_9999_is_not_a_notice():
    """AWS sends the action time about two minutes ahead; a time more than ``max_lead`` (an hour)
    ahead is not a documented notice, so it is counted and logged as malformed, never acted on
    (nor left to wait 8000 years)."""
    now = time.time()
    body = json.dumps({"action": "terminate", "time": "9999-12-31T23:59:59Z"})
    with pytest.raises(MalformedPayload, match="more than 3600s ahead"):
        interpret.instance_action_notice(body, now)
    with pytest.raises(MalformedPayload, match="more than 3600s ahead"):
        interpret.termination_time_notice("9999-12-31T23:59:59Z", now)
    ahead = json.dumps({"action": "terminate", "time": stamp(now + 1800)})
    assert interpret.instance_action_notice(ahead, now).deadline == pytest.approx(now + 1800, abs=1)
    with pytest.raises(MalformedPayload):
        interpret.instance_action_notice(ahead, now, InterpretRules(max_lead=600))


def test_decision_an_active_event_that_began_ten_years_ago_is_an_overdue_notice():
    """An ``active`` stop/retirement event stays active until EC2 acts or cancels it; its NotBefore
    having passed long ago makes it overdue, not void. With no NotAfter the window is open, so it
    is a notice whose deadline (NotBefore) has passed: the job moves off at once."""
    now = time.time()
    ten_years_ago = now - 10 * 365 * 86400
    event = {
        "Code": "instance-retirement",
        "State": "active",
        "EventId": "instance-event-1",
        "NotBefore": imds_time(ten_years_ago),
    }
    notices, problems = interpret.scheduled_notices(json.dumps([event]), now)
    assert problems == [] and len(notices) == 1
    assert notices[0].is_stop and notices[0].deadline == pytest.approx(ten_years_ago, abs=1)
    assert notices[0].seconds_left(now) < 0


# -- repeated problems are rate-limited -----------------------------------------------------------
def test_a_failing_token_endpoint_logs_one_line_not_one_per_request(server, caplog):
    server.token.status = 503
    server.serve(interpret.TARGET_LIFECYCLE_STATE, "InService")
    poller, _ = new_poller(server)
    with caplog.at_level(logging.WARNING, logger="gpucloud.signals"):
        for _ in range(5):
            poller.poll_once()
    assert sum(r.requests.count("PUT /latest/api/token") for r in [server]) >= 25
    token_lines = [r for r in caplog.records if "token" in r.getMessage()]
    assert len(token_lines) == 1, [r.getMessage() for r in token_lines]


def test_thousands_of_bad_scheduled_events_log_one_line(server, caplog):
    now = time.time()
    good = {"Code": "instance-stop", "State": "active", "EventId": "e-good", "NotBefore": imds_time(now + 3600)}
    bad = [{"Code": "instance-stop", "State": "active", "NotBefore": "not a date"}] * 5000
    server.serve(interpret.SCHEDULED_EVENTS, json.dumps(bad + [good]))
    poller, _ = new_poller(server)
    with caplog.at_level(logging.WARNING, logger="gpucloud.signals"):
        notices = poller.poll_once()
        poller.poll_once()
    assert kinds(notices) == ["scheduled-maintenance"]  # the good event still counts
    lines = [r.getMessage() for r in caplog.records if not r.getMessage().startswith("interruption notice")]
    assert len(lines) == 1 and "and 4990 more unreadable scheduled events (of 5001)" in lines[0]


def test_scheduled_problems_are_capped_per_answer():
    bad = [{"Code": "instance-stop", "State": "active", "NotBefore": "x"}] * 200
    notices, problems = interpret.scheduled_notices(json.dumps(bad), time.time())
    assert notices == [] and len(problems) == interpret.MAX_EVENT_PROBLEMS + 1


# -- the fuzzer: hostile answers through a real HTTP server ---------------------------------------
ITEMS = [
    interpret.INSTANCE_ACTION,
    interpret.TERMINATION_TIME,
    interpret.REBALANCE,
    interpret.TARGET_LIFECYCLE_STATE,
    interpret.SCHEDULED_EVENTS,
]
HOSTILE_TIMES = [
    YEAR_10000,
    "0001-01-01T00:00:00+01:00",
    "9999-12-31T23:59:59Z",
    "2026-11-25",
    "2030-W01-1",
    "20261123T203000",
]
RAW = [DEEP, DEEP_OBJECT, BIG_INT, "[" + BIG_INT + "]", "", "Terminated\r\n", "null", "{}", "[]", "1e999999"]


def any_time(now: float):
    return st.one_of(
        st.sampled_from(HOSTILE_TIMES),
        st.floats(-1e4, 1e4).map(lambda delta: stamp(now + delta)),
        st.datetimes().map(lambda moment: moment.isoformat()),
    )


def hostile_answer(now: float):
    json_value = st.recursive(
        st.none() | st.booleans() | st.integers() | st.text(max_size=20) | any_time(now),
        lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=10), inner, max_size=3),
        max_leaves=6,
    )
    spot = st.fixed_dictionaries(
        {"action": st.sampled_from(["terminate", "stop", "hibernate", "explode"]), "time": any_time(now)}
    )
    event = st.fixed_dictionaries(
        {
            "Code": st.sampled_from(interpret.EVENT_CODES + ("bogus",)),
            "State": st.sampled_from(interpret.EVENT_STATES),
            "NotBefore": st.one_of(st.floats(-1e9, 1e9).map(lambda d: imds_time(now + d)), st.text(max_size=20)),
        }
    )
    body = st.one_of(
        st.sampled_from(RAW),
        any_time(now),
        st.sampled_from(interpret.LIFECYCLE_STATES),
        json_value.map(json.dumps),
        spot.map(json.dumps),
        st.fixed_dictionaries({"noticeTime": any_time(now)}).map(json.dumps),
        st.lists(st.one_of(event, json_value), max_size=4).map(json.dumps),
        st.binary(max_size=40),
    )
    return st.one_of(st.just(None), st.sampled_from([500, 401, 403]), body)


HOSTILE_ANSWER = hostile_answer(time.time())  # built once: building the strategy is the slow part


def witness_answer(path: str, now: float) -> tuple[str, str]:
    """A genuine notice on ``path``, and the kind it must make."""
    if path == interpret.REBALANCE:
        return json.dumps({"noticeTime": stamp(now)}), "rebalance"
    if path == interpret.INSTANCE_ACTION:
        return json.dumps({"action": "terminate", "time": stamp(now + 110)}), "spot-interruption"
    return "Terminated", "asg-terminate"


@fuzz_settings(80)
@given(data=st.data())
def test_fuzz_imds_answers_never_hide_a_genuine_notice(server, data):
    now = time.time()
    witness = data.draw(
        st.sampled_from([interpret.TARGET_LIFECYCLE_STATE, interpret.REBALANCE, interpret.INSTANCE_ACTION])
    )
    server.answers.clear()
    for path in ITEMS:
        if path == witness:
            continue
        answer = data.draw(HOSTILE_ANSWER, label=path)
        if isinstance(answer, int):
            server.serve(path, b"error", status=answer)
        elif answer is not None:
            server.serve(path, answer)
    body, kind = witness_answer(witness, now)
    server.serve(witness, body)
    server.token.body = data.draw(st.one_of(st.just(b"good-token"), st.binary(max_size=30)), label="token")
    poller, seen = new_poller(server)
    fresh = poller.poll_once()
    assert kind in kinds(fresh) and kinds(fresh) == kinds(seen)
    for notice in fresh:
        if notice.deadline is not None:
            assert notice.deadline <= now + 3600 + interpret.DEFAULT_ASG_DEADLINE + 60


@pytest.mark.parametrize("token", [b"abc\ndef", b"abc\r\ndef", "t\u00f6k\u20acn".encode()])
def test_doctor_probe_reports_a_bad_token_instead_of_crashing(server, token):
    """``gpucloud doctor`` reads IMDS through this client; a token with a line break or a
    character outside Latin-1 raised ValueError from http.client there."""
    from gpucloud.doctor.collect import probe_imds

    server.token.body = token
    server.serve("/latest/meta-data/instance-type", "p5.48xlarge")
    result = probe_imds(server.endpoint, timeout_s=2.0)
    assert result["token_ok"] is False and result["instance_type"] == "p5.48xlarge"


def test_a_hung_service_costs_a_round_one_timeout_after_the_first(server):
    """Per-item timeouts let a round go on past one hanging item; when every item hangs, the next
    rounds end at their first timeout instead of paying one per item, until anything answers."""
    for path in ITEMS:
        server.serve(path, b"x" * 50, drip_seconds=0.2)
    client = ImdsClient(server.endpoint, connect_timeout=1.0, read_timeout=1.0, total_timeout=0.3)
    poller = ImdsPoller(client, on_notice=lambda n: None)
    poller.poll_once()
    first = poller.health.requests
    assert first >= 4  # every item was tried: one hanging item must not hide the others
    poller.poll_once()
    assert poller.health.requests == first + 1
    server.answers.clear()
    server.serve(interpret.TARGET_LIFECYCLE_STATE, "Terminated")
    assert kinds(poller.poll_once()) == ["asg-terminate"]  # the service answers again: a full round


def test_max_lead_must_be_a_positive_number():
    for bad in (0.0, -1.0, float("nan")):
        with pytest.raises(ValueError, match="max_lead"):
            InterpretRules(max_lead=bad)
