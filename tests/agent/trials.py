"""A seeded, round-based fleet of simulated agents driving the real queue and gang code.

Each trial submits a few jobs (single-node and gangs) and runs a fleet of simulated agents through
the node agent's protocol calls (``gang.claim_slot`` / ``members`` / ``start_gang`` / ``renew`` /
``release``, ``heartbeat``, ``end_attempt``), in an order and with
faults drawn from ``random.Random(seed)``. Slot leases run on a virtual clock handed to the gang
functions as ``now`` (one round = one second), so a lease "expires" by advancing the clock, never
by sleeping. Agents that die with SIGKILL are real forked processes writing to the same SQLite
file. The fleet is kept at its size like an auto scaling group: every agent that leaves (notice,
kill, stall) is replaced by a fresh one.
"""

from __future__ import annotations

import collections
import dataclasses
import multiprocessing
import os
import random
import signal
import sqlite3
import time
from collections.abc import Callable
from pathlib import Path

from gpucloud.lifecycle.model import AttemptEnd, AttemptState, JobSpec, JobState, SlotClaim
from gpucloud.queue import gang
from gpucloud.queue.gang import GangQueue

SLOT_LEASE = 3.0  # virtual seconds (rounds) a member may go without renewing its slot
GANG_TIMEOUT = 6  # rounds a member waits for its gang before giving the slot back
JOB_LEASE = 3600.0  # real seconds: the job lease never runs out inside a trial; slot leases do
MAX_ROUNDS = 400  # every job must have ended by then
KILL_POINTS = ("slot-taken", "gang-started", "in-write-transaction")  # the last: SQLite only
QueueOpener = Callable[[], GangQueue]  # a new connection to the trial's queue (the forked agent opens its own)


@dataclasses.dataclass
class SimAgent:
    worker: str
    claim: SlotClaim | None = None
    running: bool = False
    waited: int = 0  # rounds spent waiting for the gang
    work_left: int = 0  # rounds of training left in the running attempt
    backoff: dict[tuple[str, int], int] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass
class TrialResult:
    faults: collections.Counter
    checks: int
    rounds: int


class InvariantBroken(AssertionError):
    pass


def _check(ok: bool, what: str, seed: int) -> int:
    if not ok:
        raise InvariantBroken(f"seed {seed}: {what}")
    return 1


def _killed_agent(
    open_queue: QueueOpener, db_path: Path | None, worker: str, now: float, kill_point: str, conn
) -> None:
    """A forked agent: does protocol calls up to ``kill_point``, reports it, and blocks until killed."""
    queue = open_queue()
    claim = gang.claim_slot(queue, worker, f"10.0.9.{os.getpid() % 250}", lease_seconds=SLOT_LEASE, now=now)
    conn.send(("slot-taken", claim.model_dump() if claim else None))
    if kill_point == "slot-taken":
        conn.recv()  # never answered: the parent kills this process here
    if claim is not None:  # with no free slot this agent reaches the later points holding nothing
        job = queue.get(claim.job_id)
        if gang.members(queue, job, claim.attempt, now=now) is not None:
            started = gang.start_gang(queue, claim, lease_seconds=JOB_LEASE)
            if started is not None:
                queue.heartbeat(
                    started.id, started.attempt, gang.gang_worker(started.id, started.attempt), lease_seconds=JOB_LEASE
                )
    conn.send(("gang-started", None))
    if kill_point == "gang-started":
        conn.recv()
    if kill_point == "in-write-transaction":
        # Die holding the database's write lock, mid-update: SQLite must roll this back.
        assert db_path is not None
        db = sqlite3.connect(db_path, isolation_level=None)
        db.execute("BEGIN IMMEDIATE")
        db.execute("UPDATE jobs SET state = 'finished', reason = 'half-written by a dead agent'")
        conn.send(("in-write-transaction", None))
        conn.recv()


class Trial:
    def __init__(
        self, seed: int, open_queue: QueueOpener, *, kill_points: tuple[str, ...] = (), db_path: Path | None = None
    ) -> None:
        """``kill_points``: where a real agent process may be killed in this trial (none: no kill);
        ``db_path``: the SQLite file, for the kill inside a write transaction."""
        self.seed = seed
        self.rng = random.Random(seed)
        self.open_queue, self.path = open_queue, db_path
        self.queue = open_queue()
        self.kill_points = kill_points
        self.faults: collections.Counter = collections.Counter()
        self.checks = 0
        self.base = time.time()
        self.round = 0
        self.names = 0
        self.noticed_applied: set[tuple[str, int]] = set()  # attempts a notice ended (its call applied)
        self.agents: list[SimAgent] = []

    # -- the fleet --------------------------------------------------------------------------

    @property
    def now(self) -> float:
        return self.base + self.round

    def _new_agent(self) -> SimAgent:
        self.names += 1
        return SimAgent(worker=f"agent-{self.names}")

    def _leave(self, agent: SimAgent) -> None:
        """The node is gone; the group launches a replacement."""
        self.agents.remove(agent)
        self.agents.append(self._new_agent())

    # -- one trial --------------------------------------------------------------------------

    def run(self) -> TrialResult:
        rng = self.rng
        jobs = []
        for i in range(rng.randint(1, 3)):
            spec = JobSpec(command=["train"], nodes=rng.choice((1, 2, 2, 3)), max_attempts=rng.choice((2, 3, 4)))
            jobs.append(self.queue.submit(spec, job_id=f"t{self.seed}-{i}").id)
        fleet = max(self.queue.get(j).spec.nodes for j in jobs) + rng.randint(0, 1)
        self.agents = [self._new_agent() for _ in range(fleet)]
        kill_round = rng.randint(0, 2) if self.kill_points else None  # before any job can end
        while not all(self.queue.get(j).state.terminal for j in jobs):
            _check(
                self.round < MAX_ROUNDS,
                f"jobs not ended after {MAX_ROUNDS} rounds: {[(j, self.queue.get(j).state.value) for j in jobs]}",
                self.seed,
            )
            if self.round == kill_round:
                self._kill_one()
            for agent in rng.sample(self.agents, len(self.agents)):
                if agent in self.agents:
                    self._step(agent)
            self.checks += self._check_running()
            self.round += 1
        self.checks += self._check_records(jobs)
        self.queue.close()
        return TrialResult(self.faults, self.checks, self.round)

    def _step(self, agent: SimAgent) -> None:
        if agent.claim is None:
            self._idle(agent)
        elif not agent.running:
            self._wait(agent)
        else:
            self._work(agent)

    def _idle(self, agent: SimAgent) -> None:
        # As the agent does: lost members come as offers, failed over inside claim_slot; every idle
        # agent gets them, so several may fail the same gang over at once.
        agent.backoff = {k: r for k, r in agent.backoff.items() if r > self.round}
        agent.claim = gang.claim_slot(
            self.queue,
            agent.worker,
            f"10.0.0.{self.names}",
            lease_seconds=SLOT_LEASE,
            now=self.now,
            skip=agent.backoff.keys(),
        )
        agent.waited = 0

    def _wait(self, agent: SimAgent) -> None:
        claim, rng = agent.claim, self.rng
        assert claim is not None
        if rng.random() < 0.04:  # a notice while the gang is forming: give the slot back and go
            self.faults["notice-while-forming"] += 1
            gang.release(self.queue, claim)
            self._leave(agent)
            return
        self.queue.renew_slot(claim.job_id, claim.attempt, claim.slot, claim.worker, lease_until=self.now + SLOT_LEASE)
        job = self.queue.get(claim.job_id)
        members = gang.members(self.queue, job, claim.attempt, now=self.now)
        started_by_others = job.state is JobState.RUNNING and job.worker == gang.gang_worker(job.id, claim.attempt)
        formed = members is not None and any(m.worker == agent.worker for m in members)
        # No guard on the job's attempt here: gang.start_gang claims only claim.attempt, so a late
        # member of an attempt that already ended cannot start the next one (see
        # test_a_late_member_cannot_start_the_next_attempt_under_its_old_gang).
        if formed or started_by_others:
            if gang.start_gang(self.queue, claim, lease_seconds=JOB_LEASE) is not None:
                agent.running, agent.work_left = True, rng.randint(2, 5)
                return
        if job.state is not JobState.QUEUED or job.attempt != claim.attempt:
            agent.claim = None  # the attempt ended or moved on while forming
            return
        agent.waited += 1
        if agent.waited >= GANG_TIMEOUT and gang.release(self.queue, claim):
            agent.backoff[(claim.job_id, claim.attempt)] = self.round + GANG_TIMEOUT
            agent.claim = None

    def _work(self, agent: SimAgent) -> None:
        claim, rng = agent.claim, self.rng
        assert claim is not None
        roll = rng.random()
        if roll < 0.03:  # stops heartbeating (hung node): its slot lease runs out, the others fail over
            self.faults["lease-expired"] += 1
            self._leave(agent)
            return
        self.queue.renew_slot(claim.job_id, claim.attempt, claim.slot, claim.worker, lease_until=self.now + SLOT_LEASE)
        if not self.queue.heartbeat(
            claim.job_id, claim.attempt, gang.gang_worker(claim.job_id, claim.attempt), lease_seconds=JOB_LEASE
        ):
            agent.claim, agent.running = None, False  # the attempt ended elsewhere (a member lost, a notice)
            return
        if roll < 0.08:
            self.faults["notice-while-running"] += 1
            self._end_gang(
                claim,
                AttemptEnd(
                    state=AttemptState.REQUEUED,
                    reason="spot-interruption notice",
                    committed_step=self.round,
                    resume_from=self.round,
                ),
                noticed=agent,
            )
            return
        if roll < 0.10:
            self.faults["crash"] += 1
            self._end_gang(claim, AttemptEnd(state=AttemptState.CRASHED, exit_code=1, reason="exit code 1"))
            return
        job = self.queue.get(claim.job_id)
        if gang.lost_member(self.queue, job, now=self.now) is not None:
            return  # the collective waits on a member that is gone; the lost-member sweep ends this attempt
        agent.work_left -= 1
        if agent.work_left <= 0:
            self._end_gang(claim, AttemptEnd(state=AttemptState.FINISHED, exit_code=0, last_step=self.round))

    def _end_gang(self, claim: SlotClaim, end: AttemptEnd, *, noticed: SimAgent | None = None) -> None:
        """Every member ends the attempt the same way (the collective agreed), some twice: exactly one
        call may apply."""
        holders = [
            a
            for a in self.agents
            if a.running and a.claim is not None and (a.claim.job_id, a.claim.attempt) == (claim.job_id, claim.attempt)
        ]
        applied = 0
        for member in holders:
            for _ in range(2 if self.rng.random() < 0.5 else 1):
                if applied:
                    self.faults["duplicate-delivery"] += 1
                applied += self.queue.end_attempt(claim.job_id, claim.attempt, end).applied
            member.claim, member.running = None, False
        self.checks += _check(
            applied == 1, f"{claim.job_id} attempt {claim.attempt}: {applied} end calls applied", self.seed
        )
        if noticed is not None:
            self.noticed_applied.add((claim.job_id, claim.attempt))
            self._leave(noticed)
        # A stale delivery after the end (a late duplicate from a node that was away) changes nothing.
        late = self.queue.end_attempt(claim.job_id, claim.attempt, AttemptEnd(state=AttemptState.FINISHED))
        self.faults["stale-delivery"] += 1
        self.checks += _check(
            not late.applied, f"a stale end of {claim.job_id} attempt {claim.attempt} applied", self.seed
        )

    def _kill_one(self) -> None:
        """A real agent process takes part in the protocol and dies with SIGKILL at a random point."""
        point = self.rng.choice(self.kill_points)
        self.names += 1
        ctx = multiprocessing.get_context("fork")
        parent, child = ctx.Pipe()
        proc = ctx.Process(
            target=_killed_agent, args=(self.open_queue, self.path, f"agent-{self.names}", self.now, point, child)
        )
        proc.start()
        deadline = time.monotonic() + 30
        reached = None
        while reached != point and time.monotonic() < deadline:
            if parent.poll(deadline - time.monotonic()):
                reached = parent.recv()[0]
        os.kill(proc.pid, signal.SIGKILL)
        proc.join(30)
        _check(
            reached == point and proc.exitcode == -signal.SIGKILL,
            f"the killed agent reached {reached!r} (wanted {point!r}), exit {proc.exitcode}",
            self.seed,
        )
        self.faults[f"sigkill-{point}"] += 1

    # -- invariants -------------------------------------------------------------------------

    def _check_running(self) -> int:
        """No attempt runs twice at once. An agent that still believes it runs an attempt that ended
        (it has not heartbeated since) must be refused the lease; the agents of the job's current
        running attempt are one per slot, each the stored holder of its slot."""
        checks = 0
        seen: dict[tuple[str, int, int], str] = {}
        for agent in self.agents:
            if not agent.running or agent.claim is None:
                continue
            c = agent.claim
            job = self.queue.get(c.job_id)
            if job.state is not JobState.RUNNING or job.attempt != c.attempt:
                checks += _check(
                    not self.queue.heartbeat(
                        c.job_id, c.attempt, gang.gang_worker(c.job_id, c.attempt), lease_seconds=JOB_LEASE
                    ),
                    f"{agent.worker} still holds the lease of ended {c.job_id} attempt {c.attempt}",
                    self.seed,
                )
                continue
            key = (c.job_id, c.attempt, c.slot)
            checks += _check(key not in seen, f"{key} run by {seen.get(key)} and {agent.worker} at once", self.seed)
            seen[key] = agent.worker
            holder = {s.slot: s.worker for s in self.queue.slot_claims(c.job_id, c.attempt)}.get(c.slot)
            checks += _check(holder == agent.worker, f"{key} run by {agent.worker} but held by {holder}", self.seed)
        return checks

    def _check_records(self, jobs: list[str]) -> int:
        listed = {j.id for j in self.queue.list_jobs()}  # a shared AWS plane also lists earlier trials' jobs
        checks = _check(set(jobs) <= listed, f"jobs missing from the queue: {set(jobs) - listed}", self.seed)
        for job_id in jobs:
            job = self.queue.get(job_id)
            checks += _check(job.state in (JobState.FINISHED, JobState.FAILED), f"{job_id} is {job.state}", self.seed)
            if job.state is JobState.FAILED:
                checks += _check(
                    bool(job.reason and job.reason.strip()), f"{job_id} failed without a reason", self.seed
                )
            attempts = self.queue.attempts(job_id)
            checks += _check(
                [a.number for a in attempts] == list(range(1, job.attempt + 1)),
                f"{job_id} attempt numbers {[a.number for a in attempts]}",
                self.seed,
            )
            checks += _check(
                all(a.state not in (AttemptState.RUNNING, AttemptState.QUEUED) for a in attempts),
                f"{job_id} left an attempt open: {[(a.number, a.state.value) for a in attempts]}",
                self.seed,
            )
            requeues = collections.Counter(e.attempt for e in self.queue.events(job_id) if e.kind == "requeue")
            checks += _check(
                all(n == 1 for n in requeues.values()), f"{job_id} requeues per attempt {requeues}", self.seed
            )
            # Every requeue made exactly the next attempt, and every attempt but the first came from one.
            # Job leases never run out in a trial, so every attempt but the last ended through a requeue.
            checks += _check(
                sorted(requeues) == [a.number for a in attempts[:-1]],
                f"{job_id} requeues {sorted(requeues)} vs attempts {len(attempts)}",
                self.seed,
            )
            for noticed_job, number in self.noticed_applied:
                if noticed_job == job_id:
                    checks += _check(
                        requeues[number] == 1 and attempts[number - 1].state is AttemptState.REQUEUED,
                        f"{job_id} noticed attempt {number}: {requeues[number]} requeues",
                        self.seed,
                    )
        return checks
