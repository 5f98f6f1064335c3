"""LATEST that is not a regular file (a FIFO, a device, a socket, a link to one): restore and
``checkpoint.load`` answer at once with one line, instead of blocking on the open forever (a FIFO)
or reading without end (``/dev/zero``)."""

from __future__ import annotations

import os
import socket
import threading
from collections.abc import Callable
from pathlib import Path

import pytest
from test_restore_faults import _copy, _restore, committed_job, tiny_job_module  # noqa: F401 - fixtures

from gpucloud.checkpoint import load
from gpucloud.errors import UserError

DEADLINE_S = 30.0


def _fifo(latest: Path) -> None:
    os.mkfifo(latest)


def _dev_zero(latest: Path) -> None:
    latest.symlink_to("/dev/zero")


def _dev_null(latest: Path) -> None:
    latest.symlink_to("/dev/null")


def _socket(latest: Path) -> None:
    server = socket.socket(socket.AF_UNIX)
    server.bind(str(latest))
    server.close()


def _link_to_fifo(latest: Path) -> None:
    os.mkfifo(latest.with_name("elsewhere"))
    latest.symlink_to("elsewhere")


FAULTS: dict[str, Callable[[Path], None]] = {
    "a FIFO": _fifo,
    "a link to /dev/zero": _dev_zero,
    "a link to /dev/null": _dev_null,
    "a socket": _socket,
    "a link to a FIFO": _link_to_fifo,
}


def _within_deadline(work: Callable[[], object]) -> BaseException | None:
    caught: list[BaseException] = []

    def run() -> None:
        try:
            work()
        except BaseException as err:  # noqa: BLE001 - handed to the test thread
            caught.append(err)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(DEADLINE_S)
    assert not thread.is_alive(), f"blocked for more than {DEADLINE_S} s"
    return caught[0] if caught else None


@pytest.mark.parametrize("name", sorted(FAULTS))
def test_latest_that_is_not_a_regular_file_is_one_line_at_once(committed_job, tmp_path, tiny_job_module, name):
    uri, job_dir = _copy(committed_job, tmp_path / "ck")
    (job_dir / "LATEST").unlink()
    FAULTS[name](job_dir / "LATEST")
    try:
        for work in (lambda: _restore(tiny_job_module, uri), lambda: load(str(job_dir), tiny_job_module(uri).model)):
            err = _within_deadline(work)
            assert isinstance(err, UserError), repr(err)
            assert "LATEST" in str(err) and "not a regular file" in str(err) and "\n" not in str(err)
    finally:
        for fifo in (job_dir / "LATEST", job_dir / "elsewhere"):
            if fifo.is_fifo():  # let a reader blocked on it go
                os.close(os.open(fifo, os.O_RDWR | os.O_NONBLOCK))
