"""Fixtures shared by every test directory: one moto server (server mode, 127.0.0.1) per session.

Each user resets it (``fresh_aws_account``) so tests never see each other's queues, tables or
buckets, and reaches it the way boto3 on a laptop would reach an emulator: ``AWS_ENDPOINT_URL``
plus fake credentials.
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

AWS_REGION = "us-east-1"
FAKE_AWS = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_SESSION_TOKEN": "testing",
    "AWS_DEFAULT_REGION": AWS_REGION,
}


# Agents under test exit at once after a notice: the 30 s linger keeps /metrics up for a real
# Prometheus's last scrape, and the tests of it ask for it by flag. (Their port stays the default: a busy
# default port only warns, so agents side by side on this host still run.)
os.environ.setdefault("GPUCLOUD_METRICS_LINGER", "0")


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """``-n auto`` (pyproject's addopts): two workers per core, at most 8. Most of the suite's time
    is spent waiting (on subprocesses starting torch, on moto, on agents' poll intervals), so
    workers that overlap their waits finish sooner than one per core; on a loaded machine they also
    keep the suite's fair share of the CPU."""
    return max(2, min(8, 2 * (os.cpu_count() or 1)))


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextlib.contextmanager
def moto_endpoint() -> Iterator[str]:
    """A moto server on 127.0.0.1 in a process of its own (``moto_process.py``: serializable
    DynamoDB transactions); its endpoint URL (the session fixture below, and the benchmarks)."""
    port = free_port()
    server = subprocess.Popen(
        [sys.executable, str(Path(__file__).with_name("moto_process.py")), str(port)],
        stdin=subprocess.PIPE,  # closed when we go, however we go: the server then stops too
    )
    endpoint = f"http://127.0.0.1:{port}"
    try:
        _wait_until_serving(endpoint, server)
        yield endpoint
    finally:
        server.terminate()
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()


def _wait_until_serving(endpoint: str, server: subprocess.Popen, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise RuntimeError(f"the moto server exited with {server.returncode} before serving")
        try:
            urllib.request.urlopen(f"{endpoint}/moto-api/", timeout=2).read()
            return
        except OSError:
            time.sleep(0.05)  # polling a starting server: nothing to wait on but its port
    raise RuntimeError(f"the moto server did not answer on {endpoint} within {timeout:.0f}s")


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
