"""The job table's key design, shared by the stack (``infra/jobplane.py``) and the AWS queue backend.

Kept free of pulumi and boto3 so a node imports it cheaply and the stack cannot drift from the code
that reads the table. One table, one partition per job (single-table design):

=========================  =====================================================================
``pk``                     ``sk``
=========================  =====================================================================
``job#<id>``               ``meta`` — the job: spec, state, current attempt, crashes, lease, the
                           held slot message; carries the ``by-state`` index keys
``job#<id>``               ``attempt#000001`` — one item per attempt (history, never deleted)
``job#<id>``               ``event#<written ns>#<writer>`` — one timeline event each (append-only)
=========================  =====================================================================

The ``by-state`` global secondary index (hash ``job_state``, range ``created_key``) lists jobs by
state, oldest first; only meta items carry its keys, so attempts and events stay out of it.
``expires_at`` is the table's TTL attribute: gpucloud never sets it (nothing is lost by default);
an operator may set it on ended jobs to age them out.
"""

from __future__ import annotations

HASH_KEY = "pk"
RANGE_KEY = "sk"
STATE_INDEX = "by-state"
STATE_INDEX_HASH_KEY = "job_state"
STATE_INDEX_RANGE_KEY = "created_key"
TTL_ATTRIBUTE = "expires_at"

# (attribute name, DynamoDB scalar type) for every key attribute of the table and its index.
KEY_ATTRIBUTES: tuple[tuple[str, str], ...] = (
    (HASH_KEY, "S"),
    (RANGE_KEY, "S"),
    (STATE_INDEX_HASH_KEY, "S"),
    (STATE_INDEX_RANGE_KEY, "S"),
)


def create_table_request(table_name: str) -> dict:
    """The ``CreateTable`` request of the table the stack declares (used by tests and by operators
    who create the table by hand; the stack builds the same shape with pulumi's typed args)."""
    return {
        "TableName": table_name,
        "BillingMode": "PAY_PER_REQUEST",
        "AttributeDefinitions": [{"AttributeName": n, "AttributeType": t} for n, t in KEY_ATTRIBUTES],
        "KeySchema": [
            {"AttributeName": HASH_KEY, "KeyType": "HASH"},
            {"AttributeName": RANGE_KEY, "KeyType": "RANGE"},
        ],
        "GlobalSecondaryIndexes": [
            {
                "IndexName": STATE_INDEX,
                "KeySchema": [
                    {"AttributeName": STATE_INDEX_HASH_KEY, "KeyType": "HASH"},
                    {"AttributeName": STATE_INDEX_RANGE_KEY, "KeyType": "RANGE"},
                ],
                "Projection": {"ProjectionType": "ALL"},
            }
        ],
        "SSESpecification": {"Enabled": True},
    }
