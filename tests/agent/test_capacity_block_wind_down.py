"""A capacity block's wind-down (min/max/desired 0) drains busy nodes.

Scale-in never picks an instance protected from scale-in, and every busy node holds that protection,
so the scheduled wind-down alone never reaches them: EC2 takes them at the block's end, unsaved.
The agent sees the wind-down itself while it runs an attempt: the attempt checkpoints and is
requeued, then the node lifts its protection, terminates itself without decrement and completes its
own lifecycle action. Auto Scaling is botocore's Stubber (moto lacks these calls); the training is
the real example script under the real supervisor."""

from __future__ import annotations

import sys
import time

import boto3
import pytest
from botocore.stub import Stubber

from gpucloud.agent.asg_hooks import WIND_DOWN, AsgHooks, NodeSettings, OfflineHooks, wind_down_notice
from gpucloud.agent.identity import NodeIdentity
from gpucloud.agent.loop import EXIT_STOPPED, Agent, AgentOptions
from gpucloud.checkpoint.store import latest_committed
from gpucloud.jobs.supervisor import SupervisorConfig
from gpucloud.lifecycle.model import JobSpec, JobState
from gpucloud.offline.demo import EXAMPLE
from gpucloud.queue.sqlite import SqliteQueue
from gpucloud.signals.events import Notice, event_id_for
from helpers.notices import Inbox

CONFIG = SupervisorConfig(lease_seconds=10.0, ack_timeout=60.0, stop_margin=1.0, kill_after=5.0)
INSTANCE, GROUP, HOOK = "i-0123456789abcdef0", "gpucloud-p5-block", "gpucloud-drain"
SETTINGS = NodeSettings(
    cluster=None, node_group=None, lifecycle_hook=HOOK, scale_in=False, idle_seconds=600, drain_seconds=900
)


def group(*, min_size: int, max_size: int, desired: int) -> dict:
    return {
        "AutoScalingGroupName": GROUP,
        "MinSize": min_size,
        "MaxSize": max_size,
        "DesiredCapacity": desired,
        "DefaultCooldown": 300,
        "AvailabilityZones": ["us-east-1a"],
        "HealthCheckType": "EC2",
        "CreatedTime": "2026-01-01T00:00:00Z",
    }


def own_action() -> dict:
    return {
        "AutoScalingGroupName": GROUP,
        "LifecycleHookName": HOOK,
        "InstanceId": INSTANCE,
        "LifecycleActionResult": "CONTINUE",
    }


def expect_leaving(asg: Stubber) -> None:
    """A wound-down node leaves: protection lifted, terminated without decrement (desired is
    already 0), its own lifecycle action completed with CONTINUE."""
    protection = {"InstanceIds": [INSTANCE], "AutoScalingGroupName": GROUP}
    asg.add_response("set_instance_protection", {}, {**protection, "ProtectedFromScaleIn": False})
    asg.add_response(
        "terminate_instance_in_auto_scaling_group",
        {},
        {"InstanceId": INSTANCE, "ShouldDecrementDesiredCapacity": False},
    )
    asg.add_response("complete_lifecycle_action", {}, own_action())


def test_only_a_group_that_can_hold_no_node_is_a_wind_down():
    assert wind_down_notice(group(min_size=0, max_size=4, desired=0), INSTANCE, now=0.0, drain_seconds=900) is None
    assert wind_down_notice(group(min_size=0, max_size=0, desired=2), INSTANCE, now=0.0, drain_seconds=900) is None
    notice = wind_down_notice(group(min_size=0, max_size=0, desired=0), INSTANCE, now=100.0, drain_seconds=900)
    assert notice is not None and notice.is_stop
    assert (notice.kind, notice.action, notice.deadline) == ("asg-terminate", WIND_DOWN, 1000.0)
    assert notice.payload["instance-id"] == INSTANCE


@pytest.mark.slow
def test_a_busy_node_of_a_wound_down_group_saves_requeues_and_leaves(tmp_path, monkeypatch):
    for key, value in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing"}.items():
        monkeypatch.setenv(key, value)
    autoscaling = boto3.client("autoscaling", region_name="us-east-1")
    cloudwatch = boto3.client("cloudwatch", region_name="us-east-1")
    queue = SqliteQueue(tmp_path / "queue.db")
    durable = tmp_path / "durable"
    # 3000 steps of 20 ms: about a minute, so without the wind-down drain the job finishes unsaved-by-notice
    command = [sys.executable, str(EXAMPLE), "--steps", "3000", "--step-seconds", "0.02", "--every-steps", "5"]
    job = queue.submit(JobSpec(command=command, checkpoint_uri=str(durable)))
    with Stubber(autoscaling) as asg, Stubber(cloudwatch):
        protection = {"InstanceIds": [INSTANCE], "AutoScalingGroupName": GROUP}
        asg.add_response("set_instance_protection", {}, {**protection, "ProtectedFromScaleIn": True})
        # The scheduled action has run: the group may hold no node, but this one is protected.
        asg.add_response(
            "describe_auto_scaling_groups",
            {"AutoScalingGroups": [group(min_size=0, max_size=0, desired=0)]},
            {"AutoScalingGroupNames": [GROUP]},
        )
        # After the commit: the node is InService (protected), so it has no lifecycle action yet.
        asg.add_client_error(
            "complete_lifecycle_action",
            service_error_code="ValidationError",
            service_message=f"No active Lifecycle Action found with instance ID {INSTANCE}",
            http_status_code=400,
            expected_params=own_action(),
        )
        # Leaving: protection lifted, terminated without decrement (desired is already 0), CONTINUE.
        expect_leaving(asg)
        hooks = AsgHooks(
            autoscaling=autoscaling, cloudwatch=cloudwatch, instance_id=INSTANCE, asg_name=GROUP, settings=SETTINGS
        )
        hooks.sleep = lambda seconds: None
        agent = Agent(
            queue,
            NodeIdentity(worker="block-node", address="127.0.0.1", instance_id=INSTANCE, instance_type="p5.48xlarge"),
            Inbox(),
            hooks,
            CONFIG,
            AgentOptions(
                slot_lease=4.0, poll_interval=0.1, run_root=tmp_path / "run", group_check_interval=0.2, max_attempts=1
            ),
        )
        summary = agent.run()
        asg.assert_no_pending_responses()
    assert (summary.exit_code, summary.stopped_by) == (EXIT_STOPPED, "asg-terminate")
    assert [r.exit_code for r in summary.ran] == [EXIT_STOPPED]  # checkpointed and requeued
    after = queue.get(job.id)
    assert (after.state, after.attempt) == (JobState.QUEUED, 2)
    assert latest_committed(str(durable), job.id) is not None


class CompletionLog(OfflineHooks):
    def __init__(self) -> None:
        self.completed = 0

    def committed(self, instance_id=None, action=None) -> bool:
        self.completed += 1
        return True


def test_an_idle_node_the_group_terminates_completes_its_lifecycle_action_at_once(tmp_path):
    # An idle node of a wound-down group is unprotected: the group terminates it through the drain
    # hook, and IMDS says Terminated. Nothing to save, so CONTINUE now, not after the hook's timeout.
    inbox, hooks = Inbox(), CompletionLog()
    inbox.put(
        Notice(
            kind="asg-terminate",
            source="imds",
            deadline=time.time() + 600,
            received_at=time.time(),
            event_id=event_id_for("asg-terminate", {"state": "Terminated"}),
            action="Terminated",
        )
    )
    agent = Agent(
        SqliteQueue(tmp_path / "queue.db"),
        NodeIdentity(worker="idle-node", address="127.0.0.1", instance_id=INSTANCE),
        inbox,
        hooks,
        CONFIG,
        AgentOptions(slot_lease=4.0, poll_interval=0.1, run_root=tmp_path / "run", idle_exit=30.0),
    )
    summary = agent.run()
    assert summary.stopped_by == "asg-terminate"
    assert hooks.completed == 1


def test_an_idle_node_of_a_wound_down_group_takes_no_more_work_and_leaves(tmp_path, monkeypatch):
    # Otherwise it could claim the attempt a busy peer of the same block just requeued, and lose it
    # again when EC2 reclaims the block.
    for key, value in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing"}.items():
        monkeypatch.setenv(key, value)
    autoscaling = boto3.client("autoscaling", region_name="us-east-1")
    cloudwatch = boto3.client("cloudwatch", region_name="us-east-1")
    with Stubber(autoscaling) as asg, Stubber(cloudwatch):
        protection = {"InstanceIds": [INSTANCE], "AutoScalingGroupName": GROUP}
        asg.add_response("set_instance_protection", {}, {**protection, "ProtectedFromScaleIn": False})
        asg.add_response(
            "describe_auto_scaling_groups",
            {"AutoScalingGroups": [group(min_size=0, max_size=0, desired=0)]},
            {"AutoScalingGroupNames": [GROUP]},
        )
        expect_leaving(asg)
        hooks = AsgHooks(
            autoscaling=autoscaling, cloudwatch=cloudwatch, instance_id=INSTANCE, asg_name=GROUP, settings=SETTINGS
        )
        agent = Agent(
            SqliteQueue(tmp_path / "queue.db"),
            NodeIdentity(worker="idle-block-node", address="127.0.0.1", instance_id=INSTANCE),
            Inbox(),
            hooks,
            CONFIG,
            AgentOptions(slot_lease=4.0, poll_interval=0.1, run_root=tmp_path / "run", idle_exit=60.0),
        )
        summary = agent.run()
        asg.assert_no_pending_responses()
    assert (summary.stopped_by, summary.ran) == ("asg-terminate", ())


def test_an_idle_node_of_a_block_marked_ending_takes_no_more_work_and_stays(tmp_path, monkeypatch, caplog):
    """The expiry warning reaches one agent, which marks the block's group (gpucloud:block-ending).
    Every other agent there sees the mark at its group check: an idle one claims nothing more (a
    just-requeued attempt would die with the block, unsaved) and does not leave: EC2 ends the block's
    instances itself, and the group would only launch a replacement into the dying block."""
    from gpucloud.cluster.agent_contract import BLOCK_ENDING_TAG
    from gpucloud.signals.eventbridge import CAPACITY_BLOCK_ACTION

    for key, value in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing"}.items():
        monkeypatch.setenv(key, value)
    queue = SqliteQueue(tmp_path / "queue.db")
    autoscaling = boto3.client("autoscaling", region_name="us-east-1")
    cloudwatch = boto3.client("cloudwatch", region_name="us-east-1")
    marked = {
        **group(min_size=0, max_size=2, desired=2),
        "Tags": [{"Key": BLOCK_ENDING_TAG, "Value": f"cr-0123456789abcdef0 {time.time() + 600:.0f}"}],
    }
    with Stubber(autoscaling) as asg, Stubber(cloudwatch):
        asg.add_response(
            "describe_auto_scaling_groups", {"AutoScalingGroups": [marked]}, {"AutoScalingGroupNames": [GROUP]}
        )
        hooks = AsgHooks(
            autoscaling=autoscaling, cloudwatch=cloudwatch, instance_id=INSTANCE, asg_name=GROUP, settings=SETTINGS
        )
        hooks.busy = lambda busy: None  # type: ignore[method-assign]  # protection is not what is tested here
        said: list[dict] = []
        agent = Agent(
            queue,
            NodeIdentity(worker="idle-block-node", address="127.0.0.1", instance_id=INSTANCE),
            Inbox(),
            hooks,
            CONFIG,
            AgentOptions(slot_lease=4.0, poll_interval=0.1, run_root=tmp_path / "run", idle_exit=60.0),
            status=said.append,
        )
        summary = agent.run()  # the first idle round checks the group
        asg.assert_no_pending_responses()
    assert summary.stopped_by == "asg-terminate" and summary.ran == ()
    assert agent.stop_notice is not None and agent.stop_notice.action == CAPACITY_BLOCK_ACTION
    assert not [s for s in said if "left" in s]  # no detach or terminate: EC2 ends the block's instances
    # and no lifecycle action to complete (the Stubber would refuse the call, logged as a failure)
    assert not [r for r in caplog.records if r.levelname == "WARNING" and "failed" in r.getMessage()]
