"""A failure in a non-critical call (CloudWatch PutMetricData, the node record) is
logged once and retried later; it never escapes ``Agent.run``, and the agent keeps running jobs.

The CloudWatch client is real: its failures come from botocore's Stubber (AccessDenied, as a node
role without the permission gets) or from a closed port (EndpointConnectionError, as under
``egress: endpoints`` with no ``monitoring`` endpoint)."""

from __future__ import annotations

import logging
import sqlite3
import sys
import threading
from pathlib import Path

import boto3
import pytest
from botocore.config import Config
from botocore.stub import ANY, Stubber

from gpucloud.agent.asg_hooks import AsgHooks, NodeSettings
from gpucloud.agent.identity import NodeIdentity
from gpucloud.agent.loop import Agent, AgentOptions
from gpucloud.jobs.supervisor import SupervisorConfig
from gpucloud.lifecycle.model import JobSpec, JobState, NodeRecord
from gpucloud.queue.sqlite import SqliteQueue
from helpers.notices import Inbox
from helpers.waiting import wait_for

CONFIG = SupervisorConfig(lease_seconds=10.0, ack_timeout=5.0, stop_margin=1.0, kill_after=2.0)
INSTANCE, GROUP = "i-0123456789abcdef0", "gpucloud-dev-spot"
SETTINGS = NodeSettings(
    cluster="dev", node_group="spot", lifecycle_hook="gpucloud-drain", scale_in=False, idle_seconds=600
)
FAKE_AWS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing"}


def _closed_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]  # nothing listens once the socket is closed


def _identity(name: str) -> NodeIdentity:
    return NodeIdentity(worker=name, address="127.0.0.1", instance_id=INSTANCE, instance_type="p4d.24xlarge")


def _options(tmp_path: Path, **extra) -> AgentOptions:
    return AgentOptions(slot_lease=4.0, poll_interval=0.1, run_root=tmp_path / "run", **extra)


def _warnings(caplog, fragment: str) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING and fragment in r.getMessage()]


@pytest.mark.parametrize("failure", ["AccessDenied", "endpoint unreachable"])
def test_a_failing_put_metric_data_is_logged_once_and_the_agent_keeps_running_jobs(
    tmp_path, monkeypatch, caplog, failure
):
    for key, value in FAKE_AWS.items():
        monkeypatch.setenv(key, value)
    caplog.set_level(logging.INFO, logger="gpucloud.agent")
    autoscaling = boto3.client("autoscaling", region_name="us-east-1")
    cloudwatch = boto3.client(
        "cloudwatch",
        region_name="us-east-1",
        endpoint_url=f"http://127.0.0.1:{_closed_port()}" if failure != "AccessDenied" else None,
        config=Config(retries={"max_attempts": 1}, connect_timeout=2, read_timeout=2),
    )
    queue = SqliteQueue(tmp_path / "queue.db")
    with Stubber(autoscaling) as asg, Stubber(cloudwatch) as cw:
        if failure == "AccessDenied":
            cw.add_client_error(
                "put_metric_data",
                service_error_code="AccessDenied",
                service_message="User is not authorized to perform: cloudwatch:PutMetricData",
                http_status_code=403,
                expected_params={"Namespace": "gpucloud", "MetricData": ANY},
            )
        else:
            cw.deactivate()  # the real HTTP path: connection refused -> EndpointConnectionError
        protection = {"InstanceIds": [INSTANCE], "AutoScalingGroupName": GROUP}
        asg.add_response("set_instance_protection", {}, {**protection, "ProtectedFromScaleIn": False})  # idle
        asg.add_response(  # the idle look for a wind-down: a group in service
            "describe_auto_scaling_groups",
            {"AutoScalingGroups": [_group_in_service()]},
            {"AutoScalingGroupNames": [GROUP]},
        )
        for protected in (True, False):  # running the job, then done
            asg.add_response("set_instance_protection", {}, {**protection, "ProtectedFromScaleIn": protected})
        hooks = AsgHooks(
            autoscaling=autoscaling, cloudwatch=cloudwatch, instance_id=INSTANCE, asg_name=GROUP, settings=SETTINGS
        )
        agent = Agent(queue, _identity("metrics-less"), Inbox(), hooks, CONFIG, _options(tmp_path, max_attempts=1))
        outcome: dict = {}
        runner = threading.Thread(target=lambda: outcome.update(summary=agent.run()), daemon=True)
        runner.start()
        wait_for(
            lambda: agent.noncritical.failures >= 1 or not runner.is_alive(),
            timeout=30,
            what="the failed PutMetricData",
        )
        job = queue.submit(JobSpec(command=[sys.executable, "-c", "print('trained')"]))
        runner.join(timeout=120)
        assert not runner.is_alive(), "the agent did not finish its job"
        asg.assert_no_pending_responses()
    assert "summary" in outcome, "Agent.run raised"
    assert outcome["summary"].exit_code == 0 and [r.state for r in outcome["summary"].ran] == ["finished"]
    assert queue.get(job.id).state is JobState.FINISHED
    assert len(_warnings(caplog, "PutMetricData")) == 1


def _group_in_service() -> dict:
    return {
        "AutoScalingGroupName": GROUP,
        "MinSize": 0,
        "MaxSize": 4,
        "DesiredCapacity": 1,
        "DefaultCooldown": 300,
        "AvailabilityZones": ["us-east-1a"],
        "HealthCheckType": "EC2",
        "CreatedTime": "2026-01-01T00:00:00Z",
    }


class FlakyNodeRecords(SqliteQueue):
    """A queue whose node-record writes fail (as a throttled or unreachable job table would)."""

    def register_node(self, record: NodeRecord) -> None:
        raise sqlite3.OperationalError("database is locked")


def test_a_failing_node_record_never_stops_the_agent_and_is_logged_once(tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="gpucloud.agent")
    queue = FlakyNodeRecords(tmp_path / "queue.db")
    job = queue.submit(JobSpec(command=[sys.executable, "-c", "print('trained')"]))
    from gpucloud.agent.asg_hooks import OfflineHooks

    agent = Agent(queue, _identity("recordless"), Inbox(), OfflineHooks(), CONFIG, _options(tmp_path, max_attempts=1))
    summary = agent.run()
    assert summary.exit_code == 0 and [r.state for r in summary.ran] == ["finished"]
    assert queue.get(job.id).state is JobState.FINISHED
    assert agent.noncritical.failures >= 3  # idle, waiting, running, stopped: each tried, each failed
    assert len(_warnings(caplog, "recording this node")) == 1
