"""gpucloud:job-id on every instance, volume and network interface a job runs on, while it runs
(so AWS's cost allocation tags can confirm each job's dollars), against EC2 in the moto server; a
tagging failure never fails the job."""

from __future__ import annotations

import json
import logging
import sys
import textwrap
from pathlib import Path

import boto3
import pytest
from botocore.config import Config

from gpucloud.agent.asg_hooks import OfflineHooks
from gpucloud.agent.identity import NodeIdentity
from gpucloud.agent.job_tags import JOB_TAG, JobTagger, tagger_for
from gpucloud.agent.loop import Agent, AgentOptions
from gpucloud.jobs.supervisor import SupervisorConfig
from gpucloud.lifecycle.model import JobSpec, JobState
from gpucloud.queue.sqlite import SqliteQueue
from helpers.notices import Inbox

CONFIG = SupervisorConfig(lease_seconds=10.0, ack_timeout=5.0, stop_margin=1.0, kill_after=2.0)
REGION = "us-east-1"


@pytest.fixture
def node(fresh_aws_account):
    """A moto instance with its root volume, a second attached volume and a second interface."""
    ec2 = boto3.client("ec2", region_name=REGION)
    vpc = ec2.create_vpc(CidrBlock="10.0.0.0/16")["Vpc"]["VpcId"]
    subnet = ec2.create_subnet(VpcId=vpc, CidrBlock="10.0.0.0/24", AvailabilityZone="us-east-1a")["Subnet"]
    image = ec2.describe_images(Owners=["amazon"])["Images"][0]["ImageId"]
    instance = ec2.run_instances(
        ImageId=image,
        MinCount=1,
        MaxCount=1,
        InstanceType="p4d.24xlarge",
        SubnetId=subnet["SubnetId"],
        BlockDeviceMappings=[{"DeviceName": "/dev/sda1", "Ebs": {"VolumeSize": 8}}],
        TagSpecifications=[{"ResourceType": "instance", "Tags": [{"Key": "gpucloud:cluster", "Value": "dev"}]}],
    )["Instances"][0]["InstanceId"]
    volume = ec2.create_volume(Size=10, AvailabilityZone="us-east-1a")["VolumeId"]
    ec2.attach_volume(VolumeId=volume, InstanceId=instance, Device="/dev/sdf")
    eni = ec2.create_network_interface(SubnetId=subnet["SubnetId"])["NetworkInterface"]["NetworkInterfaceId"]
    ec2.attach_network_interface(NetworkInterfaceId=eni, InstanceId=instance, DeviceIndex=1)
    return ec2, instance, volume, eni


def job_tags(ec2, resources) -> dict[str, str]:
    found = ec2.describe_tags(Filters=[{"Name": "key", "Values": [JOB_TAG]}])["Tags"]
    return {t["ResourceId"]: t["Value"] for t in found if t["ResourceId"] in resources}


def test_the_tagger_tags_the_instance_its_volumes_and_interfaces_then_removes_the_tag(node):
    ec2, instance, volume, eni = node
    tagger = JobTagger(ec2, instance)
    tagged = tagger.tag("j-1")
    assert {instance, volume, eni} <= set(tagged) and any(r.startswith("vol-") and r != volume for r in tagged)
    assert any(r.startswith("eni-") and r != eni for r in tagged)  # the primary interface too
    assert job_tags(ec2, tagged) == dict.fromkeys(tagged, "j-1")
    tagger.untag()
    assert job_tags(ec2, tagged) == {}
    tagger.untag()  # nothing tagged: nothing to do


def test_the_removal_names_the_jobs_value_so_a_later_jobs_tag_stays(node):
    ec2, instance, _, _ = node
    first, second = JobTagger(ec2, instance), JobTagger(ec2, instance)
    tagged = first.tag("j-1")
    second.tag("j-2")  # e.g. a late removal of j-1 racing the next attempt's tag
    first.untag()
    assert job_tags(ec2, tagged) == dict.fromkeys(tagged, "j-2")


def test_a_running_attempt_sees_its_node_tagged_and_the_tag_is_gone_after(node, tmp_path):
    ec2, instance, volume, eni = node
    seen = tmp_path / "seen.json"
    probe = tmp_path / "probe.py"
    probe.write_text(
        textwrap.dedent(
            f"""
            import json, os, boto3
            ec2 = boto3.client("ec2", region_name="{REGION}")
            tags = ec2.describe_tags(Filters=[{{"Name": "key", "Values": ["{JOB_TAG}"]}}])["Tags"]
            with open({str(seen)!r}, "w") as fh:
                json.dump({{t["ResourceId"]: t["Value"] for t in tags}}, fh)
            """
        )
    )
    queue = SqliteQueue(tmp_path / "q.db")
    job = queue.submit(JobSpec(command=[sys.executable, str(probe)]))
    identity = NodeIdentity(worker="a1", address="127.0.0.1", instance_id=instance, region=REGION)
    agent = Agent(
        queue,
        identity,
        Inbox(),
        OfflineHooks(),
        CONFIG,
        AgentOptions(poll_interval=0.1, run_root=tmp_path / "run", max_attempts=1),
        job_tags=JobTagger(ec2, instance),
    )
    agent.run()
    assert queue.get(job.id).state is JobState.FINISHED
    while_running = json.loads(seen.read_text())
    assert {while_running[r] for r in (instance, volume, eni)} == {job.id}
    assert job_tags(ec2, [instance, volume, eni]) == {}
    queue.close()


def test_a_tagging_failure_is_logged_once_and_never_fails_the_job(tmp_path, caplog, monkeypatch):
    for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.setenv(key, "testing")
    caplog.set_level(logging.WARNING, logger="gpucloud.agent")
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # nothing listens once closed
    unreachable = boto3.client(
        "ec2",
        region_name=REGION,
        endpoint_url=f"http://127.0.0.1:{port}",
        config=Config(retries={"max_attempts": 1}, connect_timeout=2, read_timeout=2),
    )
    queue = SqliteQueue(tmp_path / "q.db")
    jobs = [queue.submit(JobSpec(command=[sys.executable, "-c", "pass"])) for _ in range(2)]
    agent = Agent(
        queue,
        NodeIdentity(worker="a1", address="127.0.0.1", instance_id="i-0123456789abcdef0", region=REGION),
        Inbox(),
        OfflineHooks(),
        CONFIG,
        AgentOptions(poll_interval=0.1, run_root=tmp_path / "run", max_attempts=2),
        job_tags=JobTagger(unreachable, "i-0123456789abcdef0"),
    )
    agent.run()
    assert [queue.get(j.id).state for j in jobs] == [JobState.FINISHED, JobState.FINISHED]
    warnings = [r.getMessage() for r in caplog.records if JOB_TAG in r.getMessage() and r.levelno >= logging.WARNING]
    assert len(warnings) == 1 and "tagging this node" in warnings[0]  # once, though both attempts failed
    queue.close()


def test_only_a_cluster_node_tags(monkeypatch):
    me = NodeIdentity(worker="a1", address="127.0.0.1", instance_id="i-0123456789abcdef0", region=REGION)
    assert tagger_for(me, OfflineHooks()) is None  # off a group: nothing is tagged
    assert tagger_for(NodeIdentity(worker="a1", address="127.0.0.1"), object()) is None


def test_the_agent_of_a_path_without_tags_needs_none(tmp_path: Path):
    agent = Agent(
        SqliteQueue(tmp_path / "q.db"),
        NodeIdentity(worker="a1", address="127.0.0.1"),
        Inbox(),
        OfflineHooks(),
        CONFIG,
        AgentOptions(poll_interval=0.1, run_root=tmp_path / "run"),
    )
    assert agent.job_tags is None
