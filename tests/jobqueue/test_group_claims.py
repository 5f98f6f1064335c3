"""Contract: an agent takes only jobs of its own node group (both backends: SQLite and moto's SQS +
DynamoDB). On SQS every group's slot messages share one queue, so an agent of another group
receives them too and must hand them straight back."""

from __future__ import annotations

import time

from gpucloud.agent.node_groups import NodeGroups
from gpucloud.lifecycle.model import JobSpec
from gpucloud.queue import gang

CLUSTER = ("a", "b")  # a is the stack's first group: the default


def accepts(own: str):
    groups = NodeGroups(own=own, names=CLUSTER)
    return lambda job, at: groups.takes(job.spec, queued_for=gang.queued_for(job, at))


def claim_within(jq, worker: str, group: str, seconds: float = 10.0):
    """Claim until a slot comes (a message another group's agent had just received shows again
    when it hands it back; on SQS that is a visibility change, not instant everywhere)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        claim = gang.claim_slot(jq, worker, "10.0.0.9", lease_seconds=60, accepts=accepts(group))
        if claim is not None:
            return claim
    raise AssertionError(f"{worker} of group {group} got no slot within {seconds}s")


def test_an_agent_of_group_b_never_claims_a_job_for_group_a(jq):
    for_a = jq.submit(JobSpec(command=["train"], nodes=2, group="a"), job_id="for-a")
    unnamed = jq.submit(JobSpec(command=["train"]), job_id="unnamed")  # the default group's (a)
    for_b = jq.submit(JobSpec(command=["train"], group="b"), job_id="for-b")

    # skip_delay: how long a handed-back offer stays hidden from this agent (the agent's poll interval)
    got_b = [
        gang.claim_slot(jq, f"b{i}", "10.0.1.1", lease_seconds=60, accepts=accepts("b"), skip_delay=1.0)
        for i in range(6)
    ]
    assert {c.job_id for c in got_b if c is not None} == {for_b.id}
    assert gang.claim_slot(jq, "b9", "10.0.1.9", lease_seconds=60, job_id=for_a.id, accepts=accepts("b")) is None
    assert jq.slot_claims(for_a.id, 1) == [] and jq.slot_claims(unnamed.id, 1) == []

    # Group a's agents still get every slot the b agents received and handed back.
    taken = {(c.job_id, c.slot) for c in (claim_within(jq, f"a{i}", "a") for i in range(3))}
    assert taken == {(for_a.id, 0), (for_a.id, 1), (unnamed.id, 0)}


def test_an_agent_without_a_group_takes_any_job(jq):
    """A laptop or the fleet simulation (no node.env) serves every group, as before groups existed."""
    job = jq.submit(JobSpec(command=["train"], group="b"))
    claim = gang.claim_slot(
        jq,
        "laptop",
        "127.0.0.1",
        lease_seconds=60,
        accepts=lambda j, at: NodeGroups().takes(j.spec, queued_for=gang.queued_for(j, at)),
    )
    assert claim is not None and claim.job_id == job.id
