"""The AWS queue URI: ``aws://REGION?table=TABLE&queue=QUEUE_URL`` (pure parsing, one-line errors).

On a cluster node the stack's environment names all three (``GPUCLOUD_REGION``,
``GPUCLOUD_JOB_TABLE``, ``GPUCLOUD_JOB_QUEUE_URL``), and ``uri_from_env`` builds the URI from it
so `gpucloud jobs` works there with no flags.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from urllib.parse import parse_qs, quote, urlsplit

from gpucloud.errors import UserError

FORM = "aws://REGION?table=TABLE&queue=QUEUE_URL"
EXAMPLE = "aws://us-east-1?table=prod-jobs&queue=https://sqs.us-east-1.amazonaws.com/123456789012/prod-jobs"
REGION_ENV = "GPUCLOUD_REGION"
TABLE_ENV = "GPUCLOUD_JOB_TABLE"
QUEUE_URL_ENV = "GPUCLOUD_JOB_QUEUE_URL"

_REGION = re.compile(r"[a-z]{2}(-[a-z]+)+-\d{1,2}")
_TABLE = re.compile(r"[A-Za-z0-9_.-]{3,255}")  # DynamoDB table names
# https://sqs.<region>.amazonaws.com/<account>/<name>; any http(s) host, for endpoints such as
# VPC interface endpoints and local emulators. Queue names: 1-80 of letters, digits, - and _.
_QUEUE_PATH = re.compile(r"/[0-9]{12}/[A-Za-z0-9_-]{1,80}(\.fifo)?")
_PARAMS = ("table", "queue", "wait")
MAX_WAIT_S = 20  # SQS long-poll maximum


@dataclasses.dataclass(frozen=True)
class AwsQueueAddress:
    region: str
    table: str
    queue_url: str
    wait_seconds: int = 1  # long poll of one claim: short enough for a worker's idle loop

    @property
    def uri(self) -> str:
        wait = "" if self.wait_seconds == 1 else f"&wait={self.wait_seconds}"
        return f"aws://{self.region}?table={self.table}&queue={quote(self.queue_url, safe=':/')}{wait}"


def parse_aws_uri(uri: str) -> AwsQueueAddress:
    def bad(problem: str) -> UserError:
        return UserError(f"queue URI {uri!r}: {problem}; use {FORM}, e.g. {EXAMPLE}")

    parts = urlsplit(uri)
    if parts.scheme != "aws":
        raise bad("the scheme is not aws://")
    region = parts.netloc
    if not _REGION.fullmatch(region):
        raise bad(f"{region!r} is not an AWS region (like us-east-1)")
    if parts.path not in ("", "/"):
        raise bad(
            f"the region is followed by a path {parts.path!r}; name the table and queue with ?table=...&queue=..."
        )
    try:
        params = parse_qs(parts.query, keep_blank_values=True, strict_parsing=bool(parts.query))
    except ValueError:
        raise bad("the query is not NAME=VALUE pairs joined by &") from None
    unknown = sorted(set(params) - set(_PARAMS))
    if unknown:
        raise bad(f"unknown parameter {unknown[0]!r} (allowed: {', '.join(_PARAMS)})")
    for name, values in params.items():
        if len(values) > 1:
            raise bad(f"{name} is given {len(values)} times")
    table = params.get("table", [""])[0]
    queue_url = params.get("queue", [""])[0]
    if not table:
        raise bad("table= is missing")
    if not _TABLE.fullmatch(table):
        raise bad(f"table {table!r} is not a DynamoDB table name (3-255 of letters, digits, '_', '-', '.')")
    if not queue_url:
        raise bad("queue= is missing")
    queue = urlsplit(queue_url)
    if queue.scheme not in ("https", "http") or not queue.netloc or not _QUEUE_PATH.fullmatch(queue.path):
        raise bad(f"queue {queue_url!r} is not an SQS queue URL (https://HOST/ACCOUNT/NAME)")
    wait_text = params.get("wait", ["1"])[0]
    if not wait_text.isdigit() or int(wait_text) > MAX_WAIT_S:
        raise bad(f"wait {wait_text!r} is not whole seconds from 0 to {MAX_WAIT_S}")
    return AwsQueueAddress(region=region, table=table, queue_url=queue_url, wait_seconds=int(wait_text))


def uri_from_env(env: Mapping[str, str]) -> str | None:
    """The node's queue URI from the stack's environment, or None when the node has none of it.

    Half of it is a mistake worth naming (a bootstrap that lost a variable), not a silent fallback
    to the embedded queue, which would quietly run jobs nobody else can see.
    """
    values = {name: env.get(name, "") for name in (REGION_ENV, TABLE_ENV, QUEUE_URL_ENV)}
    if not any(values.values()):
        return None
    missing = [name for name, value in values.items() if not value]
    if missing:
        raise UserError(
            f"the AWS job queue needs {', '.join(values)}; {', '.join(missing)} is not set (set it, or pass --queue)"
        )
    address = AwsQueueAddress(region=values[REGION_ENV], table=values[TABLE_ENV], queue_url=values[QUEUE_URL_ENV])
    return parse_aws_uri(address.uri).uri
