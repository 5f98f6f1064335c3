"""The embedded job queue: one SQLite file (WAL), safe across threads and processes on one host.

Every state change is one ``BEGIN IMMEDIATE`` transaction (the database's write lock), and the
transitions that must happen once are conditional updates checked by their row count, backed by
the ``attempts`` primary key (job_id, number): a second attempt k+1 cannot exist even if a bug
skipped the condition.
"""

from __future__ import annotations

import json
import sqlite3
import threading
import time
import uuid
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from gpucloud.checkpoint.layout import validate_job_id
from gpucloud.errors import UserError
from gpucloud.jobs.model import (
    EVENT_KINDS,
    Attempt,
    AttemptEnd,
    AttemptState,
    Event,
    Job,
    JobSpec,
    JobState,
    NodeRecord,
    SlotClaim,
    SlotOffer,
    StopRequest,
)
from gpucloud.queue.gang import GANG_WORKER_PREFIX, gang_worker
from gpucloud.queue.protocol import Transition, UnknownJob
from gpucloud.signals.events import Notice

SCHEMA_VERSION = 1
BUSY_TIMEOUT_S = 30.0

_SCHEMA = f"""
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS jobs (
    id TEXT PRIMARY KEY,
    spec TEXT NOT NULL,
    state TEXT NOT NULL CHECK (state IN ({", ".join(repr(s.value) for s in JobState)})),
    attempt INTEGER NOT NULL CHECK (attempt >= 1),
    crashes INTEGER NOT NULL DEFAULT 0,
    created_at REAL NOT NULL,
    updated_at REAL NOT NULL,
    worker TEXT,
    lease_until REAL,
    reason TEXT,
    exit_code INTEGER
);
CREATE INDEX IF NOT EXISTS jobs_by_state ON jobs (state, created_at);
CREATE TABLE IF NOT EXISTS attempts (
    job_id TEXT NOT NULL REFERENCES jobs (id),
    number INTEGER NOT NULL,
    state TEXT NOT NULL CHECK (state IN ({", ".join(repr(s.value) for s in AttemptState)})),
    worker TEXT,
    node TEXT,
    created_at REAL NOT NULL,
    started_at REAL,
    ended_at REAL,
    exit_code INTEGER,
    resumed_step INTEGER,
    last_step INTEGER,
    committed_step INTEGER,
    reason TEXT,
    PRIMARY KEY (job_id, number)
);
CREATE TABLE IF NOT EXISTS events (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    job_id TEXT NOT NULL REFERENCES jobs (id),
    attempt INTEGER NOT NULL,
    kind TEXT NOT NULL,
    at REAL NOT NULL,
    data TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS events_by_job ON events (job_id, seq);
CREATE TABLE IF NOT EXISTS gang_slots (
    job_id TEXT NOT NULL REFERENCES jobs (id),
    attempt INTEGER NOT NULL,
    slot INTEGER NOT NULL CHECK (slot >= 0),
    worker TEXT NOT NULL,
    address TEXT NOT NULL,
    lease_until REAL NOT NULL,
    PRIMARY KEY (job_id, attempt, slot)
);
CREATE TABLE IF NOT EXISTS nodes (id TEXT PRIMARY KEY, record TEXT NOT NULL);
-- One stop request per attempt (JobQueue.request_stop). IF NOT EXISTS also adds it to a queue
-- file written before it existed: the migration is this statement, run at every open.
CREATE TABLE IF NOT EXISTS stop_requests (
    job_id TEXT NOT NULL REFERENCES jobs (id),
    attempt INTEGER NOT NULL,
    request TEXT NOT NULL,
    PRIMARY KEY (job_id, attempt)
);
"""

_ATTEMPT_FIELDS = ("started_at", "resumed_step", "last_step", "node")


class SqliteQueue:
    """``JobQueue`` on a SQLite file. ``uri`` is ``sqlite:///relative.db`` or ``sqlite:////abs.db``."""

    def __init__(self, path: str | Path, *, uri: str | None = None) -> None:
        self.path = Path(path)
        self.uri = uri or f"sqlite:///{self.path}"
        if self.path.is_dir():
            raise UserError(f"queue path {self.path} is a directory; give a file, e.g. sqlite:///{self.path}/queue.db")
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as err:
            raise UserError(f"cannot create the queue directory {self.path.parent}: {err.strerror}") from err
        self._lock = threading.RLock()
        try:
            self._db = sqlite3.connect(
                str(self.path), timeout=BUSY_TIMEOUT_S, isolation_level=None, check_same_thread=False
            )
            self._db.row_factory = sqlite3.Row
            self._db.execute(f"PRAGMA busy_timeout = {int(BUSY_TIMEOUT_S * 1000)}")
            self._db.execute("PRAGMA journal_mode = WAL")
            # FULL: a requeue that was acknowledged must survive a power cut, not only a process crash.
            self._db.execute("PRAGMA synchronous = FULL")
            self._db.execute("PRAGMA foreign_keys = ON")
            with self._tx() as db:
                for statement in _SCHEMA.split(";"):
                    if statement.strip():
                        db.execute(statement)
                row = db.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
                if row is None:
                    db.execute("INSERT INTO meta VALUES ('schema_version', ?)", (str(SCHEMA_VERSION),))
                elif int(row["value"]) != SCHEMA_VERSION:
                    raise UserError(
                        f"queue {self.uri} has schema version {row['value']}; this gpucloud reads version {SCHEMA_VERSION}"
                    )
        except sqlite3.DatabaseError as err:
            raise UserError(
                f"queue {self.uri} is not a usable SQLite database ({err}); move it away or pick another --queue"
            ) from err

    # -- plumbing ---------------------------------------------------------------------------

    @contextmanager
    def _tx(self) -> Iterator[sqlite3.Connection]:
        """One write transaction; BEGIN IMMEDIATE takes the write lock up front so the reads that
        decide a conditional update cannot go stale before the update."""
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                yield self._db
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            else:
                self._db.execute("COMMIT")

    def _read(self, sql: str, args: tuple[Any, ...] = ()) -> list[sqlite3.Row]:
        with self._lock:
            return self._db.execute(sql, args).fetchall()

    def close(self) -> None:
        with self._lock:
            self._db.close()

    # -- jobs -------------------------------------------------------------------------------

    def submit(self, spec: JobSpec, *, job_id: str | None = None) -> Job:
        job_id = validate_job_id(job_id) if job_id is not None else _new_job_id()
        now = time.time()
        with self._tx() as db:
            if db.execute("SELECT 1 FROM jobs WHERE id = ?", (job_id,)).fetchone():
                raise UserError(f"job {job_id!r} already exists in {self.uri}; pick another --job-id")
            db.execute(
                "INSERT INTO jobs (id, spec, state, attempt, created_at, updated_at) VALUES (?, ?, ?, 1, ?, ?)",
                (job_id, spec.model_dump_json(), JobState.QUEUED.value, now, now),
            )
            db.execute(
                "INSERT INTO attempts (job_id, number, state, created_at) VALUES (?, 1, ?, ?)",
                (job_id, AttemptState.QUEUED.value, now),
            )
            _insert_event(db, job_id, 1, "submitted", now, {"command": spec.command})
        return self.get(job_id)

    def get(self, job_id: str) -> Job:
        rows = self._read("SELECT * FROM jobs WHERE id = ?", (job_id,))
        if not rows:
            raise UnknownJob(job_id, self.uri)
        return _job(rows[0])

    def list_jobs(self, states: Iterable[JobState] | None = None) -> list[Job]:
        if states is None:
            rows = self._read("SELECT * FROM jobs ORDER BY created_at, id")
        else:
            wanted = [JobState(s).value for s in states]
            marks = ", ".join("?" for _ in wanted)
            rows = self._read(f"SELECT * FROM jobs WHERE state IN ({marks}) ORDER BY created_at, id", tuple(wanted))
        return [_job(r) for r in rows]

    # -- claiming and leases ----------------------------------------------------------------

    def claim(
        self,
        worker: str,
        *,
        lease_seconds: float,
        job_id: str | None = None,
        node: str | None = None,
        attempt: int | None = None,
    ) -> Job | None:
        now = time.time()
        with self._tx() as db:
            claimable = "(state = 'queued' OR (state = 'running' AND lease_until < ?))"
            if attempt is not None:
                if job_id is None:
                    raise ValueError("claim(attempt=...) needs job_id")
                row = db.execute(
                    "SELECT * FROM jobs WHERE id = ? AND state = 'queued' AND attempt = ?", (job_id, attempt)
                ).fetchone()
            elif job_id is None:
                # Single-node jobs only, and none an agent runs as a gang (see JobQueue.claim).
                row = db.execute(
                    f"SELECT * FROM jobs WHERE {claimable} AND COALESCE(json_extract(spec, '$.nodes'), 1) = 1 "
                    "AND (worker IS NULL OR worker NOT LIKE ?) ORDER BY created_at, id LIMIT 1",
                    (now, f"{GANG_WORKER_PREFIX}%"),
                ).fetchone()
            else:
                row = db.execute(f"SELECT * FROM jobs WHERE id = ? AND {claimable}", (job_id, now)).fetchone()
            if row is None:
                return None
            job = _job(row)
            number = job.attempt
            if job.state is JobState.RUNNING:
                # The previous holder stopped renewing its lease: its attempt is lost, ours is k+1.
                db.execute(
                    "UPDATE attempts SET state = ?, ended_at = ?, reason = ? WHERE job_id = ? AND number = ?",
                    (AttemptState.LOST.value, now, f"lease of worker {job.worker} expired", job.id, number),
                )
                _insert_event(db, job.id, number, "lease-expired", now, {"worker": job.worker})
                number += 1
                db.execute(
                    "INSERT INTO attempts (job_id, number, state, created_at) VALUES (?, ?, ?, ?)",
                    (job.id, number, AttemptState.QUEUED.value, now),
                )
            updated = db.execute(
                "UPDATE jobs SET state = 'running', attempt = ?, worker = ?, lease_until = ?, updated_at = ? "
                "WHERE id = ? AND attempt = ? AND state = ?",
                (number, worker, now + lease_seconds, now, job.id, job.attempt, job.state.value),
            ).rowcount
            if updated != 1:  # cannot happen under the write lock; kept as the invariant's guard
                raise RuntimeError(f"claim of job {job.id} lost a race it cannot lose under BEGIN IMMEDIATE")
            db.execute(
                "UPDATE attempts SET state = 'running', worker = ?, node = ? WHERE job_id = ? AND number = ?",
                (worker, node, job.id, number),
            )
            _insert_event(db, job.id, number, "claimed", now, {"worker": worker, "node": node})
        return self.get(job.id)

    def heartbeat(self, job_id: str, attempt: int, worker: str, *, lease_seconds: float) -> bool:
        now = time.time()
        with self._tx() as db:
            return (
                db.execute(
                    "UPDATE jobs SET lease_until = ?, updated_at = ? "
                    "WHERE id = ? AND attempt = ? AND worker = ? AND state = 'running'",
                    (now + lease_seconds, now, job_id, attempt, worker),
                ).rowcount
                == 1
            )

    # -- the timeline -----------------------------------------------------------------------

    def record(
        self, job_id: str, attempt: int, kind: str, *, at: float | None = None, data: dict[str, Any] | None = None
    ) -> None:
        with self._tx() as db:
            if not db.execute("SELECT 1 FROM jobs WHERE id = ?", (job_id,)).fetchone():
                raise UnknownJob(job_id, self.uri)
            _insert_event(db, job_id, attempt, kind, time.time() if at is None else at, data or {})

    def update_attempt(self, job_id: str, attempt: int, **fields: Any) -> None:
        unknown = set(fields) - set(_ATTEMPT_FIELDS)
        if unknown:
            raise ValueError(f"update_attempt cannot set {sorted(unknown)}; allowed: {', '.join(_ATTEMPT_FIELDS)}")
        if not fields:
            return
        assignments = ", ".join(f"{name} = ?" for name in fields)
        with self._tx() as db:
            db.execute(
                f"UPDATE attempts SET {assignments} WHERE job_id = ? AND number = ?",
                (*fields.values(), job_id, attempt),
            )

    def end_attempt(self, job_id: str, attempt: int, end: AttemptEnd) -> Transition:
        now = time.time()
        with self._tx() as db:
            row = db.execute("SELECT * FROM jobs WHERE id = ?", (job_id,)).fetchone()
            if row is None:
                raise UnknownJob(job_id, self.uri)
            job = _job(row)
            if job.state is not JobState.RUNNING or job.attempt != attempt:
                return Transition(job=job, applied=False)  # already ended, or superseded by a takeover
            # The conditional update is the exactly-once gate: only the call that moves the attempt
            # row out of 'running' proceeds; every duplicate sees rowcount 0.
            ended = db.execute(
                "UPDATE attempts SET state = ?, ended_at = ?, exit_code = ?, last_step = COALESCE(?, last_step), "
                "committed_step = ?, resumed_step = COALESCE(?, resumed_step), reason = ? "
                "WHERE job_id = ? AND number = ? AND state = 'running'",
                (
                    end.state.value,
                    now,
                    end.exit_code,
                    end.last_step,
                    end.committed_step,
                    end.resumed_step,
                    end.reason,
                    job_id,
                    attempt,
                ),
            ).rowcount
            if ended != 1:
                return Transition(job=job, applied=False)
            crashes = job.crashes + (1 if end.state is AttemptState.CRASHED else 0)
            if end.state in (AttemptState.REQUEUED, AttemptState.CRASHED) and crashes < job.spec.max_attempts:
                next_attempt = attempt + 1
                db.execute(
                    "INSERT INTO attempts (job_id, number, state, created_at) VALUES (?, ?, ?, ?)",
                    (job_id, next_attempt, AttemptState.QUEUED.value, now),
                )
                db.execute(
                    "UPDATE jobs SET state = 'queued', attempt = ?, crashes = ?, worker = NULL, lease_until = NULL, "
                    "updated_at = ? WHERE id = ?",
                    (next_attempt, crashes, now, job_id),
                )
                _insert_event(
                    db,
                    job_id,
                    attempt,
                    "requeue",
                    now,
                    {"next_attempt": next_attempt, "reason": end.reason, "from_step": end.resume_from},
                )
            elif end.state is AttemptState.FINISHED:
                db.execute(
                    "UPDATE jobs SET state = 'finished', exit_code = ?, worker = NULL, lease_until = NULL, "
                    "updated_at = ? WHERE id = ?",
                    (end.exit_code, now, job_id),
                )
                _insert_event(db, job_id, attempt, "finish", now, {"step": end.last_step})
            else:
                reason = end.reason or "failed"
                if end.state is AttemptState.CRASHED:
                    reason = (
                        f"{reason} (attempt {attempt}; {crashes} of {job.spec.max_attempts} allowed attempts crashed)"
                    )
                    db.execute(
                        "UPDATE attempts SET state = 'failed' WHERE job_id = ? AND number = ?", (job_id, attempt)
                    )
                db.execute(
                    "UPDATE jobs SET state = 'failed', crashes = ?, reason = ?, exit_code = ?, worker = NULL, "
                    "lease_until = NULL, updated_at = ? WHERE id = ?",
                    (crashes, reason, end.exit_code, now, job_id),
                )
                _insert_event(db, job_id, attempt, "failed", now, {"reason": reason, "exit_code": end.exit_code})
        return Transition(job=self.get(job_id), applied=True)

    # -- reading ----------------------------------------------------------------------------

    def attempts(self, job_id: str) -> list[Attempt]:
        self.get(job_id)
        rows = self._read("SELECT * FROM attempts WHERE job_id = ? ORDER BY number", (job_id,))
        return [Attempt(**dict(r)) for r in rows]

    def events(self, job_id: str) -> list[Event]:
        self.get(job_id)
        rows = self._read(
            "SELECT job_id, attempt, kind, at, data FROM events WHERE job_id = ? ORDER BY at, seq", (job_id,)
        )
        return [
            Event(job_id=r["job_id"], attempt=r["attempt"], kind=r["kind"], at=r["at"], data=json.loads(r["data"]))
            for r in rows
        ]

    # -- gang slots and node records (GangStore) -----------------------------------------------

    def slot_offers(self, *, hide_seconds: float, now: float | None = None) -> list[SlotOffer]:
        """Read from the table (no messages here): the slots of running gang attempts whose holder
        stopped renewing, then the free slots of queued attempts, oldest job first."""
        at = time.time() if now is None else now
        with self._tx() as db:
            jobs = db.execute(
                "SELECT id, attempt, state, worker, spec FROM jobs WHERE state IN (?, ?) ORDER BY created_at, id",
                (JobState.QUEUED.value, JobState.RUNNING.value),
            ).fetchall()
            held = db.execute(
                "SELECT s.job_id, s.slot FROM gang_slots s JOIN jobs j ON j.id = s.job_id AND j.attempt = s.attempt "
                "WHERE s.lease_until >= ?",
                (at,),
            ).fetchall()
        live = {(r["job_id"], r["slot"]) for r in held}
        lost: list[SlotOffer] = []
        free: list[SlotOffer] = []
        for job in jobs:
            nodes = int(json.loads(job["spec"]).get("nodes", 1))
            open_slots = [s for s in range(nodes) if (job["id"], s) not in live]
            if job["state"] == JobState.QUEUED.value:
                free += [SlotOffer(job_id=job["id"], attempt=job["attempt"], slot=s) for s in open_slots]
            elif job["worker"] == gang_worker(job["id"], job["attempt"]) and open_slots:
                lost.append(SlotOffer(job_id=job["id"], attempt=job["attempt"], slot=open_slots[0], lost=True))
        return lost + free

    def offer_done(self, offer: SlotOffer) -> None:
        return None  # nothing carries an offer here: the table is the whole story

    def offer_back(self, offer: SlotOffer, *, delay_seconds: float = 0.0) -> None:
        return None

    def take_slot(self, claim: SlotClaim, *, now: float, offer: SlotOffer | None = None) -> bool:
        with self._tx() as db:
            if not _queued_at(db, claim.job_id, claim.attempt):
                return False
            row = db.execute(
                "SELECT worker, lease_until FROM gang_slots WHERE job_id = ? AND attempt = ? AND slot = ?",
                (claim.job_id, claim.attempt, claim.slot),
            ).fetchone()
            if row is not None and row["worker"] != claim.worker and row["lease_until"] >= now:
                return False
            db.execute(
                "INSERT OR REPLACE INTO gang_slots (job_id, attempt, slot, worker, address, lease_until) "
                "VALUES (?, ?, ?, ?, ?, ?)",
                (claim.job_id, claim.attempt, claim.slot, claim.worker, claim.address, claim.lease_until),
            )
            return True

    def renew_slot(self, job_id: str, attempt: int, slot: int, worker: str, *, lease_until: float) -> bool:
        with self._tx() as db:
            return (
                db.execute(
                    "UPDATE gang_slots SET lease_until = ? WHERE job_id = ? AND attempt = ? AND slot = ? AND worker = ?",
                    (lease_until, job_id, attempt, slot, worker),
                ).rowcount
                == 1
            )

    def release_slot(self, job_id: str, attempt: int, slot: int, worker: str) -> bool:
        with self._tx() as db:
            if not _queued_at(db, job_id, attempt):
                return False
            return (
                db.execute(
                    "DELETE FROM gang_slots WHERE job_id = ? AND attempt = ? AND slot = ? AND worker = ?",
                    (job_id, attempt, slot, worker),
                ).rowcount
                == 1
            )

    def slot_claims(self, job_id: str, attempt: int) -> list[SlotClaim]:
        rows = self._read("SELECT * FROM gang_slots WHERE job_id = ? AND attempt = ? ORDER BY slot", (job_id, attempt))
        return [SlotClaim(**dict(r)) for r in rows]

    def register_node(self, node: NodeRecord) -> None:
        with self._tx() as db:
            db.execute("INSERT OR REPLACE INTO nodes (id, record) VALUES (?, ?)", (node.id, node.model_dump_json()))

    def nodes(self) -> list[NodeRecord]:
        rows = self._read("SELECT id, record FROM nodes ORDER BY id")
        records = []
        for row in rows:
            try:
                records.append(NodeRecord.model_validate_json(row["record"]))
            except ValidationError as err:
                raise UserError(
                    f"node record {row['id']!r} in {self.uri} is unreadable ({err.errors()[0]['msg']}); it was not written by gpucloud"
                ) from err
        return records

    # -- stop requests ----------------------------------------------------------------------------

    def request_stop(self, job_id: str, attempt: int, notice: Notice) -> bool:
        request = StopRequest.of(notice, requested_at=time.time())
        with self._tx() as db:
            row = db.execute("SELECT state, attempt FROM jobs WHERE id = ?", (job_id,)).fetchone()
            if row is None:
                raise UnknownJob(job_id, self.uri)
            if row["state"] != JobState.RUNNING.value or row["attempt"] != attempt:
                return False
            # The primary key (job_id, attempt) makes the first request the only one.
            if (
                db.execute(
                    "INSERT OR IGNORE INTO stop_requests (job_id, attempt, request) VALUES (?, ?, ?)",
                    (job_id, attempt, request.model_dump_json()),
                ).rowcount
                != 1
            ):
                return False
            _insert_event(db, job_id, attempt, "stop-request", request.requested_at, request.timeline_data())
        return True

    def stop_request(self, job_id: str, attempt: int) -> Notice | None:
        rows = self._read("SELECT request FROM stop_requests WHERE job_id = ? AND attempt = ?", (job_id, attempt))
        if not rows:
            return None
        try:
            return StopRequest.model_validate_json(rows[0]["request"]).notice()
        except ValidationError as err:
            first = err.errors()[0]
            raise UserError(
                f"the stop request of job {job_id!r} attempt {attempt} in {self.uri} is unreadable "
                f"({'.'.join(str(p) for p in first['loc']) or 'request'}: {first['msg']}); it was not written by gpucloud"
            ) from err


def _queued_at(db: sqlite3.Connection, job_id: str, attempt: int) -> bool:
    return (
        db.execute("SELECT 1 FROM jobs WHERE id = ? AND state = 'queued' AND attempt = ?", (job_id, attempt)).fetchone()
        is not None
    )


def _insert_event(
    db: sqlite3.Connection, job_id: str, attempt: int, kind: str, at: float, data: dict[str, Any]
) -> None:
    if kind not in EVENT_KINDS:
        raise ValueError(f"unknown timeline event {kind!r}; expected one of {', '.join(EVENT_KINDS)}")
    db.execute(
        "INSERT INTO events (job_id, attempt, kind, at, data) VALUES (?, ?, ?, ?, ?)",
        (job_id, attempt, kind, at, json.dumps(data, default=str)),
    )


def _job(row: sqlite3.Row) -> Job:
    fields = dict(row)
    try:
        fields["spec"] = JobSpec.model_validate_json(fields["spec"])
        return Job(**fields)
    except ValidationError as err:
        first = err.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "spec"
        raise UserError(
            f"job {fields['id']!r} in the queue is unreadable ({where}: {first['msg']}); it was not written by gpucloud"
        ) from err


def _new_job_id() -> str:
    return f"j-{uuid.uuid4().hex[:10]}"
