"""Fuzzers for SQS slot message bodies, pure and through a real receive on moto (job rows of the
SQLite file: ``test_sqlite_fuzz.py``).

Each body either parses into a slot message or fails as ``MalformedMessage`` with one short line;
on the receive path a poison body never fails a claim and leaves the job queue at once (to the
dead-letter queue). ``GPUCLOUD_FUZZ_EXAMPLES`` runs them longer.
"""

from __future__ import annotations

import json

import boto3
import pytest
from botocore.config import Config
from hypothesis import given
from hypothesis import strategies as st

from fuzzing import fuzz_settings
from gpucloud.queue.aws.messages import MalformedMessage, SlotMessage, parse_slot_message
from gpucloud.queue.connect import open_queue

from .aws_fixtures import message_counts

MAX_PROBLEM_CHARS = 600

VALID = {"v": 1, "job_id": "j-1", "attempt": 1, "slot": 0, "slots": 2}

# Values that have broken readers of untrusted JSON before: huge and odd numbers, deep nesting,
# control characters, lookalikes of the right type.
_odd_values = st.one_of(
    st.integers(),
    st.integers(min_value=10**20, max_value=10**40),
    st.floats(allow_nan=False),
    st.booleans(),
    st.none(),
    st.text(max_size=20),
    st.sampled_from(["j-1\n", "", " ", "j" * 300, "..", "\u2028", "1", "1e400"]),
    st.lists(st.integers(), max_size=3),
    st.dictionaries(st.text(max_size=5), st.integers(), max_size=3),
)


def _raw(value: object) -> str:
    return json.dumps(value)


def _mutated_valid() -> st.SearchStrategy[str]:
    """A valid body with one field replaced, removed, or one added."""
    replace = st.tuples(st.sampled_from(sorted(VALID)), _odd_values).map(lambda kv: _raw({**VALID, kv[0]: kv[1]}))
    remove = st.sampled_from(sorted(VALID)).map(lambda k: _raw({n: v for n, v in VALID.items() if n != k}))
    add = st.tuples(st.text(max_size=30), _odd_values).map(lambda kv: _raw({**VALID, kv[0]: kv[1]}))
    return st.one_of(replace, remove, add)


def _special_texts() -> st.SearchStrategy[str]:
    """Text JSON parsers choke on, spliced into a valid body or alone."""
    digits = st.integers(min_value=4301, max_value=6000).map(lambda n: "9" * n)
    deep = st.integers(min_value=1000, max_value=30_000).map(lambda n: "[" * n + "]" * n)
    deep_object = st.integers(min_value=1000, max_value=20_000).map(lambda n: '{"a":' * n + "1" + "}" * n)
    spliced = st.tuples(st.sampled_from(["attempt", "slot", "slots", "v", "job_id"]), st.one_of(digits, deep)).map(
        lambda kv: _raw(VALID).replace(_raw(kv[0]) + ": " + _raw(VALID[kv[0]]), _raw(kv[0]) + ": " + kv[1])
    )
    return st.one_of(digits, deep, deep_object, spliced)


bodies = st.one_of(
    st.text(max_size=200),
    st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=10), st.lists, max_leaves=20).map(_raw),
    _mutated_valid(),
    _special_texts(),
)


@fuzz_settings(200)
@given(body=bodies)
def test_fuzz_a_slot_message_body_parses_or_is_one_malformed_line(body: str) -> None:
    try:
        message = parse_slot_message(body)
    except MalformedMessage as problem:
        text = str(problem)
        assert text and "\n" not in text and len(text) < MAX_PROBLEM_CHARS
    else:
        assert isinstance(message, SlotMessage) and 0 <= message.slot < message.slots


@pytest.fixture
def aws_plane(aws_job_plane):
    return aws_job_plane


@fuzz_settings(10)
@given(body=st.one_of(_mutated_valid(), _special_texts(), st.text(min_size=1, max_size=100)))
def test_fuzz_a_received_body_never_fails_a_claim_and_never_stays_in_the_job_queue(aws_plane, body: str) -> None:
    sqs = boto3.client("sqs", config=Config(retries={"max_attempts": 1}))
    if not body.strip(" \t\r\n") or any(0xD800 <= ord(c) <= 0xDFFF for c in body):
        return  # SQS refuses to send these; no worker can receive them
    sqs.send_message(QueueUrl=aws_plane["queue_url"], MessageBody=body)
    queue = open_queue(aws_plane["uri"] + "&wait=0")  # no long poll: the body is there already
    try:
        assert queue.claim("w", lease_seconds=60) is None  # no job exists: every message is poison or stale
    finally:
        queue.close()
    assert message_counts(sqs, aws_plane["queue_url"]) == (0, 0)
