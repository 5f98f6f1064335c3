"""The AWS backend's pure parts: queue URIs, the slot message, the receiver's decision, item mapping."""

from __future__ import annotations

import json

import pytest

from gpucloud.errors import UserError
from gpucloud.lifecycle.model import Job, JobSpec, JobState
from gpucloud.queue.aws import ops as aws_ops
from gpucloud.queue.aws.items import item_to_job, job_item
from gpucloud.queue.aws.messages import (
    Action,
    Holder,
    MalformedMessage,
    SlotMessage,
    decide,
    parse_slot_message,
    send_entry,
    visibility_seconds,
)
from gpucloud.queue.aws.uri import parse_aws_uri, uri_from_env
from gpucloud.queue.connect import open_queue

QUEUE_URL = "https://sqs.us-east-1.amazonaws.com/123456789012/prod-jobs"
GOOD = f"aws://us-east-1?table=prod-jobs&queue={QUEUE_URL}"


def test_a_full_uri_parses_and_round_trips():
    address = parse_aws_uri(GOOD + "&wait=5")
    assert (address.region, address.table, address.queue_url, address.wait_seconds) == (
        "us-east-1",
        "prod-jobs",
        QUEUE_URL,
        5,
    )
    assert parse_aws_uri(address.uri) == address


@pytest.mark.parametrize(
    "uri, problem",
    [
        ("aws://", "is not an AWS region"),
        (f"aws://mars-1?table=t01&queue={QUEUE_URL}", "'mars-1' is not an AWS region"),
        (f"aws://us-east-1?queue={QUEUE_URL}", "table= is missing"),
        (f"aws://us-east-1/jobs?table=jobs&queue={QUEUE_URL}", "followed by a path '/jobs'"),
        ("aws://us-east-1?table=jobs", "queue= is missing"),
        (f"aws://us-east-1?table=a&queue={QUEUE_URL}", "is not a DynamoDB table name"),
        ("aws://us-east-1?table=jobs&queue=ftp://x/123456789012/q", "is not an SQS queue URL"),
        ("aws://us-east-1?table=jobs&queue=https://sqs.us-east-1.amazonaws.com/jobs", "is not an SQS queue URL"),
        (f"aws://us-east-1?table=jobs&queue={QUEUE_URL}&wait=30", "wait '30' is not whole seconds from 0 to 20"),
        (f"aws://us-east-1?table=jobs&queue={QUEUE_URL}&colour=red", "unknown parameter 'colour'"),
        (f"aws://us-east-1?table=jobs&table=x&queue={QUEUE_URL}", "table is given 2 times"),
    ],
)
def test_bad_uris_name_the_problem_and_the_allowed_form(uri, problem):
    with pytest.raises(UserError) as caught:
        parse_aws_uri(uri)
    message = str(caught.value)
    assert problem in message and "aws://REGION?table=TABLE&queue=QUEUE_URL" in message and "\n" not in message


def test_unknown_schemes_list_both_backends():
    with pytest.raises(UserError, match=r"allowed: sqlite:///PATH, aws://REGION\?table=TABLE&queue=QUEUE_URL"):
        open_queue("redis://localhost")


def test_the_node_environment_names_the_aws_queue():
    env = {"GPUCLOUD_REGION": "us-east-1", "GPUCLOUD_JOB_TABLE": "prod-jobs", "GPUCLOUD_JOB_QUEUE_URL": QUEUE_URL}
    assert parse_aws_uri(uri_from_env(env)).table == "prod-jobs"
    assert uri_from_env({}) is None


def test_a_half_configured_node_is_an_error_not_a_silent_local_queue():
    with pytest.raises(UserError, match="GPUCLOUD_JOB_QUEUE_URL is not set"):
        uri_from_env({"GPUCLOUD_REGION": "us-east-1", "GPUCLOUD_JOB_TABLE": "prod-jobs"})


# -- the slot message ---------------------------------------------------------------------------


def test_the_slot_message_carries_its_facts_in_body_and_attributes():
    entry = send_entry(SlotMessage(v=1, job_id="j-1", attempt=3, slot=1, slots=2), delay_seconds=5000)
    assert json.loads(entry["MessageBody"]) == {"v": 1, "job_id": "j-1", "attempt": 3, "slot": 1, "slots": 2}
    assert entry["DelaySeconds"] == 900  # clamped to the SQS maximum
    assert entry["MessageAttributes"]["gpucloud.attempt"] == {"DataType": "Number", "StringValue": "3"}
    assert parse_slot_message(entry["MessageBody"]).attempt == 3


@pytest.mark.parametrize(
    "body, problem",
    [
        ("not json", "body is not JSON"),
        ("[1, 2]", "body is a JSON list"),
        ('{"v": 2, "job_id": "j", "attempt": 1, "slot": 0, "slots": 1}', "body version 2 is not 1"),
        ('{"v": 1, "job_id": "j", "attempt": 0, "slot": 0, "slots": 1}', "attempt"),
        ('{"v": 1, "job_id": "j", "attempt": 1, "slot": 0}', "slots: Field required"),
        ('{"v": 1, "job_id": "j", "attempt": 1, "slot": 2, "slots": 2}', "slot 2 is outside the gang of 2"),
        ('{"v": 1, "job_id": "j", "attempt": 1, "slot": 0, "slots": 1, "x": 1}', "x: Extra inputs"),
    ],
)
def test_malformed_bodies_are_named(body, problem):
    with pytest.raises(MalformedMessage, match=problem):
        parse_slot_message(body)


def test_visibility_is_whole_seconds_within_the_sqs_limits():
    assert [visibility_seconds(s) for s in (0.05, 1.0, 1.2, 10**6)] == [1, 1, 2, 43_200]


def _job(state: JobState, attempt: int = 1, nodes: int = 1) -> Job:
    return Job(
        id="j-1",
        spec=JobSpec(command=["x"], nodes=nodes),
        state=state,
        attempt=attempt,
        created_at=0,
        updated_at=0,
        worker="w" if state is JobState.RUNNING else None,
    )


def _holder(lease_until: float, message_id: str | None = "m1", worker: str = "w") -> Holder:
    return Holder(worker=worker, lease_until=lease_until, message_id=message_id)


def _decide(job, holder=None, *, attempt=1, slot=0, message_id="m1", receives=1, max_receives=5, now=100.0):
    message = SlotMessage(v=1, job_id="j-1", attempt=attempt, slot=slot, slots=max(slot + 1, 1))
    return decide(
        message, job, holder, message_id=message_id, receive_count=receives, max_receives=max_receives, now=now
    )


@pytest.mark.parametrize(
    "job, holder, kwargs, action, why",
    [
        (None, None, {}, Action.DELETE, "is gone"),
        (_job(JobState.FINISHED), None, {}, Action.DELETE, "is finished"),
        (_job(JobState.FAILED), None, {}, Action.DELETE, "is failed"),
        (_job(JobState.QUEUED), None, {}, Action.CLAIM, "is free"),
        (_job(JobState.QUEUED), _holder(50.0, "m7"), {}, Action.CLAIM, "is free"),  # its holder's lease ran out
        (_job(JobState.QUEUED, attempt=2), None, {}, Action.DELETE, "superseded by attempt 2"),
        (_job(JobState.QUEUED), None, {"attempt": 2}, Action.DELETE, "does not exist"),
        (_job(JobState.QUEUED, nodes=2), None, {"slot": 2}, Action.DELETE, "has no slot 2"),
        (
            _job(JobState.QUEUED, nodes=2),
            _holder(130.0, "m1", "agent-b"),
            {"slot": 1},
            Action.PARK,
            "agent-b holds slot 1",
        ),
        (_job(JobState.QUEUED, nodes=2), _holder(130.0, "m3", "agent-b"), {"slot": 1}, Action.DELETE, "a duplicate"),
        (_job(JobState.RUNNING), _holder(50.0), {}, Action.TAKEOVER, "stopped renewing slot 0"),
        (_job(JobState.RUNNING, nodes=2), None, {"slot": 1}, Action.TAKEOVER, "its holder stopped renewing slot 1"),
        (_job(JobState.RUNNING), _holder(130.0), {}, Action.PARK, "holds"),
        (
            _job(JobState.RUNNING),
            _holder(130.0, None),
            {},
            Action.PARK,
            "holds",
        ),  # a holder without a message adopts it
        (_job(JobState.RUNNING), _holder(130.0), {"receives": 4}, Action.REPOST, "received 4 times"),
        (_job(JobState.RUNNING), _holder(130.0, "m9"), {}, Action.DELETE, "a duplicate"),
    ],
)
def test_what_a_receiver_does_with_a_message(job, holder, kwargs, action, why):
    decision = _decide(job, holder, **kwargs)
    assert decision.action is action and why in decision.reason


def test_a_parked_message_stays_hidden_for_the_rest_of_the_lease():
    assert _decide(_job(JobState.RUNNING), _holder(130.2)).hide_seconds == 31


def test_without_a_dead_letter_queue_the_holders_message_is_always_parked():
    assert _decide(_job(JobState.RUNNING), _holder(130.0), receives=50, max_receives=None).action is Action.PARK


# -- items and expressions ----------------------------------------------------------------------


def test_a_job_round_trips_through_its_item_and_leaves_absent_fields_out():
    job = Job(
        id="j-1",
        spec=JobSpec(command=["python", "t.py"], nodes=2),
        state=JobState.RUNNING,
        attempt=3,
        crashes=1,
        created_at=1763750000.123456,
        updated_at=1763750001.5,
        worker="w",
        lease_until=1763750060.25,
    )
    item = job_item(job)
    assert "reason" not in item and "exit_code" not in item
    assert item["created_key"]["S"] == "0001763750000.123456#j-1"  # fixed width: string order is time order
    assert item_to_job(item, "t") == job


def test_an_item_not_written_by_gpucloud_is_one_clear_error():
    item = job_item(_job(JobState.QUEUED))
    with pytest.raises(
        UserError, match=r"job 'j-1' in table t is unreadable \(command: List should have at least 1 item"
    ):
        item_to_job({**item, "spec": {"S": '{"command": []}'}}, "t")
    del item["attempt"]
    with pytest.raises(UserError, match="missing attempt"):
        item_to_job(item, "t")


def test_updates_name_every_attribute_and_pass_only_used_values():
    op = aws_ops.update(
        "t",
        {"pk": {"S": "x"}},
        {"state": "lost", "worker": None},
        condition="#state = :running",
        values={"running": "running", "unused": 1},
    )
    assert op["UpdateExpression"] == "SET #state = :set_state REMOVE #worker"
    assert op["ExpressionAttributeNames"] == {"#state": "state", "#worker": "worker"}
    assert set(op["ExpressionAttributeValues"]) == {":set_state", ":running"}
    with pytest.raises(KeyError, match=":k without a value"):
        aws_ops.update("t", {"pk": {"S": "x"}}, {"a": 1}, condition="#attempt = :k")
