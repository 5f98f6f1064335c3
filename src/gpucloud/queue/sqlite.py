"""The embedded job queue: one SQLite file (WAL), safe across threads and processes on one host.

Every state change is one ``BEGIN IMMEDIATE`` transaction (the database's write lock). What a
request changes is decided by ``gpucloud.lifecycle.transitions``; this module only stores the
change, as updates guarded by the change's conditions and checked by their row count, backed by
the ``attempts`` primary key (job_id, number): a second attempt k+1 cannot exist even if a bug
skipped the condition.
"""

from __future__ import annotations

import enum
import json
import logging
import sqlite3
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

from pydantic import ValidationError

from gpucloud.checkpoint.layout import validate_job_id
from gpucloud.errors import UserError
from gpucloud.lifecycle import transitions
from gpucloud.lifecycle.model import (
    CANCEL_GRACE_S,
    EVENT_KINDS,
    Attempt,
    AttemptEnd,
    AttemptState,
    Event,
    Job,
    JobSpec,
    JobState,
    NodeRecord,
    Progress,
    SlotClaim,
    SlotOffer,
    StopRequest,
)
from gpucloud.lifecycle.transitions import Change, Refusal
from gpucloud.payload import parse_json
from gpucloud.queue.gang import GANG_WORKER_PREFIX, gang_worker
from gpucloud.queue.protocol import NotCancellable, NotResumable, Transition, UnknownJob
from gpucloud.signals.events import Notice

log = logging.getLogger(__name__)
T = TypeVar("T")

SCHEMA_VERSION = 1
BUSY_TIMEOUT_S = 30.0  # SQLite's own wait for the write lock, per try
LOCK_BACKOFF_S = (0.05, 2.0)  # between tries of a locked queue: first and longest pause
_ROW_PROBLEMS = ("CHECK constraint failed", "NULL value in")  # quick_check's findings about single rows
_TABLES = ("meta", "jobs", "attempts", "events", "gang_slots", "nodes", "stop_requests")

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
    exit_code INTEGER,
    cancel_requested_at REAL,
    last_step INTEGER,
    step_rate REAL,
    progress_at REAL
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
-- One stop request per attempt (JobQueue.request_stop).
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

    def __init__(
        self,
        path: str | Path,
        *,
        uri: str | None = None,
        busy_timeout_s: float = BUSY_TIMEOUT_S,
        lock_patience_s: float | None = BUSY_TIMEOUT_S,
        clock: Callable[[], float] = time.time,
    ) -> None:
        """``busy_timeout_s``: SQLite's wait for another writer's lock, per try. ``lock_patience_s``:
        how long a write keeps trying (with backoff) before ``QueueBusy``; None: for ever — a
        worker or agent holding a running attempt must outwait a stuck writer, never die of it.
        ``clock``: the time leases, timeline events and transitions are judged and stamped with."""
        self.path = Path(path)
        self.clock = clock
        self.uri = uri or f"sqlite:///{self.path}"
        self.lock_patience_s = lock_patience_s
        self._unreadable: set[tuple[str, str]] = set()  # rows already reported, so each costs one line
        if self.path.is_dir():
            raise UserError(f"queue path {self.path} is a directory; give a file, e.g. sqlite:///{self.path}/queue.db")
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as err:
            raise UserError(f"cannot create the queue directory {self.path.parent}: {err.strerror}") from err
        self._lock = threading.RLock()
        try:
            self._db = sqlite3.connect(
                str(self.path), timeout=busy_timeout_s, isolation_level=None, check_same_thread=False
            )
            self._db.row_factory = sqlite3.Row
            self._db.execute(f"PRAGMA busy_timeout = {int(busy_timeout_s * 1000)}")
            self._retrying(lambda: self._db.execute("PRAGMA journal_mode = WAL"))
            # FULL: a requeue that was acknowledged must survive a power cut, not only a process crash.
            self._db.execute("PRAGMA synchronous = FULL")
            self._db.execute("PRAGMA foreign_keys = ON")
            self._check_pages()
            self._open_schema()
        except sqlite3.DatabaseError as err:
            raise self._unusable(err) from err

    # -- plumbing ---------------------------------------------------------------------------

    def _open_schema(self) -> None:
        """Create the tables in a new file (a write), or only read and check them when they exist:
        WAL readers never wait for a writer, so `gpucloud jobs` behind a busy worker answers at once."""
        present = {r["name"] for r in self._read("SELECT name FROM sqlite_master WHERE type = 'table'")}
        if "meta" not in present or not self._read("SELECT 1 FROM meta WHERE key = 'schema_version'"):
            with self._tx() as db:
                for statement in _SCHEMA.split(";"):
                    if statement.strip():
                        db.execute(statement)
                db.execute("INSERT OR IGNORE INTO meta VALUES ('schema_version', ?)", (str(SCHEMA_VERSION),))
        [row] = self._read("SELECT value FROM meta WHERE key = 'schema_version'")
        if str(row["value"]) != str(SCHEMA_VERSION):
            raise UserError(
                f"queue {self.uri} has schema version {str(row['value'])[:40]!r}; this gpucloud reads version "
                f"{SCHEMA_VERSION} (a newer gpucloud wrote it, or another program did)"
            )
        missing = _missing_columns({t: self._columns(t) for t in _TABLES})
        if missing:
            raise UserError(
                f"queue {self.uri} has version {SCHEMA_VERSION} but lacks {missing} (written by a development "
                "build of gpucloud, or by another program); move it away or pick another --queue"
            )

    def _columns(self, table: str) -> set[str]:
        return {str(r["name"]) for r in self._read(f"SELECT name FROM pragma_table_info('{table}')")}

    def _check_pages(self) -> None:
        """Refuse a damaged file at open rather than fail in the middle of a command:
        ``quick_check`` reads every page (cheap for a queue) without comparing indexes to tables.
        A row that breaks a CHECK or NOT NULL constraint is not damage to the file: that row alone
        is skipped when read (``_readable_rows``), the rest of the queue still works."""
        found = self._retrying(lambda: self._db.execute("PRAGMA quick_check(100)").fetchall())
        problems = [str(r[0]) for r in found if not str(r[0]).startswith(_ROW_PROBLEMS)]
        if problems and problems != ["ok"]:
            raise sqlite3.DatabaseError(f"quick_check: {'; '.join(problems)}")

    def _unusable(self, err: sqlite3.DatabaseError) -> UserError:
        if _is_locked(err):
            return QueueBusy(self.uri, self.lock_patience_s)
        return UserError(
            f"queue {self.uri} is not a usable SQLite database ({_one_line(str(err))}); move it away or pick another --queue"
        )

    def _retrying(self, operation: Callable[[], T]) -> T:
        """``operation`` retried with backoff while another process holds the write lock (each try
        already waited ``busy_timeout``), for ``lock_patience_s`` in all (None: for ever)."""
        started = time.monotonic()
        pause = LOCK_BACKOFF_S[0]
        told = False
        while True:
            try:
                return operation()
            except sqlite3.OperationalError as err:
                if not _is_locked(err):
                    raise
                waited = time.monotonic() - started
                if self.lock_patience_s is not None and waited >= self.lock_patience_s:
                    raise QueueBusy(self.uri, self.lock_patience_s) from err
                if not told:  # one line per wait, not one per try
                    told = True
                    log.warning("queue %s is busy: another process holds its write lock; waiting for it", self.uri)
            time.sleep(pause)  # not a synchronisation: a pause between tries of a lock held elsewhere
            pause = min(pause * 2, LOCK_BACKOFF_S[1])

    @contextmanager
    def _tx(self) -> Iterator[sqlite3.Connection]:
        """One write transaction; BEGIN IMMEDIATE takes the write lock up front so the reads that
        decide a conditional update cannot go stale before the update. A lock held elsewhere is
        waited for (``_retrying``); a damaged file is a ``UserError``, never a traceback."""
        with self._lock:
            try:
                self._retrying(lambda: self._db.execute("BEGIN IMMEDIATE"))
            except sqlite3.DatabaseError as err:
                raise self._unusable(err) from err
            try:
                yield self._db
            except BaseException as failure:
                self._db.execute("ROLLBACK")
                if isinstance(failure, sqlite3.DatabaseError):
                    raise self._unusable(failure) from failure
                raise
            else:
                try:
                    self._db.execute("COMMIT")
                except sqlite3.DatabaseError as err:
                    if self._db.in_transaction:
                        self._db.execute("ROLLBACK")
                    raise self._unusable(err) from err

    def _read(self, sql: str, args: tuple[Any, ...] = ()) -> list[sqlite3.Row]:
        with self._lock:
            try:
                return self._retrying(lambda: self._db.execute(sql, args).fetchall())
            except sqlite3.DatabaseError as err:
                raise self._unusable(err) from err

    def _readable_rows(self, rows: Iterable[sqlite3.Row]) -> Iterator[tuple[sqlite3.Row, Job]]:
        """(row, job) for each row of ``rows`` that can be read; each unreadable one is skipped with
        one log line (once per queue connection), so one bad row never hides or blocks the rest."""
        for row in rows:
            try:
                yield row, _job(row)
            except UserError as problem:
                self._report_unreadable("job", str(row["id"]), str(problem))

    def _readable_jobs(self, rows: Iterable[sqlite3.Row]) -> list[Job]:
        return [job for _, job in self._readable_rows(rows)]

    def _report_unreadable(
        self, what: str, job_id: str, problem: str, outcome: str = "skipped, the rest of the queue goes on"
    ) -> None:
        if (what, job_id) not in self._unreadable:
            self._unreadable.add((what, job_id))
            where = "" if what == "job" else f"{what} of job {job_id[:100]!r}: "
            log.warning("%s%s; %s", where, problem, outcome)

    def close(self) -> None:
        with self._lock:
            self._db.close()

    # -- jobs -------------------------------------------------------------------------------

    def submit(self, spec: JobSpec, *, job_id: str | None = None) -> Job:
        job_id = validate_job_id(job_id) if job_id is not None else _new_job_id()
        job, change = transitions.submit(job_id, spec, self.clock())
        with self._tx() as db:
            if db.execute("SELECT 1 FROM jobs WHERE id = ?", (job_id,)).fetchone():
                raise UserError(f"job {job_id!r} already exists in {self.uri}; pick another --job-id")
            db.execute(
                "INSERT INTO jobs (id, spec, state, attempt, created_at, updated_at) VALUES (?, ?, ?, ?, ?, ?)",
                (job_id, spec.model_dump_json(), job.state.value, job.attempt, job.created_at, job.updated_at),
            )
            _store(db, job_id, change)
        return self.get(job_id)

    def _job_in(self, db: sqlite3.Connection, job_id: str) -> Job:
        """The job as this transaction sees it."""
        row = db.execute("SELECT * FROM jobs WHERE id = ?", (job_id,)).fetchone()
        if row is None:
            raise UnknownJob(job_id, self.uri)
        return _job(row)

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
        return self._readable_jobs(rows)

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
        now = self.clock()
        with self._tx() as db:
            claimable = "(state = 'queued' OR (state = 'running' AND lease_until < ?))"
            if attempt is not None:
                if job_id is None:
                    raise ValueError("claim(attempt=...) needs job_id")
                rows = db.execute(
                    "SELECT * FROM jobs WHERE id = ? AND state = 'queued' AND attempt = ?", (job_id, attempt)
                ).fetchall()
            elif job_id is None:
                # Single-node jobs only, and none an agent runs as a gang (see JobQueue.claim). The
                # spec is read here, not by json_extract: one unreadable row must not fail the query.
                rows = db.execute(
                    f"SELECT * FROM jobs WHERE {claimable} AND (worker IS NULL OR worker NOT LIKE ?) "
                    "ORDER BY created_at, id",
                    (now, f"{GANG_WORKER_PREFIX}%"),
                ).fetchall()
            else:
                rows = db.execute(f"SELECT * FROM jobs WHERE id = ? AND {claimable}", (job_id, now)).fetchall()
            for job in self._readable_jobs(rows):
                if job_id is None and job.spec.nodes != 1 and not job.cancel_requested_at:
                    continue
                change = transitions.claim(
                    job, worker, lease_seconds=lease_seconds, node=node, now=now, attempt=attempt
                )
                if isinstance(change, Refusal):
                    continue
                # A savepoint per candidate: a row whose claim breaks a constraint (damaged outside
                # gpucloud) is skipped, and the next job is claimed in the same transaction.
                db.execute("SAVEPOINT claim_one")
                try:
                    if not _store(db, job.id, change):  # under the write lock: a row gpucloud did not write so
                        raise UnreadableRow(
                            f"its attempt {job.attempt} and state {job.state.value} do not match what is stored"
                        )
                except (sqlite3.IntegrityError, UnreadableRow) as err:
                    db.execute("ROLLBACK TO claim_one")
                    db.execute("RELEASE claim_one")
                    problem = f"job {job.id[:100]!r} in the queue cannot be claimed ({_one_line(str(err))})"
                    if job_id is not None:
                        raise UserError(f"{problem}; it was not written by gpucloud") from err
                    self._report_unreadable("job", job.id, problem)
                    continue
                db.execute("RELEASE claim_one")
                if change.outcome.claims:
                    break
            else:
                return None
        return self.get(job.id)

    def heartbeat(
        self, job_id: str, attempt: int, worker: str, *, lease_seconds: float, progress: Progress | None = None
    ) -> bool:
        change = transitions.heartbeat(
            attempt, worker, lease_seconds=lease_seconds, now=self.clock(), progress=progress
        )
        with self._tx() as db:
            return _store(db, job_id, change)

    # -- the timeline -----------------------------------------------------------------------

    def record(
        self, job_id: str, attempt: int, kind: str, *, at: float | None = None, data: dict[str, Any] | None = None
    ) -> None:
        with self._tx() as db:
            if not db.execute("SELECT 1 FROM jobs WHERE id = ?", (job_id,)).fetchone():
                raise UnknownJob(job_id, self.uri)
            _insert_event(db, job_id, attempt, kind, self.clock() if at is None else at, data or {})

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
        with self._tx() as db:
            job = self._job_in(db, job_id)
            change = transitions.end(job, attempt, end, self.clock())
            # The guarded updates are the exactly-once gate: only the call that moves the attempt
            # row out of 'running' proceeds; every duplicate is refused or sees rowcount 0.
            if isinstance(change, Refusal) or not _store(db, job_id, change):
                return Transition(job=job, applied=False)  # already ended, or superseded by a takeover
        return Transition(job=self.get(job_id), applied=True)

    # -- reading ----------------------------------------------------------------------------

    def attempts(self, job_id: str) -> list[Attempt]:
        self.get(job_id)
        rows = self._read("SELECT * FROM attempts WHERE job_id = ? ORDER BY number", (job_id,))
        attempts = []
        for row in rows:
            try:
                attempts.append(Attempt(**dict(row)))
            except ValidationError as err:
                self._report_unreadable(f"attempt {row['number']!r}", job_id, _first_problem(err, "attempt"))
        return attempts

    def events(self, job_id: str) -> list[Event]:
        self.get(job_id)
        rows = self._read(
            "SELECT job_id, attempt, kind, at, data FROM events WHERE job_id = ? ORDER BY at, seq", (job_id,)
        )
        events = []
        for row in rows:
            name = f"timeline event {str(row['kind'])[:40]!r} of attempt {row['attempt']!r}"
            fields = {"job_id": row["job_id"], "attempt": row["attempt"], "kind": row["kind"], "at": row["at"]}
            try:
                events.append(Event(**fields, data=parse_json(row["data"], "its data", UnreadableRow)))
            except UnreadableRow as problem:  # the event still happened: keep it, without its details
                self._report_unreadable(name, job_id, str(problem), "shown without its data")
                events.append(Event(**fields))
            except (ValidationError, TypeError) as err:
                why = _first_problem(err, "event") if isinstance(err, ValidationError) else str(err)
                self._report_unreadable(name, job_id, why)
        return events

    def histories_since(self, since: float, *, chunk: int = 500) -> Iterator[tuple[Job, list[Attempt], list[Event]]]:
        """Every job that was not over before ``since`` (not terminal, or updated since), with its
        attempts and timeline, ``chunk`` jobs per three reads (``gpucloud report``: ``attempts``
        and ``events`` per job would be four reads a job, 40,000 for 10,000 jobs), oldest first.
        A generator, so a month of jobs is never all in memory; each chunk is read as it is then
        (no snapshot across chunks). Unreadable rows are skipped as elsewhere."""
        active = "SELECT id FROM jobs WHERE state IN ('queued', 'running') OR updated_at >= ? ORDER BY created_at, id"
        ids = [str(row["id"]) for row in self._read(active, (since,))]
        for first in range(0, len(ids), chunk):
            part = tuple(ids[first : first + chunk])
            marks = ", ".join("?" * len(part))
            jobs = self._readable_jobs(self._read(f"SELECT * FROM jobs WHERE id IN ({marks})", part))
            attempts: dict[str, list[Attempt]] = {job_id: [] for job_id in part}
            for row in self._read(f"SELECT * FROM attempts WHERE job_id IN ({marks}) ORDER BY job_id, number", part):
                try:
                    attempts[row["job_id"]].append(Attempt(**dict(row)))
                except ValidationError as err:
                    self._report_unreadable(
                        f"attempt {row['number']!r}", str(row["job_id"]), _first_problem(err, "attempt")
                    )
            events: dict[str, list[Event]] = {job_id: [] for job_id in part}
            sql = f"SELECT job_id, attempt, kind, at, data FROM events WHERE job_id IN ({marks}) ORDER BY at, seq"
            for row in self._read(sql, part):
                try:
                    data = parse_json(row["data"], "its data", UnreadableRow)
                except UnreadableRow:
                    data = {}  # the event still happened: keep it, without its details
                try:
                    events[row["job_id"]].append(
                        Event(job_id=row["job_id"], attempt=row["attempt"], kind=row["kind"], at=row["at"], data=data)
                    )
                except (ValidationError, TypeError) as err:
                    why = _first_problem(err, "event") if isinstance(err, ValidationError) else str(err)
                    self._report_unreadable(f"timeline event {str(row['kind'])[:40]!r}", str(row["job_id"]), why)
            by_id = {job.id: job for job in jobs}
            for job_id in part:
                if job_id in by_id:
                    yield by_id[job_id], attempts[job_id], events[job_id]

    def histories(self, states: Iterable[JobState] | None = None) -> list[tuple[Job, list[Attempt], list[Event]]]:
        """Three reads in one read transaction (WAL: one snapshot, never waiting for a writer), so
        a job's attempts and events are those of the job as listed, however many jobs there are."""
        where = ""
        args: tuple[str, ...] = ()
        if states is not None:
            wanted = tuple(JobState(s).value for s in states)
            where, args = f"WHERE state IN ({', '.join('?' for _ in wanted)})", wanted
        listed = f"SELECT id FROM jobs {where}"
        statements = (
            f"SELECT * FROM jobs {where} ORDER BY created_at, id",
            f"SELECT * FROM attempts WHERE job_id IN ({listed}) ORDER BY job_id, number",
            f"SELECT job_id, attempt, kind, at, data FROM events WHERE job_id IN ({listed}) ORDER BY at, seq",
        )

        def snapshot() -> list[list[sqlite3.Row]]:
            self._db.execute("BEGIN")
            try:
                return [self._db.execute(sql, args).fetchall() for sql in statements]
            finally:
                self._db.execute("COMMIT")

        with self._lock:
            try:
                job_rows, attempt_rows, event_rows = self._retrying(snapshot)
            except sqlite3.DatabaseError as err:
                raise self._unusable(err) from err
        jobs = self._readable_jobs(job_rows)
        attempts: dict[str, list[Attempt]] = {job.id: [] for job in jobs}
        for row in attempt_rows:
            try:
                attempts.setdefault(row["job_id"], []).append(Attempt(**dict(row)))
            except ValidationError as err:
                self._report_unreadable(
                    f"attempt {row['number']!r}", str(row["job_id"]), _first_problem(err, "attempt")
                )
        events: dict[str, list[Event]] = {job.id: [] for job in jobs}
        for row in event_rows:
            name = f"timeline event {str(row['kind'])[:40]!r} of attempt {row['attempt']!r}"
            fields = {"job_id": row["job_id"], "attempt": row["attempt"], "kind": row["kind"], "at": row["at"]}
            try:
                event = Event(**fields, data=parse_json(row["data"], "its data", UnreadableRow))
            except UnreadableRow as problem:  # the event still happened: keep it, without its details
                self._report_unreadable(name, str(row["job_id"]), str(problem), "shown without its data")
                event = Event(**fields)
            except (ValidationError, TypeError) as err:
                why = _first_problem(err, "event") if isinstance(err, ValidationError) else str(err)
                self._report_unreadable(name, str(row["job_id"]), why)
                continue
            events.setdefault(row["job_id"], []).append(event)
        return [(job, attempts[job.id], events[job.id]) for job in jobs]

    # -- gang slots and node records (GangStore) -----------------------------------------------

    def slot_offers(self, *, hide_seconds: float, now: float | None = None) -> list[SlotOffer]:
        """Read from the table (no messages here): the slots of running gang attempts whose holder
        stopped renewing, then the free slots of queued attempts, oldest job first."""
        at = self.clock() if now is None else now
        with self._tx() as db:
            jobs = db.execute(
                "SELECT * FROM jobs WHERE state IN (?, ?) ORDER BY created_at, id",
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
        for job in self._readable_jobs(jobs):
            open_slots = [s for s in range(job.spec.nodes) if (job.id, s) not in live]
            if job.state is JobState.QUEUED:
                free += [SlotOffer(job_id=job.id, attempt=job.attempt, slot=s) for s in open_slots]
            elif job.worker == gang_worker(job.id, job.attempt) and open_slots:
                lost.append(SlotOffer(job_id=job.id, attempt=job.attempt, slot=open_slots[0], lost=True))
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
                problem = f"unreadable ({_first_problem(err, 'record')}); it was not written by gpucloud"
                self._report_unreadable("node record", str(row["id"]), problem)
        return records

    # -- cancelling -------------------------------------------------------------------------------

    def cancel(self, job_id: str, *, grace_seconds: float = CANCEL_GRACE_S) -> Job:
        with self._tx() as db:
            job = self._job_in(db, job_id)
            change = transitions.cancel(job, grace_seconds=grace_seconds, now=self.clock())
            if isinstance(change, Refusal):
                if change.error:
                    raise NotCancellable(job, change.reason)
                return job
            _store(db, job_id, change)  # under the write lock the job is as read: the guard holds
        return self.get(job_id)

    def resume(self, job_id: str, *, from_step: int | None = None) -> Job:
        with self._tx() as db:
            job = self._job_in(db, job_id)
            change = transitions.resume(job, from_step=from_step, now=self.clock())
            if isinstance(change, Refusal):
                raise NotResumable(job, change.reason)
            _store(db, job_id, change)
        return self.get(job_id)

    # -- stop requests ----------------------------------------------------------------------------

    def request_stop(self, job_id: str, attempt: int, notice: Notice) -> bool:
        change = transitions.request_stop(attempt, notice, now=self.clock())
        with self._tx() as db:
            if not db.execute("SELECT 1 FROM jobs WHERE id = ?", (job_id,)).fetchone():
                raise UnknownJob(job_id, self.uri)
            return _store(db, job_id, change)

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


_JOB_COLUMNS = frozenset(Job.model_fields) - {"id", "spec", "created_at"}
_ATTEMPT_COLUMNS = frozenset(Attempt.model_fields) - {"job_id", "number", "created_at"}


def _assignments(fields: Mapping[str, Any], columns: frozenset[str]) -> tuple[str, list[Any]]:
    unknown = set(fields) - columns
    if unknown:  # the names come from the transitions: a stranger is a bug, never a column to guess
        raise ValueError(f"no column {sorted(unknown)[0]!r} to store")
    values = [v.value if isinstance(v, enum.Enum) else v for v in fields.values()]
    return ", ".join(f"{name} = ?" for name in fields), values


def _guard_sql(guard: transitions.Guard) -> tuple[str, list[Any]]:
    sql = "state = ? AND attempt = ?"
    args: list[Any] = [guard.state.value, guard.attempt]
    if guard.worker is not None:
        sql, args = f"{sql} AND worker = ?", [*args, guard.worker]
    if guard.lease_expired_at is not None:
        sql, args = f"{sql} AND lease_until < ?", [*args, guard.lease_expired_at]
    return sql, args


def _store(db: sqlite3.Connection, job_id: str, change: Change) -> bool:
    """Write ``change`` in the open transaction if its guard and attempt gate hold (checked by the
    row counts of the guarded updates); False, with nothing written, when they do not."""
    db.execute("SAVEPOINT store_change")
    try:
        stored = _store_guarded(db, job_id, change)
    except BaseException:
        db.execute("ROLLBACK TO store_change")
        db.execute("RELEASE store_change")
        raise
    if not stored:
        db.execute("ROLLBACK TO store_change")
    db.execute("RELEASE store_change")
    return stored


def _store_guarded(db: sqlite3.Connection, job_id: str, change: Change) -> bool:
    where, args = _guard_sql(change.guard)
    if change.job:
        sets, values = _assignments(change.job, _JOB_COLUMNS)
        if db.execute(f"UPDATE jobs SET {sets} WHERE id = ? AND {where}", (*values, job_id, *args)).rowcount != 1:
            return False
    else:  # nothing to update on the job: its guard is checked by reading it under the write lock
        if db.execute(f"SELECT 1 FROM jobs WHERE id = ? AND {where}", (job_id, *args)).fetchone() is None:
            return False
    if change.attempt is not None:
        sets, values = _assignments(change.attempt.fields, _ATTEMPT_COLUMNS)
        gated = db.execute(
            f"UPDATE attempts SET {sets} WHERE job_id = ? AND number = ? AND state = ?",
            (*values, job_id, change.attempt.number, change.attempt.was.value),
        ).rowcount
        if gated != 1:
            return False
    if change.new_attempt is not None:  # the primary key (job_id, number): never a second attempt k+1
        new = change.new_attempt
        db.execute(
            "INSERT INTO attempts (job_id, number, state, created_at, worker, node) VALUES (?, ?, ?, ?, ?, ?)",
            (job_id, new.number, new.state.value, new.created_at, new.worker, new.node),
        )
    for event in change.events:
        _insert_event(db, job_id, event.attempt, event.kind, event.at, dict(event.data))
    if change.stop is not None:
        # The primary key (job_id, attempt) makes the first request the only one.
        if (
            db.execute(
                "INSERT OR IGNORE INTO stop_requests (job_id, attempt, request) VALUES (?, ?, ?)",
                (job_id, change.stop.attempt, change.stop.request.model_dump_json()),
            ).rowcount
            == 1
        ):
            event = change.stop.event
            _insert_event(db, job_id, event.attempt, event.kind, event.at, dict(event.data))
        elif change.outcome is transitions.Outcome.STOP_REQUESTED:
            return False  # a request for this attempt came first
    if change.releases_slots:
        db.execute("DELETE FROM gang_slots WHERE job_id = ? AND attempt = ?", (job_id, change.guard.attempt))
    return True


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


def _expected_columns() -> dict[str, list[str]]:
    """Every table's columns as ``_SCHEMA`` creates them (read back from an in-memory database)."""
    with sqlite3.connect(":memory:") as db:
        db.executescript(_SCHEMA)
        return {t: [str(r[1]) for r in db.execute(f"PRAGMA table_info('{t}')")] for t in _TABLES}


def _missing_columns(found: Mapping[str, set[str]]) -> str | None:
    """The first table or column of ``_SCHEMA`` that ``found`` lacks, said in words (None: none)."""
    for table, columns in _expected_columns().items():
        if not found.get(table):
            return f"table {table}"
        for column in columns:
            if column not in found[table]:
                return f"column {table}.{column}"
    return None


class QueueBusy(UserError):
    def __init__(self, uri: str, waited_s: float | None) -> None:
        super().__init__(
            f"queue {uri} is busy: another process has held its write lock for over {waited_s or 0:.0f} s; "
            "try again (the file is not damaged)"
        )


class UnreadableRow(ValueError):
    """A row of the queue file that gpucloud did not write (damaged, or edited by hand)."""


def _one_line(text: str, limit: int = 200) -> str:
    return " ".join(text.split())[:limit]


def _is_locked(err: sqlite3.DatabaseError) -> bool:
    return isinstance(err, sqlite3.OperationalError) and (
        "database is locked" in str(err) or "database is busy" in str(err)
    )


def _first_problem(err: ValidationError, default: str) -> str:
    first = err.errors()[0]
    where = ".".join(str(p) for p in first["loc"]) or default
    return f"{where[:100]}: {first['msg']}"


def _job(row: sqlite3.Row) -> Job:
    fields = dict(row)
    name = repr(str(fields.get("id"))[:100])
    if not isinstance(fields.get("spec"), str):
        raise UserError(f"job {name} in the queue is unreadable (spec is not text); it was not written by gpucloud")
    try:
        fields["spec"] = JobSpec.model_validate_json(fields["spec"])
        return Job(**fields)
    except ValidationError as err:
        raise UserError(
            f"job {name} in the queue is unreadable ({_first_problem(err, 'spec')}); it was not written by gpucloud"
        ) from err


def _new_job_id() -> str:
    return f"j-{uuid.uuid4().hex[:10]}"
