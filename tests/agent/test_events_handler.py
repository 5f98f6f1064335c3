"""Queue mode: the decision for a notice about another node (a table of cases), and the handler
carrying it out against both queue backends (sqlite, and DynamoDB/SQS on moto) with the Auto Scaling
calls answered by botocore's Stubber (moto lacks them)."""

from __future__ import annotations

import json
import time

import boto3
import pytest
from botocore.stub import Stubber

from gpucloud.agent.asg_hooks import AsgHooks, NodeSettings, OfflineHooks
from gpucloud.agent.events_handler import (
    AttemptStillRunning,
    FleetEventHandler,
    GangAttempt,
    decide,
    lifecycle_timeout,
    queue_region,
    watch_events_queue,
)
from gpucloud.errors import UserError
from gpucloud.lifecycle.model import AttemptEnd, AttemptState, Job, JobSpec, JobState, NodeRecord, NodeState
from gpucloud.queue.sqlite import SqliteQueue
from gpucloud.signals.eventbridge import parse_message
from helpers.waiting import wait_for
from signals import eventbridge_samples as s  # the reference's EventBridge payloads

X, OTHER = s.INSTANCE, s.OTHER_INSTANCE
SELF = "i-0aaaaaaaaaaaaaaaa"  # the instance the handling agent runs on
GROUP = "gpucloud-dev-spot"
LEASE = 30.0
NOW = time.time()


def notice(kind: str = "spot", instance: str = X, at: float = NOW):
    stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(at))
    body = {
        "spot": s.spot_warning(instance, time=stamp),
        "rebalance": s.rebalance(instance, time=stamp),
        "terminate": {**s.terminate_action(instance), "time": stamp},
    }[kind]
    return parse_message(s.body(body), now=at)


def record(
    name: str,
    *,
    instance: str | None = X,
    state: NodeState = NodeState.RUNNING,
    age: float = 1.0,
    job: str | None = "j1",
    attempt: int | None = 1,
) -> NodeRecord:
    return NodeRecord(
        id=name,
        address="10.0.0.1",
        state=state,
        instance_id=instance,
        job_id=job,
        attempt=attempt,
        slot=0 if job else None,
        updated_at=NOW - age,
    )


def job(state: JobState = JobState.RUNNING, attempt: int = 1) -> Job:
    return Job(
        id="j1", spec=JobSpec(command=["train"], nodes=2), state=state, attempt=attempt, created_at=NOW, updated_at=NOW
    )


# -- the decision, case by case -----------------------------------------------------------------

J1 = (GangAttempt("j1", 1),)
CASES = {
    # name: (notice kind, records, job, expected (alive, stop, mark_lost, replace, complete), reason fragment)
    "alive agent, spot: it handles it; only the gang stop": (
        "spot",
        [record("a:1")],
        job(),
        (True, J1, (), False, False),
        "is alive and handles it itself",
    ),
    "alive agent, asg-terminate: never complete its action for it": (
        "terminate",
        [record("a:1")],
        job(),
        (True, J1, (), False, False),
        "is alive",
    ),
    "alive but idle agent: nothing to stop": (
        "spot",
        [record("a:1", state=NodeState.IDLE, job=None, attempt=None)],
        job(),
        (True, (), (), False, False),
        "alive",
    ),
    "stopping agent still reporting is alive": (
        "spot",
        [record("a:1", state=NodeState.STOPPING)],
        job(),
        (True, J1, (), False, False),
        "alive",
    ),
    "dead agent, spot on a running attempt: stop, mark, replace": (
        "spot",
        [record("a:1", age=LEASE + 1)],
        job(),
        (False, J1, ("a:1",), True, False),
        "is dead (silent for 31s)",
    ),
    "dead agent, asg-terminate: stop, mark, complete after the attempt; no detach": (
        "terminate",
        [record("a:1", age=LEASE + 1)],
        job(),
        (False, J1, ("a:1",), False, True),
        "once the attempt ended",
    ),
    "dead agent whose attempt already ended: mark and replace only": (
        "spot",
        [record("a:1", age=LEASE + 1)],
        job(JobState.QUEUED, attempt=2),
        (False, (), ("a:1",), True, False),
        "held no running attempt",
    ),
    "dead agent, record of an older attempt: no stop of the new one": (
        "spot",
        [record("a:1", age=LEASE + 1)],
        job(JobState.RUNNING, attempt=2),
        (False, (), ("a:1",), True, False),
        "held no running attempt",
    ),
    "agent already marked stopped (a duplicate delivery): no second mark": (
        "spot",
        [record("a:1", state=NodeState.STOPPED, age=0.5)],
        job(),
        (False, J1, (), True, False),
        "(stopped)",
    ),
    "restarted agent: the live record decides": (
        "spot",
        [record("a:1", age=500), record("a:2", job=None, attempt=None, state=NodeState.IDLE)],
        job(),
        (True, J1, (), False, False),
        "agent a:2",
    ),
    "dead agent, rebalance: nothing but a log line": (
        "rebalance",
        [record("a:1", age=LEASE + 1)],
        job(),
        (False, (), (), False, False),
        "nothing to do",
    ),
    "alive agent, rebalance: nothing": (
        "rebalance",
        [record("a:1")],
        job(),
        (True, (), (), False, False),
        "handles it itself",
    ),
    "no agent ever on the instance, spot: not ours": (
        "spot",
        [record("b:1", instance=OTHER)],
        job(),
        (False, (), (), False, False),
        "no agent of this fleet",
    ),
    "no agent ever on the instance, asg-terminate: nothing to save, complete now": (
        "terminate",
        [],
        None,
        (False, (), (), False, True),
        "nothing to save",
    ),
}


@pytest.mark.parametrize("name", list(CASES))
def test_the_decision(name):
    kind, records, the_job, expected, fragment = CASES[name]
    jobs = {"j1": the_job} if the_job is not None else {}
    action = decide(notice(kind), records, jobs, now=NOW, node_lease=LEASE)
    assert (action.agent_alive, action.stop, action.mark_lost, action.replace, action.complete_lifecycle) == expected
    assert action.instance_id == X and fragment in action.reason and "\n" not in action.reason


# -- the handler on both backends -----------------------------------------------------------------


@pytest.fixture(params=["sqlite", "aws"])
def jq(request, tmp_path):
    if request.param == "sqlite":
        q = SqliteQueue(tmp_path / "queue.db")
    else:
        from gpucloud.queue.connect import open_queue
        from jobqueue.aws_fixtures import create_job_plane  # tests/jobqueue: the stack's job plane on moto

        plane = create_job_plane(request.getfixturevalue("fresh_aws_account"))
        q = open_queue(f"aws://us-east-1?table={plane['table']}&queue={plane['queue_url']}")
    yield q
    q.close()


@pytest.fixture
def asg(monkeypatch):
    for k, v in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing"}.items():
        monkeypatch.setenv(k, v)
    autoscaling = boto3.client(
        "autoscaling", region_name="us-east-1", endpoint_url="https://autoscaling.us-east-1.amazonaws.com"
    )
    cloudwatch = boto3.client(
        "cloudwatch", region_name="us-east-1", endpoint_url="https://monitoring.us-east-1.amazonaws.com"
    )
    with Stubber(autoscaling) as stub:
        hooks = AsgHooks(
            autoscaling=autoscaling,
            cloudwatch=cloudwatch,
            instance_id=SELF,
            asg_name=GROUP,
            settings=NodeSettings(
                cluster="dev", node_group="spot", lifecycle_hook="gpucloud-drain", scale_in=False, idle_seconds=600
            ),
        )
        yield hooks, stub
        stub.assert_no_pending_responses()


def running_gang(jq, *, dead_for: float) -> Job:
    """A 2-node gang attempt running; the agent on X last reported ``dead_for`` seconds ago."""
    submitted = jq.submit(JobSpec(command=["train"], nodes=2))
    started = jq.claim(f"gang:{submitted.id}:1", lease_seconds=600, job_id=submitted.id, attempt=1)
    jq.register_node(
        NodeRecord(
            id=f"{X}:4242",
            address="10.0.0.1",
            state=NodeState.RUNNING,
            instance_id=X,
            job_id=started.id,
            attempt=1,
            slot=0,
            updated_at=time.time() - dead_for,
        )
    )
    jq.register_node(
        NodeRecord(
            id=f"{SELF}:7",
            address="10.0.0.2",
            state=NodeState.RUNNING,
            instance_id=SELF,
            job_id=started.id,
            attempt=1,
            slot=1,
            updated_at=time.time(),
        )
    )
    return started


def handler(jq, hooks, **kw) -> FleetEventHandler:
    return FleetEventHandler(jq, hooks, node_lease=LEASE, max_wait=kw.pop("max_wait", 5.0), marked_by=f"{SELF}:7", **kw)


def expect_detach(stub, *, member: bool = True) -> None:
    stub.add_response(
        "describe_auto_scaling_instances",
        {
            "AutoScalingInstances": [
                {
                    "InstanceId": X,
                    "InstanceType": "p5.48xlarge",
                    "AutoScalingGroupName": GROUP,
                    "AvailabilityZone": "us-east-1a",
                    "LifecycleState": "InService",
                    "HealthStatus": "HEALTHY",
                    "ProtectedFromScaleIn": True,
                }
            ]
            if member
            else []
        },
        {"InstanceIds": [X]},
    )
    if member:
        stub.add_response(
            "detach_instances",
            {"Activities": []},
            {"InstanceIds": [X], "AutoScalingGroupName": GROUP, "ShouldDecrementDesiredCapacity": False},
        )


def stop_requests(jq, job_id):
    return [e for e in jq.events(job_id) if e.kind == "stop-request"]


def test_a_dead_agents_spot_warning_stops_its_gang_marks_it_and_asks_for_the_replacement(jq, asg):
    hooks, stub = asg
    started = running_gang(jq, dead_for=LEASE + 5)
    warning = notice("spot", at=time.time())
    expect_detach(stub)
    action = handler(jq, hooks)(warning)
    assert action.stop == (GangAttempt(started.id, 1),) and not action.agent_alive
    request = jq.stop_request(started.id, 1)
    assert (request.kind, request.deadline, request.event_id, request.payload["instance-id"]) == (
        "spot-interruption",
        warning.deadline,
        warning.event_id,
        X,
    )
    lost = {n.id: n for n in jq.nodes()}[f"{X}:4242"]
    assert lost.state is NodeState.STOPPED and "agent found dead at a spot-interruption notice" in lost.reason
    assert lost.job_id == started.id  # what it held stays visible to `gpucloud nodes --all`
    assert {n.id: n for n in jq.nodes()}[f"{SELF}:7"].state is NodeState.RUNNING

    # The same message again (a duplicate delivery, or a second consumer): nothing new applies;
    # the instance has left the group by now, so no second detach is asked for.
    expect_detach(stub, member=False)
    handler(jq, hooks)(warning)
    assert len(stop_requests(jq, started.id)) == 1
    assert jq.get(started.id).state is JobState.RUNNING  # the survivors' supervisors end it, not the handler


def test_an_alive_agent_is_left_its_own_notice_and_its_lifecycle_action(jq, asg):
    hooks, _ = asg  # no Auto Scaling response queued: any call would fail the test
    started = running_gang(jq, dead_for=1.0)
    action = handler(jq, hooks)(notice("terminate", at=time.time()))
    assert action.agent_alive and action.stop == (GangAttempt(started.id, 1),)
    assert len(stop_requests(jq, started.id)) == 1
    assert {n.id: n.state for n in jq.nodes()}[f"{X}:4242"] is NodeState.RUNNING


def test_a_dead_agents_lifecycle_action_is_completed_only_after_the_attempt_ended(jq, asg):
    hooks, stub = asg
    started = running_gang(jq, dead_for=LEASE + 5)
    ended: list[float] = []

    def survivors_commit(seconds: float) -> None:
        # Stands in for the survivors' supervisors: they saw the request, saved, and requeued.
        assert jq.stop_request(started.id, 1) is not None
        jq.end_attempt(
            started.id,
            1,
            AttemptEnd(state=AttemptState.REQUEUED, exit_code=75, committed_step=12, reason="checkpointed on notice"),
        )
        ended.append(time.time())

    stub.add_response(
        "complete_lifecycle_action",
        {},
        {
            "AutoScalingGroupName": s.ASG,
            "LifecycleHookName": s.HOOK,
            "InstanceId": X,
            "LifecycleActionToken": s.TOKEN,
            "LifecycleActionResult": "CONTINUE",
        },
    )
    action = handler(jq, hooks, sleep=survivors_commit)(notice("terminate", at=time.time()))
    assert action.complete_lifecycle and ended  # completed after the end, never before
    after = jq.get(started.id)
    assert (after.state, after.attempt, after.crashes) == (JobState.QUEUED, 2, 0)


def test_an_attempt_that_does_not_end_in_time_leaves_the_message_for_redelivery(jq, asg):
    hooks, _ = asg  # no completion may be sent
    running_gang(jq, dead_for=LEASE + 5)
    with pytest.raises(AttemptStillRunning, match="still runs after 0s; the lifecycle action of i-1234567890abcdef0"):
        handler(jq, hooks, max_wait=0.0)(notice("terminate", at=time.time()))


def test_near_the_deadline_the_action_is_completed_even_though_the_attempt_still_runs(jq, asg):
    hooks, stub = asg
    started = running_gang(jq, dead_for=LEASE + 5)
    stub.add_response(
        "complete_lifecycle_action",
        {},
        {
            "AutoScalingGroupName": s.ASG,
            "LifecycleHookName": s.HOOK,
            "InstanceId": X,
            "LifecycleActionToken": s.TOKEN,
            "LifecycleActionResult": "CONTINUE",
        },
    )
    old = notice("terminate", at=time.time() - 600 + 5)  # the hook's 600 s are nearly over
    handler(jq, hooks, max_wait=0.0)(old)
    assert jq.get(started.id).state is JobState.RUNNING


def test_an_action_completed_before_is_a_logged_no_op(jq, asg, caplog):
    hooks, stub = asg
    jq.submit(JobSpec(command=["train"]))  # a queue with something in it, but no agent on X
    stub.add_client_error(
        "complete_lifecycle_action",
        service_error_code="ValidationError",
        service_message=f"No active Lifecycle Action found with instance ID {X}",
        http_status_code=400,
    )
    with caplog.at_level("INFO"):
        action = handler(jq, hooks)(notice("terminate", at=time.time()))
    assert action.complete_lifecycle and "nothing to save" in action.reason
    assert "not completed (none active" in caplog.text


def test_a_replacement_refused_by_aws_still_leaves_the_gang_stopped(jq, asg):
    hooks, stub = asg
    started = running_gang(jq, dead_for=LEASE + 5)
    stub.add_response(
        "describe_auto_scaling_instances",
        {
            "AutoScalingInstances": [
                {
                    "InstanceId": X,
                    "InstanceType": "p5.48xlarge",
                    "AutoScalingGroupName": GROUP,
                    "AvailabilityZone": "us-east-1a",
                    "LifecycleState": "InService",
                    "HealthStatus": "HEALTHY",
                    "ProtectedFromScaleIn": True,
                }
            ]
        },
        {"InstanceIds": [X]},
    )
    stub.add_client_error(
        "detach_instances", service_error_code="AccessDenied", service_message="not authorized", http_status_code=403
    )
    handler(jq, hooks)(notice("spot", at=time.time()))
    assert jq.stop_request(started.id, 1) is not None


def test_racing_handlers_on_several_agents_request_the_stop_once(jq):
    from concurrent.futures import ThreadPoolExecutor

    started = running_gang(jq, dead_for=LEASE + 5)
    warning = notice("spot", at=time.time())
    with ThreadPoolExecutor(4) as pool:
        actions = list(pool.map(lambda _: handler(jq, OfflineHooks())(warning), range(4)))
    assert all(a.stop == (GangAttempt(started.id, 1),) for a in actions)
    assert len(stop_requests(jq, started.id)) == 1


# -- the background consumer on moto SQS ----------------------------------------------------------


def test_the_watcher_consumes_the_events_queue_and_deletes_a_handled_message(tmp_path, fresh_aws_account):
    sqs = boto3.client("sqs", region_name="us-east-1")
    url = sqs.create_queue(QueueName="events")["QueueUrl"]
    q = SqliteQueue(tmp_path / "queue.db")
    started = running_gang(q, dead_for=LEASE + 5)
    sqs.send_message(
        QueueUrl=url, MessageBody=json.dumps(s.spot_warning(X, time=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())))
    )
    watcher = watch_events_queue(
        url, q, OfflineHooks(), node_lease=LEASE, worker="here:1", wait_seconds=1, sqs_client=sqs
    )
    try:
        wait_for(lambda: q.stop_request(started.id, 1) is not None, 20, "the stop request from the events queue")
        wait_for(
            lambda: (
                sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])["Attributes"][
                    "ApproximateNumberOfMessagesNotVisible"
                ]
                == "0"
            ),
            20,
            "the message to be deleted",
        )
    finally:
        watcher.stop()
    assert not watcher.is_running()
    assert sqs.receive_message(QueueUrl=url, WaitTimeSeconds=0).get("Messages") is None


# -- settings, one line each ----------------------------------------------------------------------


def test_the_queue_region_comes_from_the_url_or_the_node_env():
    assert queue_region("https://sqs.eu-west-1.amazonaws.com/123456789012/events", {}) == "eu-west-1"
    assert queue_region("https://us-east-2.queue.amazonaws.com/123456789012/events", {}) == "us-east-2"
    assert queue_region("http://127.0.0.1:5000/123456789012/events", {"GPUCLOUD_REGION": "ap-south-1"}) == "ap-south-1"
    with pytest.raises(
        UserError, match="cannot tell the region of events queue 'http://127.0.0.1:5000/1/e'; set GPUCLOUD_REGION"
    ):
        queue_region("http://127.0.0.1:5000/1/e", {})


def test_the_lifecycle_timeout_from_the_node_env_is_checked():
    assert lifecycle_timeout({}) == 600.0
    assert lifecycle_timeout({"GPUCLOUD_LIFECYCLE_TIMEOUT": "300"}) == 300.0
    with pytest.raises(UserError, match="GPUCLOUD_LIFECYCLE_TIMEOUT='soon' is not a number of seconds"):
        lifecycle_timeout({"GPUCLOUD_LIFECYCLE_TIMEOUT": "soon"})
    with pytest.raises(UserError, match="lifecycle_timeout 5.0 is outside 30 to 7200 seconds"):
        lifecycle_timeout({"GPUCLOUD_LIFECYCLE_TIMEOUT": "5"})


def test_a_bad_events_queue_url_or_visibility_is_refused_with_one_line(tmp_path):
    q = SqliteQueue(tmp_path / "queue.db")
    with pytest.raises(UserError, match="events queue URL 'sqs-events' is not a URL"):
        watch_events_queue("sqs-events", q, OfflineHooks(), node_lease=LEASE, worker="w", sqs_client=object())
    with pytest.raises(UserError, match="visibility timeout 20s must exceed 30s"):
        watch_events_queue(
            "https://sqs.us-east-1.amazonaws.com/1/e",
            q,
            OfflineHooks(),
            node_lease=LEASE,
            worker="w",
            visibility_timeout=20,
            sqs_client=object(),
        )


def test_the_agent_refuses_a_bad_events_queue_with_one_line(env):
    import subprocess

    from .conftest import CLI

    done = subprocess.run(
        [*CLI, "agent", "--no-imds", "--idle-exit", "0", "--events-queue", "sqs-events"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert done.stderr.strip() == (
        "gpucloud: error: events queue URL 'sqs-events' is not a URL "
        "(https://sqs.<region>.amazonaws.com/<account>/<name>)"
    )
