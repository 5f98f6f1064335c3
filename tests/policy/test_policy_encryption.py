"""Storage encryption at rest: EBS in launch templates, volumes, DynamoDB, SQS; FSx needs nothing."""

from __future__ import annotations

import pytest
from policy_args import check_resource

LT = "aws:ec2/launchTemplate:LaunchTemplate"


def root_device(encrypted) -> dict:
    ebs = {"volumeSize": 200.0, "volumeType": "gp3"}
    if encrypted is not None:
        ebs["encrypted"] = encrypted
    return {"deviceName": "/dev/sda1", "ebs": ebs}


def test_encrypted_root_volume_passes():
    assert check_resource("storage-encrypted", LT, {"blockDeviceMappings": [root_device("true")]}) == []


@pytest.mark.parametrize("encrypted", ["false", None, False])
def test_unencrypted_root_volume_fails(encrypted):
    messages = check_resource("storage-encrypted", LT, {"blockDeviceMappings": [root_device(encrypted)]})
    assert messages == ["EBS volume /dev/sda1 in blockDeviceMappings is not encrypted; set ebs.encrypted to 'true'"]


def test_instance_store_mappings_are_not_ebs():
    props = {"blockDeviceMappings": [{"deviceName": "/dev/sdb", "virtualName": "ephemeral0"}]}
    assert check_resource("storage-encrypted", LT, props) == []


def test_dynamodb_table():
    table = "aws:dynamodb/table:Table"
    assert check_resource("storage-encrypted", table, {"serverSideEncryption": {"enabled": True}}) == []
    messages = check_resource("storage-encrypted", table, {"billingMode": "PAY_PER_REQUEST"})
    assert len(messages) == 1 and "serverSideEncryption.enabled" in messages[0]


@pytest.mark.parametrize("props", [{"sqsManagedSseEnabled": True}, {"kmsMasterKeyId": "alias/aws/sqs"}])
def test_encrypted_queue_passes(props):
    assert check_resource("storage-encrypted", "aws:sqs/queue:Queue", props) == []


def test_unencrypted_queue_fails():
    messages = check_resource("storage-encrypted", "aws:sqs/queue:Queue", {"sqsManagedSseEnabled": False})
    assert len(messages) == 1 and "sqsManagedSseEnabled" in messages[0] and "kmsMasterKeyId" in messages[0]


def test_ebs_volume():
    assert check_resource("storage-encrypted", "aws:ebs/volume:Volume", {"encrypted": True, "size": 100.0}) == []
    assert check_resource("storage-encrypted", "aws:ebs/volume:Volume", {"size": 100.0})


def test_fsx_lustre_is_always_encrypted_at_rest():
    # FSx for Lustre encrypts every deployment type at rest; kmsKeyId only chooses the key
    props = {"deploymentType": "PERSISTENT_2", "storageCapacity": 2400.0}
    assert check_resource("storage-encrypted", "aws:fsx/lustreFileSystem:LustreFileSystem", props) == []
