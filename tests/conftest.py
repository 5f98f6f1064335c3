"""Fixtures shared by every test directory: one moto server (server mode, 127.0.0.1) per session.

Each user resets it (``fresh_aws_account``) so tests never see each other's queues, tables or
buckets, and reaches it the way boto3 on a laptop would reach an emulator: ``AWS_ENDPOINT_URL``
plus fake credentials.
"""

from __future__ import annotations

import contextlib
import functools
import socket
import threading
import urllib.request
from collections.abc import Iterator

import pytest

AWS_REGION = "us-east-1"
FAKE_AWS = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_SESSION_TOKEN": "testing",
    "AWS_DEFAULT_REGION": AWS_REGION,
}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


# moto 5.2.5 serves requests on concurrent threads, and its TransactWriteItems is not atomic
# against them: it snapshots whole tables, applies the items one by one, and on a cancellation
# restores the snapshot, which erases any write another request committed in between (seen here as
# two racing requeues both "applied"). Real DynamoDB transactions are serializable. One lock
# around moto's item operations gives the emulator that property; our code is not touched.
_SERIALIZED = ("put_item", "get_item", "query", "scan", "update_item", "delete_item", "transact_write_items")


@contextlib.contextmanager
def _serialized_dynamodb() -> Iterator[None]:
    from moto.dynamodb.models import DynamoDBBackend

    lock = threading.RLock()
    originals = {name: getattr(DynamoDBBackend, name) for name in _SERIALIZED}

    def locked(method):
        @functools.wraps(method)
        def call(*args, **kwargs):
            with lock:
                return method(*args, **kwargs)

        return call

    for name, method in originals.items():
        setattr(DynamoDBBackend, name, locked(method))
    try:
        yield
    finally:
        for name, method in originals.items():
            setattr(DynamoDBBackend, name, method)


@contextlib.contextmanager
def moto_endpoint() -> Iterator[str]:
    """A moto server on 127.0.0.1 with serializable DynamoDB transactions; its endpoint URL (the
    session fixture below, and ``benchmarks/bench_fleet.py --backend aws``)."""
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=free_port(), verbose=False)
    with _serialized_dynamodb():
        server.start()
        host, port = server.get_host_and_port()
        try:
            yield f"http://{host}:{port}"
        finally:
            server.stop()


def reset_account(endpoint: str) -> None:
    """moto keeps its backends in process-global state: empty the whole account."""
    urllib.request.urlopen(urllib.request.Request(f"{endpoint}/moto-api/reset", method="POST")).read()


@pytest.fixture(scope="session")
def moto_server() -> Iterator[str]:
    """One moto server for the session (it takes a second to start); its endpoint URL."""
    with moto_endpoint() as endpoint:
        yield endpoint


@pytest.fixture
def fresh_aws_account(moto_server: str, monkeypatch: pytest.MonkeyPatch) -> str:
    """The moto server reset to an empty account, with boto3 pointed at it; its endpoint URL."""
    for name, value in {**FAKE_AWS, "AWS_ENDPOINT_URL": moto_server}.items():
        monkeypatch.setenv(name, value)
    for name in ("AWS_PROFILE", "AWS_CONFIG_FILE", "AWS_SHARED_CREDENTIALS_FILE"):
        monkeypatch.delenv(name, raising=False)
    reset_account(moto_server)  # every test starts from an empty account
    return moto_server
