"""The stop-request contract (``JobQueue.request_stop`` / ``stop_request``) on every backend: how a
notice reaches every member of a gang through the job table."""

from __future__ import annotations

import sqlite3
import threading

import pytest

from gpucloud.errors import UserError
from gpucloud.lifecycle.model import AttemptEnd, AttemptState, JobSpec
from gpucloud.queue.protocol import UnknownJob
from gpucloud.queue.sqlite import SqliteQueue
from gpucloud.signals.events import Notice, event_id_for

SPEC = JobSpec(command=["python", "train.py"], nodes=2)
INSTANCE = "i-1234567890abcdef0"


def warning(n: int = 0, *, kind: str = "spot-interruption", instance: str | None = INSTANCE) -> Notice:
    body = {"instance-id": instance, "n": n} if instance else {"n": n}
    return Notice(
        kind=kind,
        source="queue",
        deadline=1_800_000_000.0 + n,
        received_at=1_799_999_900.0 + n,
        event_id=event_id_for(kind, body),
        action="terminate",
        payload=body,
    )


def running(jq, job_id: str | None = None):
    job = jq.submit(SPEC) if job_id is None else jq.get(job_id)
    return jq.claim(f"gang:{job.id}:{job.attempt}", lease_seconds=60, job_id=job.id)


def test_a_request_on_the_running_attempt_applies_once_and_keeps_the_notice(jq):
    job = running(jq)
    assert jq.stop_request(job.id, 1) is None
    notice = warning()
    assert jq.request_stop(job.id, 1, notice) is True
    got = jq.stop_request(job.id, 1)
    assert (got.kind, got.source, got.deadline, got.received_at, got.event_id, got.action) == (
        notice.kind,
        notice.source,
        notice.deadline,
        notice.received_at,
        notice.event_id,
        notice.action,
    )
    assert got.payload["instance-id"] == INSTANCE
    (event,) = [e for e in jq.events(job.id) if e.kind == "stop-request"]
    assert event.attempt == 1
    assert event.data == {
        "kind": "spot-interruption",
        "source": "queue",
        "deadline": notice.deadline,
        "action": "terminate",
        "instance_id": INSTANCE,
        "event_id": notice.event_id,
    }


def test_a_repeat_is_a_no_op_and_the_first_request_wins(jq):
    job = running(jq)
    first, second = warning(1), warning(2)
    assert jq.request_stop(job.id, 1, first) is True
    assert jq.request_stop(job.id, 1, first) is False  # duplicate delivery
    assert jq.request_stop(job.id, 1, second) is False  # a later, different notice
    assert jq.stop_request(job.id, 1).event_id == first.event_id
    assert [e.kind for e in jq.events(job.id)].count("stop-request") == 1


def test_a_request_for_another_attempt_or_a_job_not_running_is_refused(jq):
    queued = jq.submit(SPEC)
    assert jq.request_stop(queued.id, 1, warning()) is False  # gang still forming
    job = running(jq)
    assert jq.request_stop(job.id, 2, warning()) is False
    assert jq.stop_request(job.id, 2) is None and jq.stop_request(job.id, 1) is None
    jq.end_attempt(job.id, 1, AttemptEnd(state=AttemptState.FINISHED, exit_code=0))
    assert jq.request_stop(job.id, 1, warning()) is False  # ended
    assert jq.stop_request(job.id, 1) is None
    assert "stop-request" not in [e.kind for e in jq.events(job.id)]


def test_each_attempt_gets_its_own_request(jq):
    job = running(jq)
    assert jq.request_stop(job.id, 1, warning(1))
    jq.end_attempt(job.id, 1, AttemptEnd(state=AttemptState.REQUEUED, exit_code=75, reason="notice"))
    assert jq.stop_request(job.id, 2) is None  # attempt 2 starts without one
    running(jq, job.id)
    assert jq.request_stop(job.id, 2, warning(2)) is True
    assert jq.stop_request(job.id, 2).event_id == warning(2).event_id


def test_racing_requests_from_several_clients_apply_exactly_once(open_backend):
    owner = open_backend()
    job = running(owner)
    clients = [open_backend() for _ in range(6)]
    barrier = threading.Barrier(len(clients))
    applied: dict[int, bool] = {}

    def request(i: int) -> None:
        barrier.wait()
        applied[i] = clients[i].request_stop(job.id, 1, warning(i))

    threads = [threading.Thread(target=request, args=(i,)) for i in range(len(clients))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    winners = [i for i, ok in applied.items() if ok]
    assert len(applied) == 6 and len(winners) == 1
    assert owner.stop_request(job.id, 1).event_id == warning(winners[0]).event_id
    assert [e.kind for e in owner.events(job.id)].count("stop-request") == 1


def test_an_unknown_job_is_named_and_reads_as_no_request(jq):
    with pytest.raises(UnknownJob, match="'nope'"):
        jq.request_stop("nope", 1, warning())
    assert jq.stop_request("nope", 1) is None


def test_only_stop_notices_can_be_requested(jq):
    job = running(jq)
    with pytest.raises(ValueError, match="a rebalance notice cannot stop a gang"):
        jq.request_stop(job.id, 1, warning(kind="rebalance"))
    assert jq.stop_request(job.id, 1) is None


def test_the_instance_of_a_notice_without_one_in_its_payload_is_empty(jq):
    job = running(jq)
    assert jq.request_stop(job.id, 1, warning(instance=None))
    assert "instance-id" not in jq.stop_request(job.id, 1).payload


# -- backend specifics: corrupt records --------------------------------------


def test_a_corrupt_sqlite_request_is_a_one_line_error(tmp_path):
    q = SqliteQueue(tmp_path / "q.db")
    job = running(q)
    with sqlite3.connect(tmp_path / "q.db") as db:
        db.execute("INSERT INTO stop_requests VALUES (?, 1, ?)", (job.id, '{"kind": "spot-interruption"}'))
    with pytest.raises(
        UserError, match=r"stop request of job .* attempt 1 .* is unreadable \(source: Field required\)"
    ) as err:
        q.stop_request(job.id, 1)
    assert "\n" not in str(err.value)
    q.close()


def test_a_corrupt_dynamodb_request_is_a_one_line_error(aws_job_plane):
    import boto3

    from gpucloud.queue.aws.items import key
    from gpucloud.queue.connect import open_queue

    q = open_queue(aws_job_plane["uri"])
    job = running(q)
    boto3.client("dynamodb").update_item(
        TableName=aws_job_plane["table"],
        Key=key(job.id, "meta"),
        UpdateExpression="SET stop_attempt = :k, stop_request = :r",
        ExpressionAttributeValues={":k": {"N": "1"}, ":r": {"S": "not json"}},
    )
    with pytest.raises(UserError, match=r"stop request of job .* attempt 1 in table .* is unreadable") as err:
        q.stop_request(job.id, 1)
    assert "\n" not in str(err.value)
    assert q.stop_request(job.id, 2) is None  # another attempt's read is unaffected
    q.close()


def test_job_show_renders_the_request_as_one_line(jq):
    from gpucloud.cost.timeline import build_timeline

    job = running(jq)
    notice = warning()
    jq.request_stop(job.id, 1, notice)
    report = build_timeline(jq.get(job.id), jq.attempts(job.id), jq.events(job.id))
    (row,) = [r for r in report.timeline if r.kind == "stop-request"]
    lead = notice.deadline - row.at
    assert row.detail == (
        f"spot-interruption (terminate) from queue about {INSTANCE}, deadline {lead:+.1f}s: every gang member stops"
    )
