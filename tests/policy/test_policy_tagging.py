"""Every taggable resource carries gpucloud:stack naming its stack; ASG tags must propagate."""

from __future__ import annotations

from policy_args import check_resource

from gpucloud.policy.tagging import is_taggable

ASG = "aws:autoscaling/group:Group"


def test_tagged_resource_passes():
    assert (
        check_resource(
            "tagged-with-stack",
            "aws:sqs/queue:Queue",
            {"tags": {"gpucloud:stack": "dev", "gpucloud:cluster": "dev"}},
            stack="dev",
        )
        == []
    )


def test_untagged_resource_fails():
    assert check_resource("tagged-with-stack", "aws:ec2/vpc:Vpc", {"cidrBlock": "10.0.0.0/16"}, stack="dev") == [
        "missing tag 'gpucloud:stack'; tag it with the stack name ('dev')"
    ]


def test_tag_naming_another_stack_fails():
    messages = check_resource("tagged-with-stack", "aws:ec2/vpc:Vpc", {"tags": {"gpucloud:stack": "prod"}}, stack="dev")
    assert messages == ["tag 'gpucloud:stack' is 'prod' but the resource belongs to stack 'dev'"]


def test_untaggable_types_are_skipped():
    assert is_taggable("aws:iam/rolePolicyAttachment:RolePolicyAttachment") is False
    assert is_taggable("aws:ec2/launchTemplate:LaunchTemplate") is True
    assert check_resource("tagged-with-stack", "aws:s3/bucketPolicy:BucketPolicy", {"policy": "{}"}) == []
    assert check_resource("tagged-with-stack", "gpucloud:cluster:Cluster", {}) == []  # components


def test_asg_tag_list_must_propagate():
    tags = [
        {"key": "gpucloud:stack", "value": "dev", "propagateAtLaunch": True},
        {"key": "Name", "value": "nodes", "propagateAtLaunch": True},
    ]
    assert check_resource("tagged-with-stack", ASG, {"tags": tags}, stack="dev") == []
    tags[0]["propagateAtLaunch"] = False
    assert check_resource("tagged-with-stack", ASG, {"tags": tags}, stack="dev") == [
        "tag 'gpucloud:stack' must set propagateAtLaunch true so the group's instances carry it"
    ]
    assert check_resource("tagged-with-stack", ASG, {"tags": tags[1:]}, stack="dev")


def test_provider_default_tags_count():
    assert check_resource("tagged-with-stack", "aws:ec2/vpc:Vpc", {"tagsAll": {"gpucloud:stack": "dev"}}) == []
