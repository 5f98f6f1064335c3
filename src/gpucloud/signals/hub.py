"""One event stream from every interruption source, deduplicated by ``Notice.event_id``.

Sources (the IMDS poller, SIGTERM/SIGINT to this process, queue-mode events through ``publish``)
push Notices in; one consumer (the supervisor) takes them out with ``get``. As in
aws-node-termination-handler, monitors only observe and the one handler acts.

Signal handlers run on the main thread between two bytecodes, possibly while that thread is inside
``get`` or ``publish``. They therefore take no lock: they put into a ``queue.SimpleQueue`` (whose
``put`` is documented reentrant, safe in a signal handler) and ``get`` drops duplicates.
"""

from __future__ import annotations

import logging
import os
import queue
import signal
import threading
import time
from collections.abc import Callable
from types import FrameType
from typing import Any

from gpucloud.signals.events import Notice, event_id_for
from gpucloud.signals.imds import ImdsClient
from gpucloud.signals.interpret import InterpretRules
from gpucloud.signals.poller import ImdsPoller

log = logging.getLogger("gpucloud.signals")

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


def signal_notice(signum: int, grace: float, now: float) -> Notice:
    """SIGTERM/SIGINT to this process: stop by now + ``grace``. One notice per signal kind per process."""
    name = signal.Signals(signum).name
    return Notice(
        kind="sigterm",
        source="signal",
        deadline=now + grace,
        received_at=now,
        event_id=event_id_for("sigterm", {"signal": name, "pid": os.getpid()}),
        action=name,
        payload={"signal": name, "grace_seconds": grace},
    )


class SignalHub:
    def __init__(self, *, clock: Callable[[], float] = time.time) -> None:
        self._clock = clock
        # (notice, dedupe_on_get): signal-handler notices are deduplicated by the consumer.
        self._queue: queue.SimpleQueue[tuple[Notice, bool]] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._seen: set[str] = set()
        self._pollers: list[ImdsPoller] = []
        self._previous_handlers: dict[int, Any] = {}
        self._started = False

    # -- sources -------------------------------------------------------------------------------
    def add_imds(
        self,
        endpoint: str | None,
        interval: float = 1.0,
        *,
        rules: InterpretRules = InterpretRules(),
        connect_timeout: float = 1.0,
        read_timeout: float = 2.0,
    ) -> ImdsPoller:
        """Watch IMDS at ``endpoint`` (None: ``$AWS_EC2_METADATA_SERVICE_ENDPOINT`` or the default)."""
        client = ImdsClient(endpoint, connect_timeout=connect_timeout, read_timeout=read_timeout)
        poller = ImdsPoller(client, interval=interval, on_notice=self._publish_quietly, clock=self._clock, rules=rules)
        self._pollers.append(poller)
        if self._started:
            poller.start()
        return poller

    def add_os_signals(self, grace: float) -> None:
        """Make SIGTERM and SIGINT to this process a ``sigterm`` notice with deadline now + ``grace``.

        Must be called from the main thread (Python delivers signals only there). The previous
        handlers come back on ``stop``.
        """
        if grace < 0:
            raise ValueError(f"grace must be >= 0 seconds, got {grace}")
        if threading.current_thread() is not threading.main_thread():
            raise RuntimeError("SignalHub.add_os_signals must be called from the main thread")

        def on_signal(signum: int, frame: FrameType | None) -> None:
            self._queue.put((signal_notice(signum, grace, self._clock()), True))  # no lock: see module doc

        for signum in STOP_SIGNALS:
            previous = signal.signal(signum, on_signal)
            self._previous_handlers.setdefault(signum, previous)

    def _publish_quietly(self, notice: Notice) -> None:
        self.publish(notice)  # a poller only hands notices over; whether one was a duplicate is ours

    def publish(self, notice: Notice) -> bool:
        """Add a notice from any source; False (and nothing queued) when its event_id was seen."""
        with self._lock:
            if notice.event_id in self._seen:
                return False
            self._seen.add(notice.event_id)
        self._queue.put((notice, False))
        return True

    # -- lifecycle -----------------------------------------------------------------------------
    def start(self) -> None:
        self._started = True
        for poller in self._pollers:
            if not poller.running:
                poller.start()

    def stop(self) -> None:
        """Stop the pollers; on the main thread also put the previous signal handlers back."""
        self._started = False
        for poller in self._pollers:
            poller.stop()
        if threading.current_thread() is threading.main_thread():
            for signum, previous in self._previous_handlers.items():
                signal.signal(signum, previous if previous is not None else signal.SIG_DFL)
            self._previous_handlers.clear()

    def __enter__(self) -> SignalHub:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def pollers(self) -> list[ImdsPoller]:
        return list(self._pollers)

    # -- the stream ----------------------------------------------------------------------------
    def get(self, timeout: float | None = None) -> Notice | None:
        """The next new notice, waiting up to ``timeout`` seconds (None: forever); None on timeout."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
            try:
                notice, dedupe = self._queue.get(timeout=remaining) if remaining != 0.0 else self._queue.get_nowait()
            except queue.Empty:
                return None
            if not dedupe:
                return notice  # already deduplicated by publish
            with self._lock:
                if notice.event_id in self._seen:
                    continue
                self._seen.add(notice.event_id)
            log.warning(
                "%s received: stopping by deadline in %.1fs", notice.action, notice.seconds_left(self._clock()) or 0.0
            )
            return notice
