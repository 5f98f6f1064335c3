"""One SQS message per gang slot (moto server): what agents do with them.

The contract suite (``test_queue_contract.py``) shows that gangs behave the same on both backends;
these tests look at the messages themselves: how many there are, who keeps them hidden and for how
long, and that none of the ways a slot changes hands walks a good message into the dead-letter
queue.
"""

from __future__ import annotations

import json
import time

import boto3
import pytest
from botocore.config import Config

from gpucloud.lifecycle.model import AttemptEnd, AttemptState, JobSpec, JobState
from gpucloud.queue import gang
from gpucloud.queue.aws.backend import AwsQueue
from gpucloud.queue.aws.uri import parse_aws_uri

from .aws_fixtures import message_counts, visible_messages
from .conftest import wait_for

GANG = JobSpec(command=["torchrun", "train.py"], nodes=3, gpus_per_node=8, max_attempts=2)
SINGLE = JobSpec(command=["python", "train.py"])


@pytest.fixture
def plane(aws_job_plane):
    return aws_job_plane


@pytest.fixture
def q(plane):
    queue = AwsQueue(parse_aws_uri(plane["uri"]))
    yield queue
    queue.close()


@pytest.fixture
def sqs(plane):
    return boto3.client("sqs", config=Config(retries={"max_attempts": 1}))


def _slot_item(plane, job_id: str, attempt: int, slot: int) -> dict:
    from gpucloud.queue.aws.items import key, slot_sk

    item = (
        boto3.client("dynamodb")
        .get_item(TableName=plane["table"], Key=key(job_id, slot_sk(attempt, slot)), ConsistentRead=True)
        .get("Item", {})
    )
    return {name: value.get("S", value.get("N")) for name, value in item.items()}


def _claim(q, worker: str, *, lease: float = 60.0, seconds: float = 15.0):
    return wait_for(
        lambda: gang.claim_slot(q, worker, f"10.0.0.{len(worker)}", lease_seconds=lease),
        timeout=seconds,
        what=f"a slot for {worker}",
    )


def test_a_job_of_n_nodes_posts_one_message_per_slot(q, plane, sqs):
    job = q.submit(GANG)
    bodies = sorted((json.loads(m["Body"]) for m in visible_messages(sqs, plane["queue_url"])), key=lambda b: b["slot"])
    assert bodies == [{"v": 1, "job_id": job.id, "attempt": 1, "slot": s, "slots": 3} for s in range(3)]


def test_a_member_keeps_its_slots_message_hidden_while_it_renews(q, plane, sqs):
    job = q.submit(GANG)
    claim = _claim(q, "agent-a", lease=1.0)
    held = _slot_item(plane, job.id, 1, claim.slot)
    assert held["message_id"] and held["receipt"]
    assert message_counts(sqs, plane["queue_url"]) == (2, 1)  # the other two slots still wait for nodes
    for _ in range(3):  # 3 s of renewals against a 1 s lease: the message never shows
        assert gang.renew(q, claim, lease_seconds=1.5)
        time.sleep(0.8)
        assert message_counts(sqs, plane["queue_url"])[1] == 1
    shown = {json.loads(m["Body"])["slot"] for m in visible_messages(sqs, plane["queue_url"])}
    assert claim.slot not in shown


def test_a_released_slot_shows_its_message_again(q, plane, sqs):
    job = q.submit(GANG)
    claim = _claim(q, "agent-a")
    assert gang.release(q, claim)
    assert message_counts(sqs, plane["queue_url"]) == (3, 0)
    assert _slot_item(plane, job.id, 1, claim.slot) == {}


def test_a_dead_members_message_returns_and_fails_the_gang_over_exactly_once(q, plane, sqs):
    job = q.submit(GANG)
    members = [_claim(q, "agent-a"), _claim(q, "agent-b"), _claim(q, "agent-dead", lease=1.0)]
    for member in members:
        assert gang.start_gang(q, member, lease_seconds=60) is not None
    # agent-dead stops renewing: its message shows after its 1 s lease; the next receiver fails over.
    wait_for(
        lambda: gang.claim_slot(q, "agent-c", "10.0.0.9", lease_seconds=60) or q.get(job.id).attempt == 2,
        what="the fail-over",
    )
    after = q.get(job.id)
    assert (after.state, after.attempt, after.crashes) == (JobState.QUEUED, 2, 0)
    kinds = [e.kind for e in q.events(job.id)]
    assert kinds.count("requeue") == 1 and kinds.count("lease-expired") == 1

    # Attempt 1's messages are gone (the end deleted the held ones, the dead one was done with);
    # attempt 2 has its own three, one of which agent-c may hold already.
    def attempt_two_only() -> bool:
        visible, in_flight = message_counts(sqs, plane["queue_url"])
        return visible + in_flight == 3

    wait_for(attempt_two_only, what="exactly attempt 2's three messages")
    survivors = [_claim(q, "agent-a"), _claim(q, "agent-b")]
    assert {c.attempt for c in survivors} == {2}


def test_ending_a_gang_attempt_deletes_every_members_message(q, plane, sqs):
    job = q.submit(GANG)
    members = [_claim(q, f"agent-{n}") for n in "abc"]
    for member in members:
        gang.start_gang(q, member, lease_seconds=60)
    assert message_counts(sqs, plane["queue_url"]) == (0, 3)
    end = AttemptEnd(state=AttemptState.FINISHED, exit_code=0, last_step=10)
    assert q.end_attempt(job.id, 1, end).applied
    assert message_counts(sqs, plane["queue_url"]) == (0, 0)


def test_a_single_node_worker_passes_gang_messages_to_the_agents_and_takes_its_job(q, plane, sqs):
    g = q.submit(GANG)
    single = q.submit(SINGLE)
    taken = wait_for(lambda: q.claim("worker-1", lease_seconds=60), what="the single-node job")
    assert taken.id == single.id and q.get(g.id).state is JobState.QUEUED
    # The three gang messages were handed back (delayed), not dead-lettered, and agents get them.
    assert message_counts(sqs, plane["dlq_url"]) == (0, 0)
    assert _claim(q, "agent-a").job_id == g.id


def test_slots_handed_back_again_and_again_do_not_reach_the_dead_letter_queue(q, plane, sqs):
    job = q.submit(JobSpec(command=["torchrun"], nodes=1))
    for round_ in range(8):  # the stack's maxReceiveCount is 5
        claim = _claim(q, f"agent-{round_}")
        assert gang.release(q, claim)
    assert message_counts(sqs, plane["dlq_url"]) == (0, 0)
    assert _claim(q, "agent-last").job_id == job.id


def test_a_gang_whose_messages_were_lost_is_still_formed_from_the_table(plane, sqs):
    q = AwsQueue(parse_aws_uri(plane["uri"]), sweep_grace_s=0.0)
    job = q.submit(JobSpec(command=["torchrun"], nodes=2))
    sqs.purge_queue(QueueUrl=plane["queue_url"])  # as if the sender died between commit and send
    claims = [gang.claim_slot(q, w, "10.0.0.1", lease_seconds=60) for w in ("agent-a", "agent-b")]
    assert sorted(c.slot for c in claims) == [0, 1] and {c.job_id for c in claims} == {job.id}
    q.close()


def test_a_malformed_message_goes_to_the_dead_letter_queue_and_the_gang_still_forms(q, plane, sqs):
    poison = "not json at all"
    sqs.send_message(QueueUrl=plane["queue_url"], MessageBody=poison)
    job = q.submit(JobSpec(command=["torchrun"], nodes=2))
    claims = [_claim(q, "agent-a"), _claim(q, "agent-b")]
    assert gang.members(q, q.get(job.id), 1) is not None and len(claims) == 2
    [dead] = wait_for(
        lambda: (gang.claim_slot(q, "agent-x", "10.0.0.3", lease_seconds=60), visible_messages(sqs, plane["dlq_url"]))[
            1
        ],
        what="the poison message in the dead-letter queue",
    )
    assert dead["Body"] == poison
