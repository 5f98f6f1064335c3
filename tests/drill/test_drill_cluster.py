"""gpucloud drill on a cluster (drill/cluster.py run_on_cluster): the job plane is the real AWS queue
on the moto server; FIS, EC2 and CloudWatch are botocore clients under the Stubber (real models).

No agents run: the test plays the cluster's side through the queue API, as the agents would: the
gang claims its slots and reports its nodes (a thread, while the drill waits for step K); when
the drill polls the experiment, the noticed gang acks one step, commits it and is requeued, and
attempt 2 resumes there and finishes. D1's verdict then judges what the queue holds."""

from __future__ import annotations

import datetime as dt
import threading
import time
from collections.abc import Callable
from typing import Any

import boto3
import pytest
from botocore.stub import ANY, Stubber

from gpucloud.cluster.drill_contract import TARGET_TAG
from gpucloud.drill import cluster
from gpucloud.drill.cluster import DrillJob, run_on_cluster
from gpucloud.drill.fis import SPOT_ACTION_ID, ExperimentUnsuccessful
from gpucloud.drill.run import DrillAborted
from gpucloud.errors import UserError
from gpucloud.lifecycle.model import AttemptEnd, AttemptState, JobState, NodeRecord, NodeState, Progress
from gpucloud.queue.connect import open_queue
from gpucloud.queue.gang import GangQueue, claim_slot, gang_worker, start_gang
from gpucloud.queue.sqlite import SqliteQueue
from helpers.waiting import wait_for
from jobqueue.aws_fixtures import REGION, aws_job_plane  # noqa: F401  (fixture)

from .fis_replies import EXPERIMENT_ID, TEMPLATE_ID
from .fis_replies import experiment as fis_reply

ALARM = "p4d-spot-drill-stop"
BUCKET = "drill-ckpt"
NODES = {  # worker id -> instance id; a and b form attempt 1's gang, c is the standby
    "agent-a": "i-0aaaaaaaaaaaaaaa1",
    "agent-b": "i-0bbbbbbbbbbbbbbb2",
    "agent-c": "i-0ccccccccccccccc3",
}
TAG = [{"Key": TARGET_TAG, "Value": "true"}]
LEASE = 600.0
STOP_STEP = 5  # the step attempt 1 has reached when the notice comes (and the one it commits)
STEPS = 20
INJECTED = dt.datetime(2026, 11, 24, 12, 0, 0, tzinfo=dt.timezone.utc)


def outputs(plane: dict[str, str], *, drill: bool = True) -> dict[str, Any]:
    out: dict[str, Any] = {
        "jobTableName": plane["table"],
        "jobQueueUrl": plane["queue_url"],
        "checkpointBucket": BUCKET,
    }
    if drill:
        out["drill"] = {"experimentTemplateId": TEMPLATE_ID, "roleArn": "arn:aws:iam::1:role/r", "stopAlarmName": ALARM}
    return out


class StubbedAws:
    """fis, ec2 and cloudwatch clients under the Stubber; ``clients`` is the factory the drill takes."""

    def __init__(self) -> None:
        self.client = {
            s: boto3.client(s, region_name=REGION, aws_access_key_id="x", aws_secret_access_key="x")
            for s in ("fis", "ec2", "cloudwatch")
        }
        self.stub = {s: Stubber(c) for s, c in self.client.items()}

    def clients(self, service: str) -> Any:
        return self.client[service]

    def on_get_experiment(self, hook: Callable[[int], None]) -> None:
        """``hook(n)`` runs before the n-th GetExperiment (1-based): the cluster's side moves on."""
        calls = [0]

        def before(**_: Any) -> None:
            calls[0] += 1
            hook(calls[0])

        self.client["fis"].meta.events.register("before-parameter-build.fis.GetExperiment", before)

    def expect_start(self, alarm_state: str = "OK") -> None:
        """What every drill asks first: the template (its lead) and the stop alarm."""
        action = {
            "actionId": SPOT_ACTION_ID,
            "parameters": {"durationBeforeInterruption": "PT2M"},
            "targets": {"SpotInstances": "drill-target"},
        }
        self.stub["fis"].add_response(
            "get_experiment_template",
            {"experimentTemplate": {"id": TEMPLATE_ID, "actions": {"interrupt-one-spot-node": action}}},
            {"id": TEMPLATE_ID},
        )
        self.stub["cloudwatch"].add_response(
            "describe_alarms",
            {"MetricAlarms": [{"AlarmName": ALARM, "StateValue": alarm_state}]},
            {"AlarmNames": [ALARM]},
        )

    def expect_experiment(self, instance: str, statuses: list[tuple[str, str | None]]) -> None:
        """Tag ``instance``, start the experiment, GetExperiment replies of ``statuses``, untag."""
        self.stub["ec2"].add_response("create_tags", {}, {"Resources": [instance], "Tags": TAG})
        self.stub["fis"].add_response(
            "start_experiment",
            experiment("initiating"),
            {"clientToken": ANY, "experimentTemplateId": TEMPLATE_ID, "tags": ANY},
        )
        for status, reason in statuses:
            self.stub["fis"].add_response("get_experiment", experiment(status, reason), {"id": EXPERIMENT_ID})

    def expect_untag(self, instance: str) -> None:
        self.stub["ec2"].add_response("delete_tags", {}, {"Resources": [instance], "Tags": TAG})

    def __enter__(self) -> StubbedAws:
        for stub in self.stub.values():
            stub.activate()
        return self

    def __exit__(self, *exc: object) -> None:
        for stub in self.stub.values():
            stub.deactivate()

    def assert_all_asked(self) -> None:
        for stub in self.stub.values():
            stub.assert_no_pending_responses()


def experiment(status: str, reason: str | None = None) -> dict[str, Any]:
    """The drill template's experiment in ``status``, its spot action started at INJECTED."""
    action = {"actionId": SPOT_ACTION_ID, "startTime": INJECTED, "state": {"status": status}}
    return fis_reply(status, reason, startTime=INJECTED, actions={"interrupt-one-spot-node": action})


class Cluster:
    """The agents' side of the drill job, through its own connection to the queue."""

    def __init__(self, uri: str) -> None:
        self.queue: GangQueue = open_queue(uri)
        self.job_id: str | None = None

    def form_gang(self, attempt: int, workers: tuple[str, ...]) -> None:
        assert self.job_id is not None
        claims = []
        for worker in workers:
            claim = claim_slot(self.queue, worker, f"10.0.0.{len(claims) + 1}", lease_seconds=LEASE, job_id=self.job_id)
            assert claim is not None and claim.attempt == attempt
            claims.append(claim)
            self.queue.register_node(
                NodeRecord(
                    id=worker,
                    address=claim.address,
                    state=NodeState.RUNNING,
                    instance_type="p4d.24xlarge",
                    lifecycle="spot",
                    instance_id=NODES[worker],
                    job_id=self.job_id,
                    attempt=attempt,
                    slot=claim.slot,
                    updated_at=time.time(),
                )
            )
        for claim in claims:
            assert start_gang(self.queue, claim, lease_seconds=LEASE) is not None

    def train(self, attempt: int, *, resumed: int, step: int) -> None:
        assert self.job_id is not None
        self.queue.record(self.job_id, attempt, "started")
        self.queue.update_attempt(self.job_id, attempt, started_at=time.time(), resumed_step=resumed)
        self.queue.record(self.job_id, attempt, "resume", data={"step": resumed})
        progress = Progress(last_step=step, step_rate=1.0, progress_at=time.time())
        worker = gang_worker(self.job_id, attempt)
        assert self.queue.heartbeat(self.job_id, attempt, worker, lease_seconds=LEASE, progress=progress)

    def attempt_1(self) -> None:
        """Run in a thread: the drill job appears, a and b take it and train past step K."""
        self.job_id = wait_for(lambda: next(iter(self.queue.list_jobs([JobState.QUEUED])), None), 60, "the job").id
        self.form_gang(1, ("agent-a", "agent-b"))
        self.train(1, resumed=0, step=STOP_STEP)

    def noticed(self, *, committed: int | None = STOP_STEP) -> None:
        """The spot notice on a: every rank acks one step, it is committed, the attempt is requeued."""
        assert self.job_id is not None
        deadline = time.time() + 120
        self.queue.record(
            self.job_id, 1, "notice", data={"kind": "spot-interruption", "deadline": deadline, "action": "terminate"}
        )
        self.queue.record(self.job_id, 1, "flag")
        for _ in ("agent-a", "agent-b"):
            self.queue.record(self.job_id, 1, "ack", data={"step": STOP_STEP})
        if committed is not None:
            self.queue.record(self.job_id, 1, "commit", data={"step": committed})
        end = AttemptEnd(
            state=AttemptState.REQUEUED,
            exit_code=75,
            last_step=STOP_STEP,
            committed_step=committed,
            resume_from=committed,
            reason="checkpointed on notice",
        )
        assert self.queue.end_attempt(self.job_id, 1, end).applied

    def attempt_2(self) -> None:
        """b and the standby c take the requeued attempt and resume at the committed step."""
        self.form_gang(2, ("agent-b", "agent-c"))
        self.train(2, resumed=STOP_STEP, step=STOP_STEP + 3)

    def finish(self) -> None:
        assert self.job_id is not None
        end = AttemptEnd(state=AttemptState.FINISHED, exit_code=0, last_step=STEPS)
        assert self.queue.end_attempt(self.job_id, 2, end).applied


@pytest.fixture
def plane(aws_job_plane):
    boto3.client("s3", region_name=REGION).create_bucket(Bucket=BUCKET)
    return aws_job_plane


def run_drill(plane, aws: StubbedAws, lines: list[str], **overrides: Any):
    options: dict[str, Any] = {
        "stack": "p4d-spot",
        "outputs": outputs(plane),
        "region": REGION,
        "job": DrillJob(steps=STEPS, notice_at_step=3, group="p4d"),
        "progress": lines.append,
        "clients": aws.clients,
        "timeout_s": 120.0,
        "poll_interval_s": 0.05,
        **overrides,
    }
    return run_on_cluster(**options)


def test_a_drill_on_the_cluster_interrupts_one_gang_member_and_the_verdict_passes(plane):
    from gpucloud.drill.verdict import verdict_of

    side = Cluster(plane["uri"])
    agents = threading.Thread(target=side.attempt_1, daemon=True)
    agents.start()
    lines: list[str] = []

    def cluster_side(poll: int) -> None:  # the experiment runs: the notice, then the reclaim
        if poll == 1:
            side.noticed()
            side.attempt_2()
        if poll == 2:
            side.finish()

    with StubbedAws() as aws:
        aws.expect_start()
        aws.expect_experiment(NODES["agent-a"], [("running", None), ("completed", "Experiment completed.")])
        aws.expect_untag(NODES["agent-a"])
        aws.on_get_experiment(cluster_side)
        run = run_drill(plane, aws, lines)
        aws.assert_all_asked()  # the tag went on slot 0's instance and came off again
    agents.join(timeout=60)
    try:
        assert (run.injector, run.target, run.lead_seconds) == ("fis", NODES["agent-a"], 120.0)
        assert run.injected_at == INJECTED.timestamp()
        assert run.experiment == {
            "id": EXPERIMENT_ID,
            "template_id": TEMPLATE_ID,
            "state": "completed",
            "reason": "Experiment completed.",
            "started_at": INJECTED.timestamp(),
            "ended_at": None,
        }
        job = run.queue.get(run.job_id)
        assert job.state is JobState.FINISHED and job.spec.nodes == 2 and job.spec.group == "p4d"
        # The example went as a `submit --workdir` snapshot to the stack's bucket.
        assert job.spec.command[:3] == ["torchrun", "--nproc-per-node=1", "train_spot.py"]
        assert job.spec.code is not None and job.spec.code.uri.startswith(f"s3://{BUCKET}/code/")
        keys = [o["Key"] for o in boto3.client("s3", region_name=REGION).list_objects_v2(Bucket=BUCKET)["Contents"]]
        assert keys == [job.spec.code.uri.removeprefix(f"s3://{BUCKET}/")]
        verdict = verdict_of(run)
        assert verdict.verdict == "pass", verdict.checks
        assert (verdict.injector, verdict.target, verdict.attempts) == ("fis", NODES["agent-a"], 2)
        assert verdict.experiment is not None and verdict.experiment["id"] == EXPERIMENT_ID
        assert any(f"removed {TARGET_TAG} from {NODES['agent-a']}" in line for line in lines)
        assert any("finished after 2 attempt(s)" in line for line in lines)
    finally:
        run.queue.close()
        side.queue.close()


def test_a_failed_experiment_is_one_line_the_tag_is_removed_and_the_job_cancelled(plane):
    side = Cluster(plane["uri"])
    agents = threading.Thread(target=side.attempt_1, daemon=True)
    agents.start()
    lines: list[str] = []
    with StubbedAws() as aws:
        aws.expect_start()
        reason = "Target resolution returned empty set"
        aws.expect_experiment(NODES["agent-a"], [("initiating", None), ("failed", reason)])
        aws.expect_untag(NODES["agent-a"])
        with pytest.raises(ExperimentUnsuccessful) as raised:
            run_drill(plane, aws, lines)
        aws.assert_all_asked()  # DeleteTags was sent although the experiment failed
    agents.join(timeout=60)
    try:
        assert str(raised.value) == f"experiment {EXPERIMENT_ID} failed: {reason}"
        assert raised.value.exit_code == 1
        job = side.queue.get(side.job_id or "")
        assert job.cancel_requested_at is not None  # running: its ranks save a step, then it ends CANCELLED
        assert any(line == f"cancelled the drill job {job.id}" for line in lines)
    finally:
        side.queue.close()


def test_a_stack_without_the_drill_output_is_one_line_and_touches_nothing(plane):
    def no_aws(service: str) -> Any:
        raise AssertionError(f"no {service} call may be made")

    with pytest.raises(UserError) as raised:
        run_on_cluster(
            stack="p4d-spot",
            outputs=outputs(plane, drill=False),
            region=REGION,
            job=DrillJob(),
            progress=lambda line: None,
            clients=no_aws,
        )
    message = str(raised.value)
    assert "\n" not in message
    assert "stack p4d-spot has no 'drill' output" in message
    assert "`gpucloud:drill: true`" in message and "`pulumi up`" in message


def test_a_stop_alarm_in_alarm_refuses_before_any_job_is_queued(plane):
    with StubbedAws() as aws:
        aws.expect_start(alarm_state="ALARM")
        with pytest.raises(UserError, match="stop alarm p4d-spot-drill-stop is in ALARM"):
            run_drill(plane, aws, [])
        aws.assert_all_asked()
    queue = open_queue(plane["uri"])
    try:
        assert queue.list_jobs() == []
    finally:
        queue.close()


@pytest.mark.parametrize(
    ("missing", "named"),
    [("jobTableName", "jobTableName"), ("jobQueueUrl", "jobQueueUrl")],
)
def test_a_stack_without_its_job_plane_outputs_is_one_line(missing, named):
    plane = {"table": "t-jobs", "queue_url": "https://sqs.us-east-1.amazonaws.com/123456789012/jobs"}
    given = outputs(plane)
    del given[missing]
    with pytest.raises(UserError, match=f"stack p4d-spot has no {named} output; run `pulumi up` on it first"):
        cluster.read_outputs("p4d-spot", given, REGION)


def member(slot: int, lifecycle: str | None, instance: str | None = "i-0aaaaaaaaaaaaaaa1") -> cluster.Member:
    return cluster.Member(slot=slot, worker=f"w{slot}", instance_id=instance, lifecycle=lifecycle)


def test_the_target_is_the_lowest_slot_on_a_spot_instance_once_every_member_reported():
    assert cluster.choose_target([member(0, "on-demand"), member(1, "spot")], 2) == member(1, "spot")
    assert cluster.choose_target([member(0, "spot"), member(1, "spot")], 2) == member(0, "spot")
    assert cluster.choose_target([member(0, "spot")], 2) is None  # the gang is not formed yet
    assert cluster.choose_target([member(0, "spot"), member(1, "spot", None)], 2) is None  # b not reported
    with pytest.raises(DrillAborted, match="runs on no spot instance"):
        cluster.choose_target([member(0, "on-demand"), member(1, None)], 2)


def test_an_experiment_still_running_at_the_deadline_is_stopped_and_the_tag_removed(tmp_path):
    """The follower's deadline is already past when the experiment is polled: the drill gives up,
    stops the experiment so it does not go on alone, and removes the tag."""
    queue = SqliteQueue(tmp_path / "queue.db")
    instance = NODES["agent-a"]
    try:
        job = queue.submit(cluster.drill_spec(DrillJob(command=("python", "train.py")), bucket=None, queue_uri="x"))
        lines: list[str] = []
        follow = cluster._Follower(queue, job.id, lines.append, timeout_s=1.0, poll_interval_s=0.0)
        follow.deadline = time.monotonic() - 1
        with StubbedAws() as aws:
            aws.expect_experiment(instance, [("running", None)])
            aws.stub["fis"].add_response("stop_experiment", experiment("stopping"), {"id": EXPERIMENT_ID})
            aws.expect_untag(instance)
            with pytest.raises(DrillAborted, match=f"waiting for experiment {EXPERIMENT_ID} to end"):
                cluster._interrupt(
                    aws.client["fis"], aws.client["ec2"], TEMPLATE_ID, instance, follow, stack="s", say=lines.append
                )
            aws.assert_all_asked()
        assert f"stopped experiment {EXPERIMENT_ID}" in lines
    finally:
        queue.close()


def test_a_tag_that_cannot_be_removed_says_how_to_remove_it(tmp_path):
    queue = SqliteQueue(tmp_path / "queue.db")
    instance = NODES["agent-a"]
    try:
        job = queue.submit(cluster.drill_spec(DrillJob(command=("python", "train.py")), bucket=None, queue_uri="x"))
        follow = cluster._Follower(queue, job.id, lambda line: None, timeout_s=60.0, poll_interval_s=0.0)
        with StubbedAws() as aws:
            aws.expect_experiment(instance, [("completed", None)])
            aws.stub["ec2"].add_client_error("delete_tags", "UnauthorizedOperation", "not allowed", 403)
            with pytest.raises(UserError) as raised:
                cluster._interrupt(
                    aws.client["fis"], aws.client["ec2"], TEMPLATE_ID, instance, follow, stack="s", say=print
                )
            aws.assert_all_asked()
        assert str(raised.value) == (
            f"ec2 DeleteTags {TARGET_TAG} on {instance} failed: UnauthorizedOperation: not allowed; remove the tag "
            f"by hand: aws ec2 delete-tags --resources {instance} --tags Key={TARGET_TAG},Value=true"
        )
    finally:
        queue.close()


def test_a_job_that_fails_before_step_k_aborts_the_drill_before_anything_is_tagged(plane):
    side = Cluster(plane["uri"])

    def crash_at_start() -> None:
        side.job_id = wait_for(lambda: next(iter(side.queue.list_jobs([JobState.QUEUED])), None), 60, "the job").id
        side.form_gang(1, ("agent-a", "agent-b"))
        end = AttemptEnd(state=AttemptState.CRASHED, exit_code=1, reason="exit code 1: ModuleNotFoundError: torch")
        side.queue.end_attempt(side.job_id, 1, end)

    agents = threading.Thread(target=crash_at_start, daemon=True)
    agents.start()
    try:
        with StubbedAws() as aws:
            aws.expect_start()  # and nothing else: no CreateTags, no experiment
            with pytest.raises(DrillAborted, match=r"failed before it reached step 3, so nothing was interrupted"):
                run_drill(plane, aws, [])
            aws.assert_all_asked()
        agents.join(timeout=60)
        assert side.queue.get(side.job_id or "").state is JobState.FAILED  # max_attempts 1: no retry
    finally:
        side.queue.close()
