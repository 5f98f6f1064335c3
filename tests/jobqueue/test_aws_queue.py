"""What only the AWS backend has: slot messages in SQS (visibility, dead-letter queue, stale and
duplicate messages), the table as the truth behind them, AWS errors as one line, and the CLI on it.

Runs against moto in server mode with the stack's queue, dead-letter queue and table settings.
"""

from __future__ import annotations

import json
import logging

import boto3
import pytest
from botocore.config import Config

from cli_run import run_cli as run
from gpucloud.errors import UserError
from gpucloud.lifecycle.model import AttemptEnd, AttemptState, JobSpec, JobState
from gpucloud.queue.aws.backend import AwsQueue
from gpucloud.queue.aws.items import key
from gpucloud.queue.aws.uri import parse_aws_uri
from gpucloud.queue.connect import default_queue_uri, open_queue

from .aws_fixtures import message_counts as _counts
from .aws_fixtures import visible_messages as _visible
from .conftest import wait_for

SPEC = JobSpec(command=["python", "train.py"], gpus_per_node=8)


@pytest.fixture
def plane(aws_job_plane):
    return aws_job_plane


@pytest.fixture
def q(plane):
    queue = open_queue(plane["uri"])
    yield queue
    queue.close()


@pytest.fixture
def sqs(plane):
    return boto3.client("sqs", config=Config(retries={"max_attempts": 1}))


def _held(plane, job_id: str) -> dict:
    item = boto3.client("dynamodb").get_item(TableName=plane["table"], Key=key(job_id, "meta"), ConsistentRead=True)[
        "Item"
    ]
    return {name: item[name]["S"] for name in ("message_id", "receipt") if name in item}


def test_submit_sends_one_slot_message_that_names_the_attempt(q, plane, sqs):
    job = q.submit(SPEC)
    [message] = _visible(sqs, plane["queue_url"])
    assert json.loads(message["Body"]) == {"v": 1, "job_id": job.id, "attempt": 1, "slot": 0, "slots": 1}
    assert q.max_receives == 5  # read from the stack's redrive policy


def test_the_claimer_holds_the_message_and_heartbeats_keep_it_hidden(q, plane, sqs):
    job = q.submit(SPEC)
    assert q.claim("w1", lease_seconds=1).id == job.id
    assert _held(plane, job.id)["receipt"]
    assert q.heartbeat(job.id, 1, "w1", lease_seconds=60)
    # Without the heartbeat the message would be back after 1 s; a 3 s long poll sees nothing.
    assert _visible(sqs, plane["queue_url"], wait=3) == []
    assert _counts(sqs, plane["queue_url"]) == (0, 1)


def test_without_heartbeats_the_message_returns_when_the_lease_runs_out(q, plane, sqs):
    job = q.submit(SPEC)
    q.claim("dead", lease_seconds=1)
    [message] = _visible(sqs, plane["queue_url"], wait=5)
    assert json.loads(message["Body"])["job_id"] == job.id


def test_a_takeover_through_the_returning_message_holds_it_for_the_next_attempt(q, plane, sqs):
    job = q.submit(SPEC)
    q.claim("dead", lease_seconds=1)
    first = _held(plane, job.id)["message_id"]
    taken = wait_for(lambda: q.claim("alive", lease_seconds=60), what="takeover")
    assert (taken.attempt, taken.worker) == (2, "alive")
    assert _held(plane, job.id)["message_id"] == first  # the same message, now kept by the new holder


def test_ending_an_attempt_deletes_its_message_and_a_requeue_sends_the_next_one(q, plane, sqs):
    job = q.submit(SPEC)
    q.claim("w", lease_seconds=60)
    q.end_attempt(job.id, 1, AttemptEnd(state=AttemptState.REQUEUED, exit_code=75, committed_step=4, reason="notice"))
    [message] = _visible(sqs, plane["queue_url"])
    assert json.loads(message["Body"])["attempt"] == 2
    assert _counts(sqs, plane["queue_url"]) == (0, 1)  # attempt 1's message is gone, only the one just received
    assert _held(plane, job.id) == {}


def test_a_finished_job_leaves_no_message(q, plane, sqs):
    job = q.submit(SPEC)
    q.claim("w", lease_seconds=60)
    q.end_attempt(job.id, 1, AttemptEnd(state=AttemptState.FINISHED, exit_code=0, last_step=9))
    assert _counts(sqs, plane["queue_url"]) == (0, 0)


def test_messages_for_ended_gone_or_superseded_jobs_are_deleted_not_dead_lettered(q, plane, sqs):
    ended = q.submit(SPEC)
    q.claim("w", lease_seconds=60, job_id=ended.id)  # direct claim: attempt 1's message stays queued
    q.end_attempt(ended.id, 1, AttemptEnd(state=AttemptState.FINISHED, exit_code=0))
    stale = {"v": 1, "job_id": "never-submitted", "attempt": 1, "slot": 0, "slots": 1}
    sqs.send_message(QueueUrl=plane["queue_url"], MessageBody=json.dumps(stale))
    assert q.claim("w", lease_seconds=60) is None
    assert _counts(sqs, plane["queue_url"]) == (0, 0)
    assert _counts(sqs, plane["dlq_url"]) == (0, 0)


def test_a_holder_without_a_message_adopts_it_and_a_second_copy_is_a_duplicate(q, plane, sqs):
    job = q.submit(SPEC)
    q.claim("w1", lease_seconds=60, job_id=job.id)  # claimed from the table: attempt 1's message stays in the queue
    [original] = _visible(sqs, plane["queue_url"])
    sqs.change_message_visibility(
        QueueUrl=plane["queue_url"], ReceiptHandle=original["ReceiptHandle"], VisibilityTimeout=0
    )
    assert q.claim("w2", lease_seconds=60) is None
    assert _held(plane, job.id)["message_id"] == original["MessageId"]  # now w1's wake-up if it dies
    assert _counts(sqs, plane["queue_url"]) == (0, 1)
    sqs.send_message(QueueUrl=plane["queue_url"], MessageBody=original["Body"])  # SQS delivers at least once
    assert q.claim("w2", lease_seconds=60) is None
    assert _counts(sqs, plane["queue_url"]) == (0, 1)  # the copy is deleted, the adopted one stays hidden
    assert q.get(job.id).worker == "w1"


POISON_BODIES = {
    "not JSON": ('{"job": "not a slot message"', "body is not JSON"),
    "a 5000-digit number": (
        '{"v": 1, "job_id": "j-1", "attempt": ' + "9" * 5000 + ', "slot": 0, "slots": 1}',
        "cannot be read",
    ),
    "nested 100k deep": ("[" * 100_000 + "]" * 100_000, "nested too deeply"),
    "a job id DynamoDB refuses": (
        '{"v": 1, "job_id": "' + "j" * 3000 + '", "attempt": 1, "slot": 0, "slots": 1}',
        "job_id",
    ),
}


@pytest.mark.parametrize("poison, problem", POISON_BODIES.values(), ids=POISON_BODIES.keys())
def test_a_poison_message_goes_to_the_dead_letter_queue_on_its_first_read_and_loses_no_job(
    q, plane, sqs, caplog, poison, problem
):
    sqs.send_message(QueueUrl=plane["queue_url"], MessageBody=poison)
    with caplog.at_level(logging.WARNING, logger="gpucloud.queue.aws.backend"):
        assert q.claim("w", lease_seconds=60) is None  # one receive: the poison, and nothing else queued
    [dead] = sqs.receive_message(
        QueueUrl=plane["dlq_url"], MaxNumberOfMessages=10, MessageAttributeNames=["All"], VisibilityTimeout=30
    )["Messages"]
    assert dead["Body"] == poison  # intact, for a person to read
    assert problem in dead["MessageAttributes"]["gpucloud.problem"]["StringValue"]
    assert _counts(sqs, plane["queue_url"]) == (0, 0)  # gone from the job queue at once
    lines = [
        r.getMessage()
        for r in caplog.records
        if r.name == "gpucloud.queue.aws.backend" and r.levelno >= logging.WARNING
    ]
    assert len(lines) == 1 and "moved to the dead-letter queue" in lines[0] and problem in lines[0]
    assert "\n" not in lines[0] and len(lines[0]) < 600
    job = q.submit(SPEC)
    assert q.claim("w", lease_seconds=60).id == job.id


def test_the_holders_message_seen_early_is_parked_and_handed_to_the_holder(q, plane, sqs):
    job = q.submit(SPEC)
    q.claim("w1", lease_seconds=60)
    old = _held(plane, job.id)
    # As if SQS's 12-hour cap let the message go while the lease still runs.
    sqs.change_message_visibility(QueueUrl=plane["queue_url"], ReceiptHandle=old["receipt"], VisibilityTimeout=0)
    assert q.claim("w2", lease_seconds=60) is None
    now = _held(plane, job.id)
    assert now["message_id"] == old["message_id"] and now["receipt"] != old["receipt"]
    assert _counts(sqs, plane["queue_url"]) == (0, 1)
    assert q.heartbeat(job.id, 1, "w1", lease_seconds=60)  # extends the parked message with its new receipt


def test_the_holders_message_near_the_receive_limit_is_replaced_by_a_fresh_copy(q, plane, sqs):
    job = q.submit(SPEC)
    q.claim("w1", lease_seconds=60)  # receive 1
    first = _held(plane, job.id)["message_id"]

    def seen_early() -> None:
        sqs.change_message_visibility(
            QueueUrl=plane["queue_url"], ReceiptHandle=_held(plane, job.id)["receipt"], VisibilityTimeout=0
        )
        assert q.claim("w2", lease_seconds=60) is None

    seen_early()  # receive 2: parked
    seen_early()  # receive 3: parked
    assert _held(plane, job.id)["message_id"] == first
    seen_early()  # receive 4 of the stack's 5: a fresh copy replaces it
    fresh = _held(plane, job.id)
    assert fresh["message_id"] != first and "receipt" not in fresh
    assert _counts(sqs, plane["queue_url"], delayed=True) == (0, 0, 1)  # the delayed copy; the old one is deleted
    assert _counts(sqs, plane["dlq_url"]) == (0, 0)
    assert q.get(job.id).worker == "w1"


def test_a_job_whose_message_was_lost_is_still_claimed_from_the_table(plane, sqs):
    q = AwsQueue(parse_aws_uri(plane["uri"]), sweep_grace_s=0.0)
    job = q.submit(SPEC)
    sqs.purge_queue(QueueUrl=plane["queue_url"])  # as if the process died between commit and send
    assert q.claim("w", lease_seconds=60).id == job.id
    q.close()


def test_a_stray_is_left_to_its_message_for_the_grace_period(q, plane, sqs):
    job = q.submit(SPEC)
    sqs.purge_queue(QueueUrl=plane["queue_url"])
    assert q.claim("w", lease_seconds=60) is None  # queued for less than sweep_grace_s
    assert q.get(job.id).state is JobState.QUEUED


def test_the_stack_environment_selects_the_aws_queue(plane, monkeypatch):
    address = parse_aws_uri(plane["uri"])
    monkeypatch.setenv("GPUCLOUD_REGION", address.region)
    monkeypatch.setenv("GPUCLOUD_JOB_TABLE", address.table)
    monkeypatch.setenv("GPUCLOUD_JOB_QUEUE_URL", address.queue_url)
    assert default_queue_uri().startswith("aws://us-east-1?table=")
    queue = open_queue()
    assert isinstance(queue, AwsQueue)
    queue.close()


# -- AWS errors as one line ---------------------------------------------------------------------


def test_missing_credentials_are_one_line(plane, monkeypatch, tmp_path):
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"):
        monkeypatch.delenv(name)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    with pytest.raises(UserError, match="no usable AWS credentials"):
        open_queue(plane["uri"])


def test_an_unreachable_endpoint_is_one_line(plane, monkeypatch):
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "1")
    with pytest.raises(UserError, match="cannot reach AWS"):
        open_queue(plane["uri"])


def test_a_queue_that_does_not_exist_is_one_line(plane):
    uri = plane["uri"].replace("/jobs", "/missing-jobs")
    with pytest.raises(UserError, match="does not exist in us-east-1.*jobQueueUrl"):
        open_queue(uri)


def test_a_table_that_does_not_exist_is_one_line(plane):
    uri = plane["uri"].replace(f"table={plane['table']}", "table=no-such-table")
    queue = open_queue(uri)
    with pytest.raises(UserError, match="submitting a job on .*does not exist"):
        queue.submit(SPEC)


# -- the operator's view ------------------------------------------------------------------------


def test_jobs_and_job_show_on_the_aws_queue(q, plane, capsys):
    job = q.submit(SPEC, job_id="llama-7b")
    q.claim("node-a", lease_seconds=60)
    q.record(job.id, 1, "notice", data={"kind": "spot-interruption"})
    q.end_attempt(
        job.id, 1, AttemptEnd(state=AttemptState.REQUEUED, exit_code=75, committed_step=4, last_step=4, reason="notice")
    )
    code, out, _ = run(capsys, "jobs", "--queue", plane["uri"], "--output", "json")
    assert code == 0
    [row] = json.loads(out)
    assert (row["job_id"], row["state"], row["attempt"]) == ("llama-7b", "queued", 2)
    code, out, _ = run(capsys, "job", "show", "llama-7b", "--queue", plane["uri"], "--output", "json")
    assert code == 0
    report = json.loads(out)
    assert [a["state"] for a in report["attempts"]] == ["requeued", "queued"]
    code, out, _ = run(capsys, "jobs", "--queue", plane["uri"])
    assert code == 0 and "llama-7b" in out


def test_the_cli_on_a_node_needs_no_queue_flag(q, plane, capsys, monkeypatch):
    address = parse_aws_uri(plane["uri"])
    for name, value in (
        ("GPUCLOUD_REGION", address.region),
        ("GPUCLOUD_JOB_TABLE", address.table),
        ("GPUCLOUD_JOB_QUEUE_URL", address.queue_url),
    ):
        monkeypatch.setenv(name, value)
    code, out, _ = run(capsys, "submit", "--job-id", "from-node", "--output", "json", "--", "python", "t.py")
    assert code == 0 and json.loads(out)["state"] == "queued"
    assert q.get("from-node").state is JobState.QUEUED
    code, out, _ = run(capsys, "jobs", "--output", "json")
    assert [r["job_id"] for r in json.loads(out)] == ["from-node"]


def test_a_bad_queue_uri_on_the_cli_is_one_line(capsys):
    code, _, err = run(capsys, "jobs", "--queue", "aws://us-east-1?table=jobs")
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2 and len(lines) == 1 and "queue= is missing" in lines[0]


def test_a_worker_runs_a_job_from_the_aws_queue_to_the_end(plane, capsys):
    import sys

    code, _, _ = run(capsys, "submit", "--queue", plane["uri"], "--job-id", "w-aws", "--", sys.executable, "-c", "pass")
    assert code == 0
    code, out, _ = run(capsys, "worker", "--queue", plane["uri"], "--no-imds", "--once", "--output", "json")
    assert code == 0 and json.loads(out)["jobs"] == [{"job_id": "w-aws", "state": "finished", "exit_code": 0}]
    code, out, _ = run(capsys, "job", "show", "w-aws", "--queue", plane["uri"], "--output", "json")
    kinds = [e["kind"] for e in json.loads(out)["timeline"]]
    assert kinds[0] == "submitted" and "claimed" in kinds and kinds[-1] == "finish"
    sqs = boto3.client("sqs")
    assert _counts(sqs, plane["queue_url"]) == (0, 0)  # the job's message went with it


@pytest.mark.parametrize(
    "damage", [{"spec": {"S": '{"command": ['}}, {"lease_until": {"S": "soon"}}], ids=["bad spec JSON", "text lease"]
)
def test_an_unreadable_job_item_is_skipped_with_one_line_and_the_next_job_is_claimed(q, plane, caplog, damage):
    bad, good = q.submit(SPEC, job_id="bad"), q.submit(SPEC, job_id="good")
    item = boto3.client("dynamodb").get_item(TableName=plane["table"], Key=key(bad.id, "meta"))["Item"]
    boto3.client("dynamodb").put_item(TableName=plane["table"], Item={**item, **damage})
    with caplog.at_level(logging.WARNING, logger="gpucloud.queue.aws.backend"):
        assert [j.id for j in q.list_jobs()] == [good.id]
        assert [j.id for j in q.list_jobs()] == [good.id]
        claimed = wait_for(lambda: q.claim("w", lease_seconds=60), what="the readable job")
    assert claimed.id == good.id
    lines = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert lines and all("'bad'" in line and "\n" not in line for line in lines)
    assert len([line for line in lines if "skipped" in line]) == 1  # listed twice, told once


def test_a_worker_behind_a_poison_message_runs_the_job_instead_of_exiting(plane, capsys):
    """Before: the worker exited 1 (RecursionError) on every receive until SQS dead-lettered it."""
    import sys

    sqs = boto3.client("sqs")
    sqs.send_message(QueueUrl=plane["queue_url"], MessageBody="[" * 100_000 + "]" * 100_000)
    code, _, _ = run(capsys, "submit", "--queue", plane["uri"], "--job-id", "w-aws", "--", sys.executable, "-c", "pass")
    assert code == 0
    code, out, err = run(capsys, "worker", "--queue", plane["uri"], "--no-imds", "--once", "--output", "json")
    assert code == 0, err
    assert json.loads(out)["jobs"] == [{"job_id": "w-aws", "state": "finished", "exit_code": 0}]
    assert _counts(sqs, plane["dlq_url"]) == (1, 0)
