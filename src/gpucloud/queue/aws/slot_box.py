"""The SQS half of the AWS queue: sending, receiving, hiding, returning and deleting slot messages.

``AwsQueue`` keeps the table (the truth) and asks this box for the queue operations. What a
message means is decided by ``aws_messages.decide``; this module only moves messages, and knows the
two SQS facts every caller must respect:

* a receipt handle is only good until the message is received again — deleting or re-hiding with
  an old one fails (``ReceiptHandleIsInvalid``/``MessageNotInflight``) or, on real SQS, "succeeds"
  without effect; either way the message comes back and its next receiver decides again;
* every receive counts toward the queue's ``maxReceiveCount``, so a message handed back over and
  over would end in the dead-letter queue although nothing is wrong with it. Near the limit it is
  replaced by a fresh copy (receive count 0) instead.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

from gpucloud.queue.aws.messages import (
    MAX_VISIBILITY_S,
    MalformedMessage,
    SlotMessage,
    parse_slot_message,
    send_entry,
    slot_messages,
    visibility_seconds,
)

log = logging.getLogger(__name__)

_GONE_MESSAGE_CODES = {"ReceiptHandleIsInvalid", "MessageNotInflight", "InvalidParameterValue"}


@dataclasses.dataclass(frozen=True)
class ReceivedMessage:
    """One received slot message: what ``SlotOffer.ref`` holds on the AWS backend."""

    message_id: str
    receipt: str
    receive_count: int
    body: SlotMessage


ATTR_PROBLEM = "gpucloud.problem"  # why a message was dead-lettered, on the DLQ copy
MAX_ATTRIBUTE_CHARS = 256  # what the problem attribute quotes (the body travels whole)


class SlotMessageBox:
    def __init__(self, sqs: Any, queue_url: str, max_receives: int | None, dead_letter_url: str | None = None) -> None:
        self._sqs, self.queue_url, self.max_receives = sqs, queue_url, max_receives
        self.dead_letter_url = dead_letter_url

    def send_slots(self, job_id: str, attempt: int, slots: int) -> None:
        """One message per slot of the attempt (``SendMessageBatch`` takes 10 at a time)."""
        messages = slot_messages(job_id, attempt, slots)
        for start in range(0, len(messages), 10):
            batch = messages[start : start + 10]
            entries = [{"Id": str(m.slot), **send_entry(m)} for m in batch]
            failed = self._sqs.send_message_batch(QueueUrl=self.queue_url, Entries=entries).get("Failed", [])
            for failure in failed:  # one retry each, then the table sweep finds the slot
                retry = next(m for m in batch if str(m.slot) == failure["Id"])
                self._sqs.send_message(QueueUrl=self.queue_url, **send_entry(retry))

    def receive(self, *, wait_seconds: int, hide_seconds: float) -> dict[str, Any] | None:
        """One message, hidden for ``hide_seconds`` from the start (a claimer's renewals extend it)."""
        received = self._sqs.receive_message(
            QueueUrl=self.queue_url,
            MaxNumberOfMessages=1,
            WaitTimeSeconds=wait_seconds,
            VisibilityTimeout=visibility_seconds(hide_seconds),
            MessageSystemAttributeNames=["ApproximateReceiveCount"],
        ).get("Messages", [])
        return received[0] if received else None

    def delete(self, receipt: str | None) -> None:
        from botocore.exceptions import ClientError

        if not receipt:
            return
        try:
            self._sqs.delete_message(QueueUrl=self.queue_url, ReceiptHandle=receipt)
        except ClientError as err:
            # Someone else received it since (its receipt is newer): it is stale now and the next
            # receiver deletes it.
            if err.response.get("Error", {}).get("Code") not in _GONE_MESSAGE_CODES:
                raise

    def hide(self, receipt: str, seconds: float) -> bool:
        """Keep the message hidden ``seconds`` from now (0: visible at once); False when the receipt
        is no longer good (gone, received by another since, or past SQS's 12-hour total)."""
        from botocore.exceptions import ClientError

        try:
            self._sqs.change_message_visibility(
                QueueUrl=self.queue_url,
                ReceiptHandle=receipt,
                VisibilityTimeout=0 if seconds <= 0 else visibility_seconds(seconds),
            )
        except ClientError as err:
            if err.response.get("Error", {}).get("Code") in _GONE_MESSAGE_CODES:
                log.debug("job queue message not re-hidden: %s", err)
                return False
            raise
        return True

    def dead_letter(self, message: dict[str, Any], problem: str) -> str:
        """Move a poison message to the dead-letter queue now, body intact, with ``problem`` as an
        attribute; where it went (for the one log line). Retrying a body that cannot be read never
        helps, and every receive of it would cost a worker a receive. Without a dead-letter queue it
        is hidden for the longest SQS allows (12 hours) instead: deleting it would lose it, showing
        it again at once would bring it straight back."""
        receipt = message["ReceiptHandle"]
        if self.dead_letter_url is None:
            self.hide(receipt, MAX_VISIBILITY_S)
            return "hidden for 12 hours (the queue has no dead-letter queue)"
        self._sqs.send_message(
            QueueUrl=self.dead_letter_url,
            MessageBody=message.get("Body") or "(empty)",  # SQS refuses an empty body; the attribute tells
            MessageAttributes={
                ATTR_PROBLEM: {"DataType": "String", "StringValue": problem[:MAX_ATTRIBUTE_CHARS] or "unreadable"}
            },
        )
        self.delete(receipt)
        return "moved to the dead-letter queue"

    def near_limit(self, receive_count: int) -> bool:
        """Would one more receive push the message into the dead-letter queue?"""
        return self.max_receives is not None and receive_count >= self.max_receives - 1

    def repost(self, body: SlotMessage, receipt: str, *, delay_seconds: float) -> str:
        """Replace the message by a fresh copy shown after ``delay_seconds``; the copy's id."""
        fresh = self._sqs.send_message(QueueUrl=self.queue_url, **send_entry(body, delay_seconds=int(delay_seconds)))
        self.delete(receipt)
        return fresh["MessageId"]

    def give_back(self, message: ReceivedMessage, *, delay_seconds: float = 0.0) -> None:
        """Let another receiver have the message after ``delay_seconds``, without walking it into
        the dead-letter queue."""
        if self.near_limit(message.receive_count):
            self.repost(message.body, message.receipt, delay_seconds=delay_seconds)
        else:
            self.hide(message.receipt, delay_seconds)


def held_slot_message(item: dict[str, Any]) -> ReceivedMessage | None:
    """The message a slot item keeps (``AwsQueue.take_slot`` stores it), if it has one."""
    from gpucloud.queue.aws.items import plain

    fields = {name: plain(value) for name, value in item.items()}
    if not fields.get("receipt") or not fields.get("body"):
        return None
    try:
        body = parse_slot_message(fields["body"])
    except MalformedMessage:
        return None
    return ReceivedMessage(str(fields["message_id"]), str(fields["receipt"]), int(fields.get("receives", 1)), body)
