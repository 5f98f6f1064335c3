"""Stop requests through the job table: how a notice reaches every member of a gang.

A stop notice is seen by one node (its IMDS, or the events-queue handler of any agent when the
noticed node's agent is dead). That node records it on the running attempt
(``JobQueue.request_stop``: once per attempt, conditional on the attempt still running), and every
member's supervisor reads it through ``TableNotices``, which wraps the node's own notice source.
The supervisor then flags its ranks exactly as for a local notice, so the ranks' collective makes
every rank of the gang -- orphaned ranks of a dead agent's node included -- save the same step, and
the attempt ends REQUEUED on every member instead of crashing when a peer disappears.

The in-band path (the flag on one node spread by the ranks' all_reduce) stays the fast one; the
table is the path that does not depend on the noticed node's agent or ranks being alive.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable

from gpucloud.jobs.runner import NoticeSource
from gpucloud.queue.protocol import JobQueue
from gpucloud.signals.events import Notice

log = logging.getLogger("gpucloud.agent")

POLL_INTERVAL = 1.0  # seconds between reads of the attempt's stop request (one consistent read each)


def request_gang_stop(
    queue: JobQueue, job_id: str, attempt: int, notice: Notice, *, instance_id: str | None = None
) -> bool:
    """Record ``notice`` as the stop request of the running attempt (idempotent: False when a
    request was already recorded, or the attempt is no longer running). ``instance_id`` names the
    noticed node when the notice's payload does not (IMDS notices carry no instance id)."""
    if instance_id is not None and "instance-id" not in notice.payload:
        notice = dataclasses.replace(notice, payload={**notice.payload, "instance-id": instance_id})
    applied = queue.request_stop(job_id, attempt, notice)
    log.info(
        "%s notice: stop of %s attempt %d %s",
        notice.kind,
        job_id,
        attempt,
        "requested for the gang" if applied else "already requested (or the attempt ended)",
    )
    return applied


class TableNotices:
    """The supervisor's notice source for one attempt: the node's own ``source``, plus the attempt's
    stop request from the job table, polled every ``interval`` seconds until it is found.

    The request is yielded once. A member that saw the notice itself already handled its
    ``event_id`` and ignores the copy; ``on_table_notice`` is told of the request as it is yielded
    (the agent uses it to treat a request about its own instance as its own notice). A failed read
    is logged and retried at the next interval: the supervisor's loop must not stop for it.
    ``first`` is a notice the node already took (e.g. while its gang formed), yielded before anything.
    """

    def __init__(
        self,
        source: NoticeSource,
        queue: JobQueue,
        job_id: str,
        attempt: int,
        *,
        interval: float = POLL_INTERVAL,
        on_table_notice: Callable[[Notice], None] | None = None,
        first: Notice | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if interval <= 0:
            raise ValueError(f"the stop-request poll interval must be more than 0 seconds, got {interval}")
        self.source, self.queue, self.job_id, self.attempt = source, queue, job_id, attempt
        self.interval, self.on_table_notice, self._clock = interval, on_table_notice, clock
        self._next_read = clock()  # read at once: a request may predate this attempt's supervisor
        self._found: Notice | None = None
        self._last_error: str | None = None
        self._first = first

    @property
    def found(self) -> Notice | None:
        """The stop request read from the table, once it was."""
        return self._found

    def get(self, timeout: float) -> Notice | None:
        if self._first is not None:
            first, self._first = self._first, None
            return first
        if self._found is None and self._clock() >= self._next_read:
            self._next_read = self._clock() + self.interval
            notice = self._read()
            if notice is not None:
                self._found = notice
                if self.on_table_notice is not None:
                    self.on_table_notice(notice)
                return notice
        return self.source.get(timeout)

    def _read(self) -> Notice | None:
        try:
            notice = self.queue.stop_request(self.job_id, self.attempt)
        except Exception as err:  # noqa: BLE001 - any read failure: the next poll retries; never stop supervising
            line = " ".join(str(err).split()) or type(err).__name__
            if line != self._last_error:  # once per distinct failure, not once a second
                log.warning(
                    "reading the stop request of %s attempt %d failed: %s; retrying every %.0fs",
                    self.job_id,
                    self.attempt,
                    line,
                    self.interval,
                )
            self._last_error = line
            return None
        self._last_error = None
        return notice
