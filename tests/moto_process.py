"""A moto server in a process of its own, on 127.0.0.1, with serializable DynamoDB transactions.

Run by ``conftest.moto_endpoint`` as ``python tests/moto_process.py PORT``. In its own process the
emulator works on the other core and never competes for the test process's GIL: the AWS-backed
tests (agents, gangs, trials) spend most of their time waiting on it.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import signal
import sys
import threading
from collections.abc import Iterator

# moto 5.2.5 serves requests on concurrent threads, and its TransactWriteItems is not atomic
# against them: it snapshots whole tables, applies the items one by one, and on a cancellation
# restores the snapshot, which erases any write another request committed in between (seen here as
# two racing requeues both "applied"). Real DynamoDB transactions are serializable. One lock
# around moto's item operations gives the emulator that property; our code is not touched.
_SERIALIZED = ("put_item", "get_item", "query", "scan", "update_item", "delete_item", "transact_write_items")


@contextlib.contextmanager
def serialized_dynamodb() -> Iterator[None]:
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


def serve(port: int) -> None:
    """Serve until SIGTERM (or the parent closes our stdin: the parent died without stopping us)."""
    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # not a line per request on the test's stderr
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    threading.Thread(target=lambda: (sys.stdin.read(), stop.set()), daemon=True).start()
    with serialized_dynamodb():
        server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
        server.start()
        try:
            stop.wait()
        finally:
            server.stop()


if __name__ == "__main__":
    serve(int(sys.argv[1]))
