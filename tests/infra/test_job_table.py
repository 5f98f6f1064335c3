"""The stack's job table is the table the AWS queue backend reads (one key design, in aws_schema)."""

from __future__ import annotations

import pytest

from gpucloud.queue.aws import schema as aws_schema
from gpucloud.queue.aws.schema import create_table_request

from .conftest import SHIPPED


@pytest.mark.parametrize("stack", SHIPPED)
def test_the_planned_job_table_has_the_backends_keys_and_index(previews, stack: str) -> None:
    [table] = [r.inputs for r in previews[stack].of_type("aws:dynamodb/table:Table")]
    assert (table["hashKey"], table["rangeKey"]) == (aws_schema.HASH_KEY, aws_schema.RANGE_KEY)
    assert {(a["name"], a["type"]) for a in table["attributes"]} == set(aws_schema.KEY_ATTRIBUTES)
    [index] = table["globalSecondaryIndexes"]
    assert index["name"] == aws_schema.STATE_INDEX and index["projectionType"] == "ALL"
    assert [(k["attributeName"], k["keyType"]) for k in index["keySchemas"]] == [
        (aws_schema.STATE_INDEX_HASH_KEY, "HASH"),
        (aws_schema.STATE_INDEX_RANGE_KEY, "RANGE"),
    ]
    assert table["ttl"] == {"attributeName": aws_schema.TTL_ATTRIBUTE, "enabled": True}
    assert table["billingMode"] == "PAY_PER_REQUEST"


def test_the_create_table_request_matches_the_stack() -> None:
    request = create_table_request("t")
    assert [k["AttributeName"] for k in request["KeySchema"]] == [aws_schema.HASH_KEY, aws_schema.RANGE_KEY]
    assert {(a["AttributeName"], a["AttributeType"]) for a in request["AttributeDefinitions"]} == set(
        aws_schema.KEY_ATTRIBUTES
    )
    assert request["GlobalSecondaryIndexes"][0]["IndexName"] == aws_schema.STATE_INDEX
