"""The queue contract: every backend must pass this suite (parametrised in conftest.BACKENDS)."""

from __future__ import annotations

import multiprocessing
import threading
import time

import pytest

from gpucloud.errors import UserError
from gpucloud.lifecycle.model import AttemptEnd, AttemptState, JobSpec, JobState
from gpucloud.queue.protocol import UnknownJob

from .conftest import wait_for

SPEC = JobSpec(command=["python", "train.py"], gpus_per_node=8, max_attempts=2)


def requeued(step: int | None = 10) -> AttemptEnd:
    return AttemptEnd(state=AttemptState.REQUEUED, exit_code=75, committed_step=step, last_step=step, reason="notice")


def test_submit_records_a_queued_job_with_attempt_one(jq):
    job = jq.submit(SPEC)
    assert job.state is JobState.QUEUED and job.attempt == 1
    assert jq.get(job.id).spec == SPEC
    assert [a.number for a in jq.attempts(job.id)] == [1]
    assert [e.kind for e in jq.events(job.id)] == ["submitted"]


def test_submit_with_an_existing_id_is_refused_and_keeps_the_first(jq):
    jq.submit(SPEC, job_id="run-1")
    with pytest.raises(UserError, match="already exists"):
        jq.submit(JobSpec(command=["other"]), job_id="run-1")
    assert jq.get("run-1").spec.command == ["python", "train.py"]


@pytest.mark.parametrize("bad", ["", "../x", "-lead", "a b", "x" * 200])
def test_submit_rejects_ids_unusable_in_checkpoint_paths(jq, bad):
    with pytest.raises(UserError, match="job id"):
        jq.submit(SPEC, job_id=bad)


def test_unknown_job_is_a_user_error_naming_the_id(jq):
    with pytest.raises(UnknownJob, match="'nope'"):
        jq.get("nope")
    with pytest.raises(UnknownJob):
        jq.events("nope")


def test_list_filters_by_state_oldest_first(jq):
    a = jq.submit(SPEC)
    b = jq.submit(SPEC)
    jq.claim("w", lease_seconds=60)
    assert [j.id for j in jq.list_jobs()] == [a.id, b.id]
    assert [j.id for j in jq.list_jobs([JobState.QUEUED])] == [b.id]
    assert [j.id for j in jq.list_jobs([JobState.RUNNING])] == [a.id]


def test_claim_gives_one_job_to_one_worker(open_backend):
    first, second = open_backend(), open_backend()
    job = first.submit(SPEC)
    got = [first.claim("w1", lease_seconds=60), second.claim("w2", lease_seconds=60)]
    assert [g.id if g else None for g in got] == [job.id, None]
    assert first.get(job.id).worker == "w1"


def test_racing_claims_from_threads_hand_out_each_job_once(open_backend):
    submitter = open_backend()
    ids = {submitter.submit(SPEC).id for _ in range(6)}
    clients = [open_backend() for _ in range(6)]
    barrier = threading.Barrier(len(clients))
    won: list[str] = []

    def worker(i: int) -> None:
        barrier.wait()
        while (job := clients[i].claim(f"w{i}", lease_seconds=60)) is not None:
            won.append(job.id)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(len(clients))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(won) == sorted(ids)


def test_claim_of_a_named_job(jq):
    jq.submit(SPEC)
    wanted = jq.submit(SPEC)
    assert jq.claim("w", lease_seconds=60, job_id=wanted.id).id == wanted.id
    assert jq.claim("w", lease_seconds=60, job_id=wanted.id) is None  # held, lease live


def test_heartbeat_extends_only_the_holders_lease(jq):
    job = jq.submit(SPEC)
    jq.claim("w1", lease_seconds=5)
    before = jq.get(job.id).lease_until
    assert jq.heartbeat(job.id, 1, "w1", lease_seconds=60)
    assert jq.get(job.id).lease_until > before
    assert not jq.heartbeat(job.id, 1, "intruder", lease_seconds=60)
    assert not jq.heartbeat(job.id, 2, "w1", lease_seconds=60)


def test_an_expired_lease_makes_the_job_claimable_as_the_next_attempt(jq, clock):
    job = jq.submit(SPEC)
    jq.claim("dead", lease_seconds=0.05)
    clock.advance(1)  # the dead worker's lease runs out
    taken = wait_for(lambda: jq.claim("alive", lease_seconds=60), what="lease expiry")
    assert taken.id == job.id and taken.attempt == 2 and taken.worker == "alive"
    states = {a.number: a.state for a in jq.attempts(job.id)}
    assert states == {1: AttemptState.LOST, 2: AttemptState.RUNNING}
    assert "lease-expired" in [e.kind for e in jq.events(job.id)]
    # The dead worker, if it wakes up, can neither renew nor end the attempt it lost.
    assert not jq.heartbeat(job.id, 1, "dead", lease_seconds=60)
    assert not jq.end_attempt(job.id, 1, requeued()).applied
    assert jq.get(job.id).attempt == 2


def test_racing_takeovers_of_an_expired_lease_yield_exactly_one_next_attempt(open_backend, clock):
    first = open_backend()
    job = first.submit(SPEC)
    first.claim("dead", lease_seconds=0.05)
    clock.advance(1)  # the dead worker's lease runs out
    assert first.get(job.id).lease_until < clock()
    clients = [open_backend() for _ in range(6)]
    barrier = threading.Barrier(len(clients))
    won: list[str] = []

    def take(i: int) -> None:
        barrier.wait()
        got = wait_for(
            lambda: clients[i].claim(f"w{i}", lease_seconds=60, job_id=job.id) or first.get(job.id).worker != "dead",
            what="a takeover",
        )
        if not isinstance(got, bool):
            won.append(got.worker)

    threads = [threading.Thread(target=take, args=(i,)) for i in range(len(clients))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(won) == 1
    assert [(a.number, a.state) for a in first.attempts(job.id)] == [(1, AttemptState.LOST), (2, AttemptState.RUNNING)]
    assert first.get(job.id).worker == won[0]


def test_requeue_creates_attempt_k_plus_one_once_however_often_it_is_called(jq):
    job = jq.submit(SPEC)
    jq.claim("w", lease_seconds=60)
    results = [jq.end_attempt(job.id, 1, requeued()) for _ in range(5)]
    assert [r.applied for r in results] == [True, False, False, False, False]
    after = jq.get(job.id)
    assert after.state is JobState.QUEUED and after.attempt == 2 and after.crashes == 0
    assert [(a.number, a.state) for a in jq.attempts(job.id)] == [(1, AttemptState.REQUEUED), (2, AttemptState.QUEUED)]
    assert [e.kind for e in jq.events(job.id)].count("requeue") == 1


def test_racing_requeues_from_threads_yield_exactly_one_new_attempt(open_backend):
    first = open_backend()
    job = first.submit(SPEC)
    first.claim("w", lease_seconds=60)
    clients = [open_backend() for _ in range(8)]
    barrier = threading.Barrier(len(clients))
    applied: list[bool] = []

    def race(client) -> None:
        barrier.wait()
        applied.append(client.end_attempt(job.id, 1, requeued()).applied)

    threads = [threading.Thread(target=race, args=(c,)) for c in clients]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert applied.count(True) == 1
    assert [a.number for a in first.attempts(job.id)] == [1, 2]


def _requeue_in_child(queue_uri: str, job_id: str, barrier, results) -> None:
    from gpucloud.queue.connect import open_queue

    q = open_queue(queue_uri)  # each process its own client, as separate supervisors would have
    barrier.wait()
    results.put(q.end_attempt(job_id, 1, requeued()).applied)
    q.close()


@pytest.mark.slow
def test_racing_requeues_from_processes_yield_exactly_one_new_attempt(jq):
    job = jq.submit(SPEC)
    jq.claim("w", lease_seconds=60)
    ctx = multiprocessing.get_context("fork")
    barrier, results = ctx.Barrier(6), ctx.Queue()
    procs = [ctx.Process(target=_requeue_in_child, args=(jq.uri, job.id, barrier, results)) for _ in range(6)]
    for p in procs:
        p.start()
    outcomes = [results.get(timeout=60) for _ in procs]
    for p in procs:
        p.join(timeout=60)
    assert outcomes.count(True) == 1
    assert [a.number for a in jq.attempts(job.id)] == [1, 2]
    assert jq.get(job.id).attempt == 2


def test_crashes_are_retried_until_max_attempts_then_the_job_fails_with_the_reason(jq):
    job = jq.submit(SPEC)  # max_attempts=2
    jq.claim("w", lease_seconds=60)
    t1 = jq.end_attempt(
        job.id, 1, AttemptEnd(state=AttemptState.CRASHED, exit_code=3, reason="command exited with code 3")
    )
    assert t1.job.state is JobState.QUEUED and t1.job.crashes == 1
    jq.claim("w", lease_seconds=60)
    t2 = jq.end_attempt(
        job.id, 2, AttemptEnd(state=AttemptState.CRASHED, exit_code=3, reason="command exited with code 3")
    )
    assert t2.job.state is JobState.FAILED and t2.job.exit_code == 3
    assert "code 3" in t2.job.reason and "2 of 2" in t2.job.reason
    assert jq.claim("w", lease_seconds=60) is None
    assert [e.kind for e in jq.events(job.id)][-1] == "failed"


def test_noticed_stops_never_count_as_crashes(jq):
    job = jq.submit(SPEC)  # max_attempts=2
    for k in range(1, 5):
        jq.claim("w", lease_seconds=60)
        assert jq.end_attempt(job.id, k, requeued(step=k)).applied
    assert jq.get(job.id).state is JobState.QUEUED and jq.get(job.id).attempt == 5


def test_finish_is_terminal(jq):
    job = jq.submit(SPEC)
    jq.claim("w", lease_seconds=60)
    t = jq.end_attempt(job.id, 1, AttemptEnd(state=AttemptState.FINISHED, exit_code=0, last_step=100))
    assert t.applied and t.job.state is JobState.FINISHED
    assert not jq.end_attempt(job.id, 1, requeued()).applied
    assert jq.claim("w", lease_seconds=60) is None


def test_the_timeline_keeps_the_time_events_happened(jq):
    job = jq.submit(SPEC)
    jq.claim("w", lease_seconds=60)
    jq.record(job.id, 1, "ack", at=1000.5, data={"step": 7})
    jq.update_attempt(job.id, 1, resumed_step=3, last_step=7)
    ack = next(e for e in jq.events(job.id) if e.kind == "ack")
    assert (ack.at, ack.data) == (1000.5, {"step": 7})
    attempt = jq.attempts(job.id)[0]
    assert (attempt.resumed_step, attempt.last_step) == (3, 7)


def test_the_timeline_is_in_the_order_things_happened_not_the_order_they_were_recorded(jq):
    job = jq.submit(SPEC)
    jq.claim("w", lease_seconds=60)
    now = jq.events(job.id)[-1].at
    jq.record(job.id, 1, "commit", at=now + 2.0, data={"step": 5})
    jq.record(job.id, 1, "ack", at=now + 1.0, data={"step": 5})  # seen later, happened earlier
    assert [e.kind for e in jq.events(job.id)][-2:] == ["ack", "commit"]


def test_unknown_timeline_kinds_are_refused(jq):
    job = jq.submit(SPEC)
    with pytest.raises(ValueError, match="unknown timeline event"):
        jq.record(job.id, 1, "exploded")
    with pytest.raises(UnknownJob):
        jq.record("nope", 1, "ack")


# -- gangs: N slots per attempt (GangStore + jobs.gang) -------------------------------------------

from gpucloud.lifecycle.model import NodeRecord, NodeState  # noqa: E402
from gpucloud.queue import gang  # noqa: E402

GANG = JobSpec(command=["torchrun", "train.py"], nodes=2, max_attempts=2)


def test_gang_slots_go_to_distinct_workers_and_form_only_when_all_are_held(jq):
    job = jq.submit(GANG)
    first = gang.claim_slot(jq, "a", "10.0.0.1", lease_seconds=60)
    assert (first.slot, first.attempt) == (0, 1)
    assert gang.members(jq, job, 1) is None
    assert gang.claim_slot(jq, "a", "10.0.0.1", lease_seconds=60).slot == 0  # a restart gets its own slot back
    second = gang.claim_slot(jq, "b", "10.0.0.2", lease_seconds=60)
    assert second.slot == 1
    assert gang.claim_slot(jq, "c", "10.0.0.3", lease_seconds=60) is None  # full
    formed = gang.members(jq, job, 1)
    assert [(m.slot, m.worker, m.address) for m in formed] == [(0, "a", "10.0.0.1"), (1, "b", "10.0.0.2")]


def test_racing_slot_claims_hand_each_slot_out_once(open_backend):
    submitter = open_backend()
    job = submitter.submit(JobSpec(command=["torchrun"], nodes=3))
    clients = [open_backend() for _ in range(6)]
    barrier = threading.Barrier(len(clients))
    won: list = []

    def take(i: int) -> None:
        barrier.wait()
        claim = gang.claim_slot(clients[i], f"w{i}", f"10.0.0.{i}", lease_seconds=60)
        if claim is not None:
            won.append(claim)

    threads = [threading.Thread(target=take, args=(i,)) for i in range(len(clients))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(c.slot for c in won) == [0, 1, 2]
    assert len({c.worker for c in won}) == 3
    assert {c.worker for c in submitter.slot_claims(job.id, 1)} == {c.worker for c in won}


def _claim_within(jq, worker: str, address: str, seconds: float = 10.0):
    """Claim until a slot comes (an SQS message hidden by a dead holder shows again only when its
    visibility timeout, at least 1 s, runs out)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        claim = gang.claim_slot(jq, worker, address, lease_seconds=60)
        if claim is not None:
            return claim
    raise AssertionError(f"{worker} got no slot within {seconds}s")


def test_an_expired_slot_before_the_gang_forms_is_free_again(jq, clock):
    job = jq.submit(GANG)
    dead = gang.claim_slot(jq, "dead", "10.0.0.1", lease_seconds=0.05)
    clock.advance(1)  # the lease runs out; nothing else marks it
    taken = [_claim_within(jq, "b", "10.0.0.2"), _claim_within(jq, "c", "10.0.0.3")]
    assert sorted(c.slot for c in taken) == [0, 1]  # dead's slot among them
    assert dead.slot in {c.slot for c in taken}
    assert [m.worker for m in gang.members(jq, job, 1)] == [c.worker for c in sorted(taken, key=lambda c: c.slot)]
    assert jq.get(job.id).attempt == 1  # no attempt lost


def test_a_released_slot_is_claimable_and_the_attempt_is_kept(jq):
    job = jq.submit(GANG)
    mine = gang.claim_slot(jq, "a", "10.0.0.1", lease_seconds=60)
    assert gang.release(jq, mine)
    assert jq.slot_claims(job.id, 1) == []
    taken = [_claim_within(jq, "b", "10.0.0.2"), _claim_within(jq, "c", "10.0.0.3")]
    assert sorted(c.slot for c in taken) == [0, 1]
    assert [a.number for a in jq.attempts(job.id)] == [1]


def test_a_started_gang_keeps_its_slots(jq):
    job = jq.submit(GANG)
    a = gang.claim_slot(jq, "a", "10.0.0.1", lease_seconds=60)
    b = gang.claim_slot(jq, "b", "10.0.0.2", lease_seconds=60)
    started = [gang.start_gang(jq, a, lease_seconds=60), gang.start_gang(jq, b, lease_seconds=60)]
    assert [s.state for s in started] == [JobState.RUNNING, JobState.RUNNING]
    assert jq.get(job.id).worker == gang.gang_worker(job.id, 1)
    assert [e.kind for e in jq.events(job.id)].count("claimed") == 1
    assert not gang.release(jq, a)  # too late to leave: the gang runs
    assert not jq.take_slot(a.model_copy(update={"worker": "c"}), now=time.time() + 3600)
    assert jq.heartbeat(job.id, 1, gang.gang_worker(job.id, 1), lease_seconds=60)


def test_slot_leases_renew_only_for_their_holder(jq):
    job = jq.submit(GANG)
    a = gang.claim_slot(jq, "a", "10.0.0.1", lease_seconds=60)
    assert gang.renew(jq, a, lease_seconds=120)
    assert not jq.renew_slot(job.id, 1, 0, "intruder", lease_until=time.time() + 600)
    assert jq.slot_claims(job.id, 1)[0].lease_until > time.time() + 100


def test_a_lost_member_fails_the_attempt_over_exactly_once(open_backend):
    jq = open_backend()
    job = jq.submit(GANG)
    a = gang.claim_slot(jq, "a", "10.0.0.1", lease_seconds=600)
    b = gang.claim_slot(jq, "b", "10.0.0.2", lease_seconds=60)
    gang.start_gang(jq, a, lease_seconds=600)
    running = jq.get(job.id)
    assert gang.fail_over(jq, running) is None  # everyone alive
    # Judged two minutes on: b's slot lease has run out, a's has not (a loaded machine can take
    # longer than any short real lease between the claims and the check above).
    later = time.time() + 120
    clients = [open_backend() for _ in range(4)]
    barrier = threading.Barrier(len(clients))
    outcomes: list = []

    def notice(i: int) -> None:
        barrier.wait()
        outcomes.append(gang.fail_over(clients[i], running, now=later))

    threads = [threading.Thread(target=notice, args=(i,)) for i in range(len(clients))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sum(1 for t in outcomes if t is not None and t.applied) == 1
    after = jq.get(job.id)
    assert (after.state, after.attempt, after.crashes) == (JobState.QUEUED, 2, 0)
    assert [a.number for a in jq.attempts(job.id)] == [1, 2]
    # the survivor takes a slot of attempt 2
    assert gang.claim_slot(jq, "a", "10.0.0.1", lease_seconds=60).attempt == 2
    assert b.attempt == 1


def test_node_records_are_replaced_per_agent(jq):
    now = time.time()
    jq.register_node(NodeRecord(id="n1", address="10.0.0.1", state=NodeState.IDLE, updated_at=now))
    jq.register_node(
        NodeRecord(
            id="n2",
            address="10.0.0.2",
            state=NodeState.IDLE,
            instance_type="p5.48xlarge",
            lifecycle="spot",
            updated_at=now,
        )
    )
    jq.register_node(
        NodeRecord(
            id="n1", address="10.0.0.1", state=NodeState.RUNNING, job_id="j", attempt=1, slot=0, updated_at=now + 1
        )
    )
    nodes = jq.nodes()
    assert [(n.id, n.state, n.job_id) for n in nodes] == [("n1", NodeState.RUNNING, "j"), ("n2", NodeState.IDLE, None)]
    assert nodes[1].instance_type == "p5.48xlarge" and nodes[1].lifecycle == "spot"


def test_a_whole_job_claim_leaves_gangs_and_agent_run_jobs_to_the_agents(jq, clock):
    waiting_gang = jq.submit(GANG)
    single = jq.submit(SPEC)
    taken = jq.claim("worker-1", lease_seconds=60)
    assert taken is not None and taken.id == single.id
    assert jq.claim("worker-2", lease_seconds=60) is None
    assert (jq.get(waiting_gang.id).state, jq.get(waiting_gang.id).attempt) == (JobState.QUEUED, 1)
    # A single-node job an agent runs as a gang of one is not taken over by a worker when the
    # gang's job lease runs out: the agents fail it over through its slot.
    agent_run = jq.submit(SPEC)
    mine = gang.claim_slot(jq, "agent-a", "10.0.0.1", lease_seconds=60, job_id=agent_run.id)
    assert gang.start_gang(jq, mine, lease_seconds=0.01) is not None
    clock.advance(1)  # the job lease runs out
    assert jq.claim("worker-3", lease_seconds=60) is None
    assert jq.get(agent_run.id).worker == gang.gang_worker(agent_run.id, 1)
