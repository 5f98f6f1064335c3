"""The node role: only the actions the runtime calls, never a send to the events queue, and the
policy in place before any group can launch a node."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpucloud.infra import preview as preview_module
from gpucloud.infra.preview import preview_stack
from gpucloud.spec import load_stack_file, stack_file_for

from .test_endpoints import node_sources

ROLE_POLICY = "aws:iam/rolePolicy:RolePolicy"
ASG = "aws:autoscaling/group:Group"
QUEUE = "aws:sqs/queue:Queue"
SRC = Path(__file__).resolve().parents[2] / "src" / "gpucloud"

# Granted before, called nowhere in the runtime (grep: no call of set_desired_capacity, no
# LifecycleHeartbeat is started, no list_multipart_uploads).
NEVER_CALLED = (
    "autoscaling:SetDesiredCapacity",
    "autoscaling:RecordLifecycleActionHeartbeat",
    "s3:ListBucketMultipartUploads",
    "s3:ListMultipartUploadParts",
    "s3:GetBucketLocation",
)


def statements(preview) -> list[dict]:
    (policy,) = [p for p in preview.of_type(ROLE_POLICY) if p.name.endswith("-node-access")]  # not the monitor's
    return json.loads(policy.inputs["policy"])["Statement"]


def queue_arn(preview, suffix: str) -> str:
    (queue,) = [q for q in preview.of_type(QUEUE) if q.name.endswith(suffix)]
    return f"arn:aws:sqs:us-east-1:123456789012:{queue.name}"


def granted(preview, resource: str) -> set[str]:
    return {
        action
        for s in statements(preview)
        if s["Effect"] == "Allow" and resource in s["Resource"]
        for action in s["Action"]
    }


@pytest.mark.parametrize("stack", ["dev", "p4d-spot", "p5-capacity-block"])
def test_actions_the_runtime_never_calls_are_not_granted(previews, stack: str) -> None:
    actions = {a for s in statements(previews[stack]) for a in s["Action"]}
    assert not actions & set(NEVER_CALLED)
    assert "autoscaling:CompleteLifecycleAction" in actions  # the drain (and the idle scale-in) complete it


def test_the_runtime_indeed_never_calls_them() -> None:
    runtime = node_sources()
    assert ".set_desired_capacity(" not in runtime
    assert "LifecycleHeartbeat(" not in runtime.replace("class LifecycleHeartbeat(", "")
    assert "list_multipart_uploads" not in runtime
    assert ".list_parts(" not in runtime and "get_bucket_location" not in runtime


@pytest.mark.parametrize("stack", ["dev", "p4d-spot", "p5-capacity-block"])
def test_nodes_cannot_send_to_the_events_queue(previews, stack: str) -> None:
    events = queue_arn(previews[stack], "-jobplane-events")
    assert "sqs:SendMessage" not in granted(previews[stack], events)
    assert {"sqs:ReceiveMessage", "sqs:DeleteMessage", "sqs:ChangeMessageVisibility"} <= granted(
        previews[stack], events
    )


def test_the_dead_letter_queue_the_agent_looks_up_is_granted(previews) -> None:
    """queue/aws/backend.py reads the job queue's redrive policy, then GetQueueUrl of its
    dead-letter queue, and moves poison messages there with SendMessage: both on the DLQ."""
    runtime = (SRC / "queue" / "aws" / "backend.py").read_text() + (SRC / "queue" / "aws" / "slot_box.py").read_text()
    assert "get_queue_url(" in runtime and "QueueUrl=self.dead_letter_url" in runtime
    preview = previews["p4d-spot"]
    dlq = queue_arn(preview, "-jobplane-jobs-dlq")
    assert granted(preview, dlq) == {"sqs:GetQueueUrl", "sqs:SendMessage"}
    jobs = queue_arn(preview, "-jobplane-jobs")
    assert "sqs:GetQueueUrl" not in granted(preview, jobs)  # looked up nowhere: the URL is in node.env


def test_every_group_waits_for_the_node_policy(monkeypatch) -> None:
    dependencies: dict[str, list[str]] = {}
    base = preview_module._ParentRecordingMonitor

    class Recording(base):  # type: ignore[misc,valid-type]
        def RegisterResource(self, request):
            response = super().RegisterResource(request)
            dependencies[response.urn] = list(request.dependencies)
            return response

    monkeypatch.setattr(preview_module, "_ParentRecordingMonitor", Recording)
    preview = preview_stack(load_stack_file(stack_file_for("p4d-spot")), "p4d-spot")
    (policy,) = [p for p in preview.of_type(ROLE_POLICY) if p.name.endswith("-node-access")]
    asgs = preview.of_type(ASG)
    assert asgs and all(policy.urn in dependencies[asg.urn] for asg in asgs)
    order = [r.urn for r in preview.resources]
    assert all(order.index(policy.urn) < order.index(asg.urn) for asg in asgs)


@pytest.mark.parametrize("stack", ["dev", "p4d-spot", "p5-capacity-block"])
def test_describe_instances_is_granted_once(previews, stack: str) -> None:
    """Every stack's agent describes its own instance for its volumes and interfaces (job tags);
    agent/events_handler.py also looks up a block's instances at its expiry warning. One statement
    serves both: a second grant of the same action is noise a reviewer has to reconcile."""
    sids = [s["Sid"] for s in statements(previews[stack]) if "ec2:DescribeInstances" in s["Action"]]
    assert sids == ["FindInstances"], stack


@pytest.mark.parametrize("stack", ["dev", "p4d-spot", "p5-capacity-block"])
def test_nodes_may_set_only_the_job_id_tag_and_only_on_this_clusters_resources(previews, stack: str) -> None:
    """agent/job_tags.py: CreateTags/DeleteTags of gpucloud:job-id on the node's instance, volumes and
    interfaces, which the launch template tags with the cluster; no other key, no other resource, and
    never a DeleteTags without tags (which would delete every user tag)."""
    preview = previews[stack]
    [tagging] = [s for s in statements(preview) if s["Sid"] == "JobTags"]
    assert sorted(tagging["Action"]) == ["ec2:CreateTags", "ec2:DeleteTags"]
    assert tagging["Resource"] == [
        f"arn:aws:ec2:us-east-1:123456789012:{kind}/*" for kind in ("instance", "volume", "network-interface")
    ]
    templates = [r for r in preview.resources if r.type == "aws:ec2/launchTemplate:LaunchTemplate"]
    tagged = [{spec["resourceType"]: spec["tags"] for spec in t.inputs["tagSpecifications"]} for t in templates]
    [cluster] = {t[kind]["gpucloud:cluster"] for t in tagged for kind in ("instance", "volume", "network-interface")}
    assert cluster and tagging["Condition"] == {
        "StringEquals": {"aws:ResourceTag/gpucloud:cluster": cluster},
        "ForAllValues:StringEquals": {"aws:TagKeys": ["gpucloud:job-id"]},
        "Null": {"aws:TagKeys": "false"},
    }


def test_the_runtime_makes_the_tag_calls_it_is_granted() -> None:
    runtime = (SRC / "agent" / "job_tags.py").read_text()
    assert ".describe_instances(InstanceIds=[self.instance_id])" in runtime
    assert ".create_tags(" in runtime and ".delete_tags(" in runtime and "Tags=[{" in runtime


@pytest.mark.parametrize("stack", ["dev", "p5-capacity-block"])
def test_only_a_stack_with_a_block_may_mark_its_groups_and_only_with_that_key(previews, stack: str) -> None:
    """agent/asg_hooks.py mark_block_ending: CreateOrUpdateTags of gpucloud:block-ending, this stack's groups."""
    from gpucloud.cluster.agent_contract import BLOCK_ENDING_TAG

    marks = [s for s in statements(previews[stack]) if "autoscaling:CreateOrUpdateTags" in s["Action"]]
    if stack == "dev":
        assert marks == []
        return
    [mark] = marks
    assert mark["Action"] == ["autoscaling:CreateOrUpdateTags"]
    assert mark["Condition"]["ForAllValues:StringEquals"] == {"aws:TagKeys": [BLOCK_ENDING_TAG]}
    assert mark["Condition"]["StringEquals"]["autoscaling:ResourceTag/gpucloud:stack"] == stack
