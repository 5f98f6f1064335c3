"""The scaling decision's view of the fleet, read from a real (SQLite) queue."""

from __future__ import annotations

import sys

from gpucloud.agent.fleet_view import fleet_state
from gpucloud.agent.scaling import GroupBounds, WaitingGang, desired_capacity
from gpucloud.lifecycle.model import JobSpec, NodeRecord, NodeState
from gpucloud.queue import gang
from gpucloud.queue.sqlite import SqliteQueue

CMD = [sys.executable, "-c", "pass"]


def test_unclaimed_slots_live_agents_and_the_desired_capacity_they_give(tmp_path):
    queue = SqliteQueue(tmp_path / "q.db")
    try:
        queue.submit(JobSpec(command=CMD, nodes=2), job_id="g2")
        queue.submit(JobSpec(command=CMD, nodes=3), job_id="g3")
        now = 1_000.0
        assert gang.claim_slot(queue, "w1", "10.0.0.1", lease_seconds=30, now=now) is not None  # g2 slot 0
        # An expired claim on g3 frees its slot again.
        assert gang.claim_slot(queue, "w2", "10.0.0.2", lease_seconds=1, job_id="g3", now=now - 60) is not None
        for worker, state, updated in (
            ("w1", NodeState.WAITING, now),
            ("w3", NodeState.IDLE, now - 1),
            ("dead", NodeState.RUNNING, now - 120),
        ):
            queue.register_node(NodeRecord(id=worker, address="x", state=state, updated_at=updated))
        state = fleet_state(queue, node_lease=30, launching=2, now=now)
    finally:
        queue.close()
    assert state.waiting == (WaitingGang(nodes=2, unclaimed=1), WaitingGang(nodes=3, unclaimed=3))
    assert (state.busy_nodes, state.idle_nodes, state.launching_nodes) == (1, 1, 2)  # the stale record is ignored
    decision = desired_capacity(state, GroupBounds(0, 4))
    # 1 busy + 1 slot of g2; g3's 3 slots do not fit under 4 and stop the count.
    assert (decision.desired, decision.slots_planned, decision.launch) == (2, 1, 0)
