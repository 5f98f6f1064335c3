"""An IAM policy simulation for the calls a piece of code makes: which of them the given identity
documents would deny.

``record_calls`` notes every AWS API call any boto3 client in the process makes (the call still
goes through, to the moto server); ``denied`` evaluates each call, as the IAM action and resource
AWS authorises it as, against the documents: allowed only by an Allow statement whose action,
resource and conditions all match, and no Deny (AWS's evaluation logic for one identity:
https://docs.aws.amazon.com/IAM/latest/UserGuide/reference_policies_evaluation-logic.html).

Only what the product's documents use is understood; anything else (another service, a condition
operator) raises, so a new call or grant cannot pass unexamined.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fnmatch
from collections.abc import Iterable, Iterator, Mapping
from typing import Any
from urllib.parse import urlparse

import botocore.client

MOTO_ACCOUNT = "123456789012"  # moto's default account

# API operations authorised under another action name (Service Authorization Reference, S3 actions).
_S3_ACTIONS = {
    "ListObjectsV2": "ListBucket",
    "ListObjects": "ListBucket",
    "HeadObject": "GetObject",
    "HeadBucket": "ListBucket",
    "CreateMultipartUpload": "PutObject",
    "UploadPart": "PutObject",
    "CompleteMultipartUpload": "PutObject",
}


@dataclasses.dataclass(frozen=True)
class Call:
    action: str  # e.g. sqs:GetQueueUrl
    resource: str  # the ARN AWS authorises it against
    context: tuple[tuple[str, str], ...] = ()  # condition keys the request sets (s3:prefix)


def call_of(service: str, operation: str, params: Mapping[str, Any], region: str) -> Call:
    """The IAM action and resource of one API call."""
    if service == "sqs":
        name = params["QueueName"] if "QueueName" in params else urlparse(params["QueueUrl"]).path.rsplit("/", 1)[-1]
        account = params.get("QueueOwnerAWSAccountId", MOTO_ACCOUNT)
        return Call(f"sqs:{operation}", f"arn:aws:sqs:{region}:{account}:{name}")
    if service == "dynamodb":
        table = f"arn:aws:dynamodb:{region}:{MOTO_ACCOUNT}:table/{params['TableName']}"
        index = params.get("IndexName")
        return Call(f"dynamodb:{operation}", f"{table}/index/{index}" if index else table)
    if service == "s3":
        action = f"s3:{_S3_ACTIONS.get(operation, operation)}"
        if "Key" in params:
            return Call(action, f"arn:aws:s3:::{params['Bucket']}/{params['Key']}")
        return Call(action, f"arn:aws:s3:::{params['Bucket']}", (("s3:prefix", params.get("Prefix", "")),))
    if service == "sns":
        return Call(f"sns:{operation}", params["TopicArn"])
    raise AssertionError(f"the simulation does not know {service}:{operation}: teach it before granting it")


@contextlib.contextmanager
def record_calls() -> Iterator[list[Call]]:
    """Every API call made by any boto3 client while the block runs, as ``Call``s."""
    calls: list[Call] = []
    original = botocore.client.BaseClient._make_api_call

    def recording(client: Any, operation: str, params: Mapping[str, Any]) -> Any:
        calls.append(call_of(client.meta.service_model.signing_name, operation, params, client.meta.region_name))
        return original(client, operation, params)

    botocore.client.BaseClient._make_api_call = recording  # type: ignore[method-assign]
    try:
        yield calls
    finally:
        botocore.client.BaseClient._make_api_call = original  # type: ignore[method-assign]


def _as_list(value: Any) -> list[str]:
    return [value] if isinstance(value, str) else list(value)


def _conditions_hold(conditions: Mapping[str, Mapping[str, Any]], context: Mapping[str, str]) -> bool:
    for operator, tests in conditions.items():
        for key, wanted in tests.items():
            have = context.get(key)
            if have is None:
                return False
            if operator in ("StringLike", "ArnLike"):
                ok = any(fnmatch.fnmatchcase(have, w) for w in _as_list(wanted))
            elif operator in ("StringEquals", "ArnEquals"):
                ok = have in _as_list(wanted)
            else:
                raise AssertionError(f"the simulation does not know the condition operator {operator}")
            if not ok:
                return False
    return True


def _matches(statement: Mapping[str, Any], call: Call) -> bool:
    service, name = call.action.split(":", 1)
    actions = _as_list(statement["Action"])
    if not any(fnmatch.fnmatchcase(f"{service}:{name}".lower(), a.lower()) for a in actions):
        return False
    if not any(fnmatch.fnmatchcase(call.resource, r) for r in _as_list(statement["Resource"])):
        return False
    return _conditions_hold(statement.get("Condition", {}), dict(call.context))


def allowed(documents: Iterable[Mapping[str, Any]], call: Call) -> bool:
    statements = [s for d in documents for s in d["Statement"]]
    if any(s["Effect"] == "Deny" and _matches(s, call) for s in statements):
        return False
    return any(s["Effect"] == "Allow" and _matches(s, call) for s in statements)


def denied(documents: Iterable[Mapping[str, Any]], calls: Iterable[Call]) -> list[Call]:
    documents = list(documents)
    return [c for c in dict.fromkeys(calls) if not allowed(documents, c)]
