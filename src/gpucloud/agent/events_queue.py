"""Queue mode: consume the cluster's events queue (EventBridge rules and lifecycle hooks -> SQS).

``EventsQueueConsumer.poll_once`` long-polls the queue, turns each body into a ``Notice``
(``event_messages.parse_message``) and hands it to ``on_notice``. Acknowledgement follows NTH:

- a notice is deleted only after ``on_notice`` returned without raising, so ``on_notice`` should
  return once the action is done (checkpoint committed, job requeued); if it raises, or the process
  dies, the message reappears after the visibility timeout and is handled again (the notice's
  ``event_id`` is stable, so a hub or job table dedupes the second delivery);
- skips (hook test notifications, launch actions, reports) are deleted;
- a capacity block's expiration warning names a reservation, not an instance: it goes to
  ``on_reservation`` (fleet level), acknowledged the same way as a notice;
- unreadable bodies are logged as one line and kept: after the queue's maxReceiveCount they move
  to the dead-letter queue, where a person can read them; nothing is lost, nothing crashes, and
  the other messages of the same receive are handled as if it were not there (each message is
  handled on its own; whatever one raises is that message's failure only);
- notices about instances outside ``instance_ids`` are made visible again at once for the consumer
  that owns them. Every receive counts toward maxReceiveCount, so on a queue shared by many nodes
  run fleet-level consumers (``instance_ids=None``), or per-node consumers on per-node queues;
- a message is received hidden for only ``RECEIVE_VISIBILITY`` seconds and hidden for the full
  ``visibility_timeout`` just before its handler runs. A consumer that dies during a long poll
  (its node's agent killed) may still be handed a message by SQS; it comes back within seconds
  for a live consumer instead of after the handler's whole visibility timeout -- for a spot
  warning, after the node is gone.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

from botocore.exceptions import BotoCoreError, ClientError

from gpucloud.aws_ids import check_instance_id
from gpucloud.errors import UserError, error_line
from gpucloud.signals.eventbridge import (
    QueueRules,
    ReservationExpiring,
    Skipped,
    UnreadableEvent,
    instance_of,
    parse_message,
)
from gpucloud.signals.events import Notice

log = logging.getLogger("gpucloud.agent")

DEFAULT_VISIBILITY_TIMEOUT = 150  # s: a handler that blocks through the 2-minute spot lead finishes first
RECEIVE_VISIBILITY = 5  # s: how long a received message stays hidden until its handler starts (ample: parsing takes ms)
_RETRY_AFTER_ERROR = 5.0  # s between polls after the queue itself failed


@dataclasses.dataclass
class PollResult:
    """What one ``poll_once`` did, message by message."""

    received: int = 0
    handled: list[Notice] = dataclasses.field(default_factory=list)  # on_notice returned; deleted
    reservations: list[ReservationExpiring] = dataclasses.field(default_factory=list)  # on_reservation returned
    failed: list[str] = dataclasses.field(default_factory=list)  # on_notice raised; kept for redelivery
    skipped: list[str] = dataclasses.field(default_factory=list)  # nothing to do; deleted
    unreadable: list[str] = dataclasses.field(default_factory=list)  # bad body; kept for the DLQ
    passed_on: list[str] = dataclasses.field(default_factory=list)  # another consumer's instance; released


class EventsQueueConsumer:
    def __init__(
        self,
        sqs_client: Any,
        queue_url: str,
        *,
        on_notice: Callable[[Notice], object],
        on_reservation: Callable[[ReservationExpiring], object] | None = None,
        instance_ids: Iterable[str] | None = None,
        wait_seconds: int = 20,
        visibility_timeout: int = DEFAULT_VISIBILITY_TIMEOUT,
        receive_visibility: int = RECEIVE_VISIBILITY,
        max_messages: int = 10,
        rules: QueueRules | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        check_queue_url(queue_url)
        _check_range("wait_seconds", wait_seconds, 0, 20, "the SQS long-poll limit")
        _check_range("visibility_timeout", visibility_timeout, 0, 43200, "the SQS limit, 12 hours")
        _check_range("max_messages", max_messages, 1, 10, "the SQS receive limit")
        _check_range("receive_visibility", receive_visibility, 1, 43200, "the SQS limit, 12 hours")
        self._sqs = sqs_client
        self._url = queue_url
        self._on_notice = on_notice
        self._on_reservation = on_reservation
        self._instances = None if instance_ids is None else frozenset(check_instance_id(i) for i in instance_ids)
        self._wait = wait_seconds
        self._visibility = visibility_timeout
        self._receive_visibility = min(receive_visibility, visibility_timeout)
        self._max = max_messages
        self._rules = rules or QueueRules()
        self._clock = clock

    def poll_once(self) -> PollResult:
        """One long-poll receive and the handling of every message it returned."""
        response = self._sqs.receive_message(
            QueueUrl=self._url,
            MaxNumberOfMessages=self._max,
            WaitTimeSeconds=self._wait,
            VisibilityTimeout=self._receive_visibility,
            MessageSystemAttributeNames=["ApproximateReceiveCount"],
        )
        result = PollResult()
        for message in response.get("Messages", []):
            result.received += 1
            try:
                self._handle(message, result)
            except Exception as err:  # noqa: BLE001 - one message must never take the rest of the batch with it
                line = f"message {message.get('MessageId', '?')}: could not be handled ({type(err).__name__}: {error_line(err)})"
                log.error("events queue: %s; left to be delivered again", line)
                result.failed.append(line)
        return result

    def run(self, stop: threading.Event) -> None:
        """Poll until ``stop`` is set; a failing queue is logged and retried, never fatal."""
        while not stop.is_set():
            try:
                self.poll_once()
            except (BotoCoreError, ClientError) as err:
                log.warning(
                    "events queue %s: receive failed (%s); retrying in %.0fs",
                    self._url,
                    error_line(err),
                    _RETRY_AFTER_ERROR,
                )
                stop.wait(_RETRY_AFTER_ERROR)

    # -- one message ---------------------------------------------------------------------------
    def _handle(self, message: dict[str, Any], result: PollResult) -> None:
        ref = f"message {message.get('MessageId', '?')} (receive {message.get('Attributes', {}).get('ApproximateReceiveCount', '?')})"
        try:
            parsed = parse_message(message.get("Body", ""), now=self._clock(), rules=self._rules)
        except Exception as err:  # noqa: BLE001 - UnreadableEvent, or anything a hostile body still provokes
            line = f"{ref}: {err if isinstance(err, UnreadableEvent) else f'{type(err).__name__}: {error_line(err)}'}"
            log.error("events queue: %s; kept for the dead-letter queue", line)
            result.unreadable.append(line)
            return
        if isinstance(parsed, Skipped):
            result.skipped.append(f"{ref}: {parsed.reason}")
            self._delete(message, ref)
            return
        if isinstance(parsed, ReservationExpiring):
            self._reservation(message, ref, parsed, result)
            return
        instance = instance_of(parsed)
        if self._instances is not None and instance not in self._instances:
            result.passed_on.append(f"{ref}: {parsed.kind} for {instance}")
            self._release(message, ref)
            return
        notice = parsed
        if self._run_handler(message, ref, result, lambda: self._on_notice(notice), f"{parsed.kind} on {instance}"):
            result.handled.append(parsed)
            self._delete(message, ref)

    def _run_handler(
        self, message: dict[str, Any], ref: str, result: PollResult, handler: Callable[[], object], what: str
    ) -> bool:
        """Run ``handler`` with the message kept hidden; False (the message left to reappear, for
        redelivery to retry) when it could not be kept hidden or the handler failed."""
        if self._visibility > self._receive_visibility and not self._hide(message, ref):
            # No longer ours (its receipt expired) or the queue failed: redelivery hands it over.
            result.failed.append(f"{ref}: could not be kept hidden for its handler; left to be delivered again")
            return False
        try:
            handler()
        except Exception as err:  # noqa: BLE001 - any handler failure: keep consuming; redelivery retries it
            line = f"{ref}: handler failed for {what}: {error_line(err)}"
            log.error("events queue: %s; left to reappear after %ds", line, self._visibility)
            result.failed.append(line)
            return False
        return True

    def _reservation(
        self, message: dict[str, Any], ref: str, expiring: ReservationExpiring, result: PollResult
    ) -> None:
        if self._on_reservation is None:
            result.skipped.append(f"{ref}: capacity block {expiring.reservation_id} expiring; no fleet handler here")
            self._release(message, ref)
            return
        on_reservation = self._on_reservation
        what = f"capacity block {expiring.reservation_id}"
        if not self._run_handler(message, ref, result, lambda: on_reservation(expiring), what):
            return
        result.reservations.append(expiring)
        self._delete(message, ref)

    def _delete(self, message: dict[str, Any], ref: str) -> None:
        try:
            self._sqs.delete_message(QueueUrl=self._url, ReceiptHandle=message["ReceiptHandle"])
        except (BotoCoreError, ClientError) as err:
            # Typically the visibility timeout ran out during a long handler: the message comes back
            # and its notice is deduplicated by event_id.
            log.warning("events queue: could not delete %s (%s); it will be delivered again", ref, error_line(err))

    def _hide(self, message: dict[str, Any], ref: str) -> bool:
        """Keep the message hidden for the handler's whole visibility timeout; False when that
        failed (the receipt is stale or the queue unreachable: leave the message to redelivery)."""
        try:
            self._sqs.change_message_visibility(
                QueueUrl=self._url, ReceiptHandle=message["ReceiptHandle"], VisibilityTimeout=self._visibility
            )
        except (BotoCoreError, ClientError) as err:
            log.warning(
                "events queue: could not keep %s hidden for its handler (%s); leaving it to be delivered again",
                ref,
                error_line(err),
            )
            return False
        return True

    def _release(self, message: dict[str, Any], ref: str) -> None:
        try:
            self._sqs.change_message_visibility(
                QueueUrl=self._url, ReceiptHandle=message["ReceiptHandle"], VisibilityTimeout=0
            )
        except (BotoCoreError, ClientError) as err:
            log.warning(
                "events queue: could not release %s (%s); it reappears after %ds",
                ref,
                error_line(err),
                self._visibility,
            )


def check_queue_url(queue_url: object) -> str:
    if not isinstance(queue_url, str) or not queue_url.startswith(("https://", "http://")):
        raise UserError(
            f"events queue URL {queue_url!r} is not a URL (https://sqs.<region>.amazonaws.com/<account>/<name>)"
        )
    return queue_url


def _check_range(name: str, value: object, low: int, high: int, why: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise UserError(f"{name} {value!r} is outside {low} to {high} ({why})")
