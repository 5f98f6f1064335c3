"""Where snapshots are kept, and how a node gets one back.

At ``submit`` (``store_for``): where the nodes can read it.

* The job's checkpoints go to a bucket (``--checkpoint-uri s3://BUCKET/...``), or this machine is a
  cluster node (``GPUCLOUD_CHECKPOINT_BUCKET`` in node.env): ``s3://BUCKET/code/<hash>.tar.gz``.
  The nodes' instance role reads and writes the whole checkpoint bucket (``infra/iam.py``). The
  stack's ``storage.checkpointBucket.expiryDays`` rule covers the whole bucket, ``code/`` too: a
  job resumed after that many days finds its snapshot gone and fails saying so (submit it again).
* Else, on an embedded (SQLite) queue, whose workers all run on this machine:
  ``$GPUCLOUD_HOME/code/<hash>.tar.gz``, next to ``queue.db``.
* Else (an ``aws://`` queue and no bucket known here): a one-line error naming what to give.

The name is the tree's hash, so a tree already stored is not uploaded again (one ``HeadObject``).
"""

from __future__ import annotations

import dataclasses
import os
import shutil
from pathlib import Path
from typing import Any

from gpucloud.errors import UserError, error_line
from gpucloud.jobs.code.snapshot import Snapshot, archive_name
from gpucloud.regular_files import open_regular

CODE_PREFIX = "code"


class CodeUnavailable(Exception):
    """The snapshot cannot be fetched or is not what the job recorded; ``str`` is one line."""


def local_code_dir() -> Path:
    from gpucloud.home import gpucloud_home

    return gpucloud_home() / CODE_PREFIX


@dataclasses.dataclass(frozen=True)
class Stored:
    uri: str
    uploaded: bool  # False: the same tree was stored already


def code_bucket(checkpoint_uri: str | None) -> str | None:
    """The bucket snapshots go to: the job's checkpoint bucket, else the cluster's (node.env)."""
    from gpucloud.checkpoint.placement import ClusterStorage

    if checkpoint_uri and checkpoint_uri.startswith("s3://"):
        return checkpoint_uri[len("s3://") :].split("/", 1)[0] or None
    return ClusterStorage.from_env(os.environ).bucket


def store(snapshot: Snapshot, *, checkpoint_uri: str | None, queue_uri: str) -> Stored:
    """Keep ``snapshot`` where the queue's nodes can read it (see the module's docstring)."""
    from gpucloud.checkpoint.placement import BUCKET_ENV, queue_spans_hosts

    bucket = code_bucket(checkpoint_uri)
    if bucket is not None:
        return _put_s3(snapshot, bucket)
    if queue_spans_hosts(queue_uri):
        raise UserError(
            "--workdir on an aws:// queue needs a bucket the nodes can read: give --checkpoint-uri s3://BUCKET/PREFIX "
            f"(the snapshot goes to s3://BUCKET/{CODE_PREFIX}/), or set {BUCKET_ENV} to the stack's checkpointBucket "
            "output (pulumi stack output checkpointBucket)"
        )
    target = local_code_dir() / snapshot.name
    if target.exists():
        return Stored(str(target), uploaded=False)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.{os.getpid()}")
    shutil.copyfile(snapshot.archive, tmp)
    tmp.replace(target)
    return Stored(str(target), uploaded=True)


def s3_client() -> Any:
    import boto3  # honours AWS_ENDPOINT_URL (moto in tests)
    from botocore.config import Config

    return boto3.client("s3", config=Config(retries={"mode": "standard", "max_attempts": 5}))


def _put_s3(snapshot: Snapshot, bucket: str) -> Stored:
    from botocore.exceptions import BotoCoreError, ClientError

    key = f"{CODE_PREFIX}/{snapshot.name}"
    uri = f"s3://{bucket}/{key}"
    client = s3_client()
    try:
        client.head_object(Bucket=bucket, Key=key)
        return Stored(uri, uploaded=False)
    except ClientError as err:
        if err.response.get("Error", {}).get("Code") not in ("404", "NoSuchKey", "NotFound"):
            raise UserError(f"cannot check {uri}: {error_line(err)}") from None
    except BotoCoreError as err:
        raise UserError(f"cannot reach s3://{bucket}: {error_line(err)}") from None
    try:
        client.upload_file(str(snapshot.archive), bucket, key, ExtraArgs={"ContentType": "application/gzip"})
    except (BotoCoreError, ClientError) as err:
        raise UserError(f"cannot upload the workdir snapshot to {uri}: {error_line(err)}") from None
    return Stored(uri, uploaded=True)


def archive_limit(size_bytes: int) -> int:
    """The most bytes a snapshot whose files total ``size_bytes`` (the job's record) can take as a
    .tar.gz: gzip adds a few bytes per 32 KiB block of data it cannot compress, tar 512 to 1535 per
    member (whose headers compress well); the fixed part covers a tree of many small files."""
    return size_bytes + size_bytes // 64 + (64 << 20)


_COPY_CHUNK = 1 << 20


def fetch(uri: str, dest: Path, *, max_bytes: int) -> None:
    """Copy the archive at ``uri`` (``s3://...`` or a path) to ``dest``, or raise ``CodeUnavailable``.
    Never more than ``max_bytes``: a record can name anything (``/dev/zero``, a huge object), and
    the job's recorded size tells how large its archive can be (``archive_limit``)."""
    too_large = f"the job's code {uri} is larger than the {max_bytes} bytes its recorded size allows (refused)"
    if uri.startswith("s3://"):
        from botocore.exceptions import BotoCoreError, ClientError

        bucket, _, key = uri[len("s3://") :].partition("/")
        try:
            answer = s3_client().get_object(Bucket=bucket, Key=key)
            if int(answer.get("ContentLength") or 0) > max_bytes:
                answer["Body"].close()
                raise CodeUnavailable(too_large)
            _copy_bounded(answer["Body"], dest, max_bytes, too_large)
        except (BotoCoreError, ClientError) as err:
            raise CodeUnavailable(f"cannot download the job's code {uri}: {error_line(err)}") from None
        return
    try:  # a regular file only: a device or a FIFO would never end
        with open_regular(uri) as source:
            _copy_bounded(source, dest, max_bytes, too_large)
    except OSError as err:
        raise CodeUnavailable(f"cannot read the job's code {uri}: {err.strerror}") from None


def _copy_bounded(source: Any, dest: Path, max_bytes: int, too_large: str) -> None:
    copied = 0
    with open(dest, "wb") as out:
        while chunk := source.read(_COPY_CHUNK):
            copied += len(chunk)
            if copied > max_bytes:
                raise CodeUnavailable(too_large)
            out.write(chunk)


def expected_name(sha256: str) -> str:
    return archive_name(sha256)
