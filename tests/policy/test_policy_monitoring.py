"""The policy pack on monitoring: the monitor's variants of the instance, volume, ingress and IAM rules
are caught, and so are wildcard actions and a public alert topic. Each check has the case that passes
and the one that must fail; the last tests break one resource of a planned self-hosted stack."""

from __future__ import annotations

import dataclasses
import json
from functools import cache

import pytest
from policy_args import check_resource

from gpucloud.infra.preview import preview_stack
from gpucloud.policy.runner import run_policies
from gpucloud.spec import load_stack_file, stack_file_for

INSTANCE = "aws:ec2/instance:Instance"
TOPIC = "aws:sns/topic:Topic"
TOPIC_POLICY = "aws:sns/topicPolicy:TopicPolicy"
ROLE_POLICY = "aws:iam/rolePolicy:RolePolicy"
ROLE = "aws:iam/role:Role"
MONITOR = {
    "associatePublicIpAddress": False,
    "metadataOptions": {"httpTokens": "required"},
    "rootBlockDevice": {"encrypted": True, "volumeSize": 16.0},
}


def document(*statements: dict) -> str:
    return json.dumps({"Version": "2012-10-17", "Statement": list(statements)})


# --- encryption ----------------------------------------------------------------------------------


def test_encrypted_monitor_passes():
    assert check_resource("storage-encrypted", INSTANCE, MONITOR) == []


@pytest.mark.parametrize("root", [{"encrypted": False}, {}, None])
def test_unencrypted_instance_root_fails(root):
    messages = check_resource("storage-encrypted", INSTANCE, {**MONITOR, "rootBlockDevice": root})
    assert messages == ["instance rootBlockDevice is not encrypted; set encrypted to true"]


def test_unencrypted_instance_data_device_fails():
    props = {**MONITOR, "ebsBlockDevices": [{"deviceName": "/dev/sdf", "encrypted": True}, {"deviceName": "/dev/sdg"}]}
    assert check_resource("storage-encrypted", INSTANCE, props) == [
        "instance ebsBlockDevices[1] is not encrypted; set encrypted to true"
    ]


def test_alert_topic_must_be_encrypted():
    assert check_resource("storage-encrypted", TOPIC, {"kmsMasterKeyId": "alias/aws/sns"}) == []
    assert check_resource("storage-encrypted", TOPIC, {"name": "alerts"}) == [
        "SNS topic is not encrypted; give a kmsMasterKeyId (alias/aws/sns or a customer key)"
    ]


def test_unencrypted_tsdb_volume_fails():
    assert check_resource("storage-encrypted", "aws:ebs/volume:Volume", {"size": 20.0, "type": "gp3"}) == [
        "EBS volume is not encrypted; set encrypted to true"
    ]


# --- no public access ------------------------------------------------------------------------------


def test_monitor_with_a_public_ip_fails():
    assert check_resource("no-public-ips", INSTANCE, MONITOR) == []
    assert check_resource("no-public-ips", INSTANCE, {**MONITOR, "associatePublicIpAddress": True})


def test_monitor_without_imdsv2_fails():
    assert check_resource("imdsv2-required", INSTANCE, {**MONITOR, "metadataOptions": {"httpTokens": "optional"}})


def test_grafana_open_to_the_internet_fails():
    rule = {"securityGroupId": "sg-monitor", "ipProtocol": "tcp", "fromPort": 3000.0, "toPort": 3000.0}
    ingress = "aws:vpc/securityGroupIngressRule:SecurityGroupIngressRule"
    assert check_resource("no-internet-ingress", ingress, {**rule, "referencedSecurityGroupId": "sg-x"}) == []
    assert check_resource("no-internet-ingress", ingress, {**rule, "cidrIpv4": "0.0.0.0/0"}) == [
        "ingress (tcp 3000) is open to 0.0.0.0/0; allow only security groups, prefix lists or private CIDRs "
        "(nodes are reached through SSM)"
    ]


@pytest.mark.parametrize("principal", ["*", {"AWS": "*"}, {"AWS": ["arn:aws:iam::1:root", "*"]}])
def test_alert_topic_open_to_everyone_fails(principal):
    statement = {"Sid": "Open", "Effect": "Allow", "Principal": principal, "Action": "sns:Publish", "Resource": "t"}
    for kind in (TOPIC_POLICY, TOPIC):
        assert check_resource("sns-topic-not-public", kind, {"policy": document(statement)}) == [
            "topic policy statement Open allows every principal ('*') with no condition; name the service or "
            "account that publishes (e.g. aps.amazonaws.com with aws:SourceArn)"
        ]


def test_alert_topic_for_a_service_or_with_a_condition_passes():
    service = {"Effect": "Allow", "Principal": {"Service": "aps.amazonaws.com"}, "Action": "sns:Publish"}
    conditioned = {
        "Effect": "Allow",
        "Principal": "*",
        "Action": "sns:Publish",
        "Condition": {"StringEquals": {"aws:SourceAccount": "123456789012"}},
    }
    assert check_resource("sns-topic-not-public", TOPIC_POLICY, {"policy": document(service, conditioned)}) == []


# --- least privilege -------------------------------------------------------------------------------


@pytest.mark.parametrize("action", ["*", "sns:*", "ec2:Describe*", ["sns:Publish", "s3:Get*"]])
def test_wildcard_actions_fail(action):
    statement = {"Sid": "Wide", "Effect": "Allow", "Action": action, "Resource": ["arn:aws:sns:us-east-1:1:t"]}
    messages = check_resource("no-iam-wildcard-actions", ROLE_POLICY, {"policy": document(statement)})
    assert len(messages) == 1 and messages[0].startswith("policy statement Wide allows wildcard actions")


def test_not_action_fails_and_inline_role_policies_are_checked():
    statement = {"Sid": "AllBut", "Effect": "Allow", "NotAction": "iam:*", "Resource": "*"}
    props = {"inlinePolicies": [{"name": "wide", "policy": document(statement)}]}
    assert check_resource("no-iam-wildcard-actions", ROLE, props) == [
        "inlinePolicies[wide] statement AllBut allows wildcard actions NotAction; name each action the role "
        "calls (least privilege)"
    ]


def test_named_actions_and_wildcard_denies_pass():
    named = {"Effect": "Allow", "Action": ["ec2:DescribeInstances"], "Resource": ["*"]}
    deny = {"Effect": "Deny", "Action": "s3:*", "Resource": "*"}
    assert check_resource("no-iam-wildcard-actions", ROLE_POLICY, {"policy": document(named, deny)}) == []


# --- the planned self-hosted stack, one resource broken at a time ----------------------------------


@cache
def planned():
    stack = "p5-capacity-block"
    return stack, preview_stack(load_stack_file(stack_file_for(stack)), stack)


def broken(match, change) -> list[str]:
    stack, preview = planned()
    resources = [dataclasses.replace(r, inputs=change(dict(r.inputs))) if match(r) else r for r in preview.resources]
    assert any(match(r) for r in preview.resources)
    return [v.policy for v in run_policies(resources, stack=stack)]


def test_the_planned_monitor_passes():
    stack, preview = planned()
    assert any(r.type == INSTANCE for r in preview.resources)
    assert run_policies(preview.resources, stack=stack) == []


def test_planned_monitor_with_a_public_ip_is_caught():
    assert broken(lambda r: r.type == INSTANCE, lambda p: {**p, "associatePublicIpAddress": True}) == ["no-public-ips"]


def test_planned_tsdb_volume_unencrypted_is_caught():
    def change(p):
        return {**p, "encrypted": False}

    assert broken(lambda r: r.type == "aws:ebs/volume:Volume", change) == ["storage-encrypted"]


def test_planned_monitor_role_widened_is_caught():
    def widen(p):
        doc = json.loads(p["policy"])
        doc["Statement"][1]["Action"] = ["sns:*"]
        return {**p, "policy": json.dumps(doc)}

    assert broken(lambda r: r.type == ROLE_POLICY and r.name.endswith("monitoring-access"), widen) == [
        "no-iam-wildcard-actions"
    ]
