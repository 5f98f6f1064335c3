"""Hand-made queue history for the report's tests and benchmarks/bench_report.py.

``write_sqlite`` is the bulk path: rows written straight into a queue file whose schema
``SqliteQueue`` created (the columns are the models' fields), in one transaction, since driving
10,000 jobs through submit/claim/end_attempt would time the queue's writes, not the report.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterable, Sequence
from pathlib import Path

from gpucloud.cost.report import JobHistory
from gpucloud.lifecycle.model import Event, JobSpec, NodeRecord, NodeState
from gpucloud.queue.sqlite import SqliteQueue
from helpers.job_histories import Span, interrupted_once


def write_sqlite(path: Path, histories: Iterable[JobHistory], nodes: Sequence[NodeRecord] = ()) -> str:
    """Write ``histories`` and ``nodes`` to a new queue at ``path``; its URI."""
    uri = f"sqlite:///{path}"
    SqliteQueue(path, uri=uri).close()  # the schema, as the queue writes it
    db = sqlite3.connect(path)
    with db:
        for history in histories:
            job = history.job.model_dump(mode="json")
            job["spec"] = history.job.spec.model_dump_json()
            db.execute(f"INSERT INTO jobs ({', '.join(job)}) VALUES ({', '.join('?' * len(job))})", tuple(job.values()))
            for attempt in history.attempts:
                row = attempt.model_dump(mode="json")
                db.execute(
                    f"INSERT INTO attempts ({', '.join(row)}) VALUES ({', '.join('?' * len(row))})", tuple(row.values())
                )
            db.executemany(
                "INSERT INTO events (job_id, attempt, kind, at, data) VALUES (?, ?, ?, ?, ?)",
                [(e.job_id, e.attempt, e.kind, e.at, json.dumps(e.data)) for e in history.events],
            )
        db.executemany("INSERT INTO nodes (id, record) VALUES (?, ?)", [(n.id, n.model_dump_json()) for n in nodes])
    db.close()
    return uri


def interrupted_job(
    job_id: str,
    *,
    start: float,
    group: str = "p5-spot",
    worker: str = "agent-a",
    next_worker: str = "agent-b",
    gpus: int = 8,
    save_seconds: float = 36.0,
    node_info: dict[str, str] | None = None,
) -> JobHistory:
    """Two 1-hour attempts on one node of ``gpus`` GPUs: a spot notice, then a finish.

    Attempt 1: [start, start+3600], trains steps 0..120, committed 100 at the notice; attempt 2:
    [start+3700, start+7300], restores step 100 at start+3760 (60 s restart), finishes at 220.
    One save of ``save_seconds`` in each attempt. ``node_info``: what the ``started`` events carry
    about the node (instance type, region, AZ, life cycle; ``jobs/runner.py``), which prices it."""
    spec = JobSpec(command=["python", "train.py"], gpus_per_node=gpus, nodes=1, group=group, name=f"{job_id}-run")

    def ev(attempt: int, what: str, at: float, **data: object) -> Event:
        return Event(job_id=job_id, attempt=attempt, kind=what, at=start + at, data=data)

    events = [
        ev(1, "started", 0.0, **({"node": {**node_info, "worker": worker}} if node_info else {})),
        ev(1, "resume", 0.0, step=0),
        ev(1, "saved", 1800.0, step=50, bytes=10**9, seconds=save_seconds),
        ev(1, "notice", 3500.0, kind="spot-interruption", deadline=start + 3620.0),
        ev(1, "requeue", 3600.0, reason="checkpointed on notice"),
        ev(2, "started", 3700.0, **({"node": {**node_info, "worker": next_worker}} if node_info else {})),
        ev(2, "resume", 3760.0, step=100),
        ev(2, "saved", 5400.0, step=160, bytes=10**9, seconds=save_seconds),
        ev(2, "finish", 7300.0, step=220),
    ]
    first = Span(started_at=start, ended_at=start + 3600, last_step=120, committed_step=100, worker=worker)
    second = Span(started_at=start + 3700, ended_at=start + 7300, resumed_step=100, last_step=220, worker=next_worker)
    history = interrupted_once(job_id, spec, first, second, events, created_at=start - 10, updated_at=start + 7300)
    return JobHistory(*history)


def node(worker: str, *, group: str, lifecycle: str, state: NodeState, updated_at: float, instance: str) -> NodeRecord:
    return NodeRecord(
        id=worker,
        address="10.0.0.1",
        state=state,
        instance_type="p5.48xlarge",
        lifecycle=lifecycle,
        instance_id=instance,
        group=group,
        updated_at=updated_at,
    )
