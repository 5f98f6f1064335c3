"""Records of a job interrupted once: attempt 1 requeued after a spot notice, attempt 2 finished.

The report, cost and ``job show`` tests each pin their own times and steps (the numbers their hand
arithmetic checks) and their own timeline of events; the job and its two attempts are built here,
either as models (``interrupted_once``) or through a queue's own calls (``record_history``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any, NamedTuple

from gpucloud.lifecycle.model import Attempt, AttemptEnd, AttemptState, Event, Job, JobSpec, JobState
from gpucloud.queue.protocol import JobQueue

# A spot p4d node in us-east-1a, as the ``started``/``exit`` events carry it (what prices an attempt).
SPOT_NODE_A = {
    "worker": "i-a:1",
    "instance_id": "i-a",
    "instance_type": "p4d.24xlarge",
    "lifecycle": "spot",
    "availability_zone": "us-east-1a",
    "region": "us-east-1",
}
# The same type on demand in us-east-1b.
ON_DEMAND_NODE_B = {
    **SPOT_NODE_A,
    "worker": "i-b:1",
    "instance_id": "i-b",
    "lifecycle": "on-demand",
    "availability_zone": "us-east-1b",
}


class History(NamedTuple):
    """One job's records, as a queue returns them (unpacks as ``job, attempts, events``)."""

    job: Job
    attempts: list[Attempt]
    events: list[Event]


@dataclasses.dataclass(frozen=True)
class Span:
    """One attempt's wall-clock span and steps."""

    started_at: float
    ended_at: float
    last_step: int
    resumed_step: int | None = None  # None: started fresh
    committed_step: int | None = None
    worker: str | None = None


def interrupted_once(
    job_id: str,
    spec: JobSpec,
    first: Span,
    second: Span,
    events: Sequence[Event],
    *,
    created_at: float = 0.0,
    updated_at: float = 0.0,
) -> History:
    """A finished job whose attempt 1 (``first``) was requeued and whose attempt 2 (``second``) finished.

    Attempt 1 is created with the job, attempt 2 when attempt 1 ended (the requeue creates it)."""
    job = Job(id=job_id, spec=spec, state=JobState.FINISHED, attempt=2, created_at=created_at, updated_at=updated_at)
    attempts = [
        _attempt(job_id, 1, AttemptState.REQUEUED, first, created_at=created_at),
        _attempt(job_id, 2, AttemptState.FINISHED, second, created_at=first.ended_at),
    ]
    return History(job, attempts, list(events))


def _attempt(job_id: str, number: int, state: AttemptState, span: Span, *, created_at: float) -> Attempt:
    return Attempt(
        job_id=job_id,
        number=number,
        state=state,
        worker=span.worker,
        created_at=created_at,
        started_at=span.started_at,
        ended_at=span.ended_at,
        resumed_step=span.resumed_step,
        last_step=span.last_step,
        committed_step=span.committed_step,
    )


def spot_then_on_demand(*, with_nodes: bool = True) -> History:
    """Attempt 1 on spot node A: 0..3600 (resume at 0, step 100; notice at 3000; committed 50);
    attempt 2 on on-demand node B: 4000..7600, restoring step 50 at 4100. ``with_nodes=False``: a
    job recorded before the events carried the node."""

    def node(n: dict[str, str]) -> dict[str, Any]:
        return {"node": n} if with_nodes else {}

    def ev(attempt: int, kind: str, at: float, data: dict[str, Any]) -> Event:
        return Event(job_id="j", attempt=attempt, kind=kind, at=at, data=data)

    return interrupted_once(
        "j",
        JobSpec(command=["train"], gpus_per_node=8),
        Span(started_at=0.0, ended_at=3600.0, last_step=100, committed_step=50),
        Span(started_at=4000.0, ended_at=7600.0, last_step=200, resumed_step=50),
        [
            ev(1, "started", 0.0, node(SPOT_NODE_A)),
            ev(1, "resume", 0.0, {"step": 0}),
            ev(1, "notice", 3000.0, {"kind": "spot-interruption", "deadline": 3120.0}),
            ev(1, "exit", 3600.0, {"exit_code": 75, **node(SPOT_NODE_A)}),
            ev(2, "started", 4000.0, node(ON_DEMAND_NODE_B)),
            ev(2, "resume", 4100.0, {"step": 50}),
            ev(2, "exit", 7600.0, {"exit_code": 0, **node(ON_DEMAND_NODE_B)}),
        ],
    )


def record_history(jq: JobQueue, history: History, *, worker: str = "w") -> str:
    """Record ``history`` through the queue's own calls (submit, claim, update, record, end), as a
    worker would; the new job's id. The queue stamps its own ids and end times."""
    job = jq.submit(history.job.spec)
    for attempt in history.attempts:
        jq.claim(worker, lease_seconds=60, job_id=job.id)
        fields: dict[str, Any] = {"started_at": attempt.started_at}
        if attempt.resumed_step is not None:
            fields["resumed_step"] = attempt.resumed_step
        jq.update_attempt(job.id, attempt.number, **fields)
        for event in history.events:
            if event.attempt == attempt.number:
                jq.record(job.id, attempt.number, event.kind, at=event.at, data=event.data)
        end = AttemptEnd(state=attempt.state, last_step=attempt.last_step, committed_step=attempt.committed_step)
        jq.end_attempt(job.id, attempt.number, end)
    return job.id
