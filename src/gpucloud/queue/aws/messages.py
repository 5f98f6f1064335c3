"""The SQS slot message, and what a receiver does with one (pure functions, no I/O).

**Shape.** One message per gang slot of an attempt. The body is JSON::

    {"v": 1, "job_id": "j-4f2a9c01de", "attempt": 3, "slot": 0, "slots": 2}

and the same facts ride as message attributes (``gpucloud.job-id`` String, ``gpucloud.attempt``
Number, ``gpucloud.slot`` Number) so tools can read them without parsing. A job of N nodes gets N
messages per attempt (slots 0..N-1), sent when the attempt is created (submit, requeue).

**Truth lives in DynamoDB.** A message is a wake-up that says "this slot may need a worker"; the
table decides. The slot's *holder* keeps the message hidden while it works: a gang member (every
agent-run attempt, one node or many) holds it on its slot item and renews it with its slot lease;
a single-node ``gpucloud worker`` holds it on the job item and renews it with its job lease. The
receiver reads the job and the holder and then (``decide``):

- CLAIM the slot of the queued attempt the message was sent for, when no live holder has it (a
  conditional transaction; a lost race is just "not mine");
- TAKEOVER a running attempt whose holder stopped renewing (worker died, gang member lost): the
  attempt ends and k+1 is queued, exactly once;
- PARK the message the live holder keeps (its id is on the holder's item) — hide it again for the
  rest of the lease and hand the new receipt to the holder, whose renewals keep extending it; near
  the queue's ``maxReceiveCount`` it is REPOSTed instead (a fresh copy, delayed), so a long attempt
  never pushes its own message into the dead-letter queue;
- DELETE a message whose job is gone or ended, that a newer attempt superseded, or that duplicates
  a slot someone already holds;
- DEAD-LETTER a malformed message on its first receive (one log line): it is copied to the
  dead-letter queue, where a person can read it, and deleted here. Retrying it never helps, and
  walking it there through ``maxReceiveCount`` receives would cost a receive each time.
"""

from __future__ import annotations

import dataclasses
import enum
import math

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from gpucloud.lifecycle.model import JOB_ID_PATTERN, Job, JobState
from gpucloud.payload import PREVIEW_CHARS, parse_json, preview

BODY_VERSION = 1
ATTR_JOB_ID = "gpucloud.job-id"
ATTR_ATTEMPT = "gpucloud.attempt"
ATTR_SLOT = "gpucloud.slot"
MAX_DELAY_S = 900  # SQS DelaySeconds maximum
MAX_VISIBILITY_S = 43_200  # SQS: 12 hours from the receive, in total


# A job id (``lifecycle.model.JOB_ID_PATTERN``). Checked here too: the id becomes a DynamoDB key, and
# one DynamoDB refuses (over 2048 bytes) would fail every receive of the message.
MAX_NUMBER = 2**53  # attempts and slots are counters; anything larger was not written by gpucloud


class SlotMessage(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    v: int = Field(description="body version")
    job_id: str = Field(pattern=JOB_ID_PATTERN)
    attempt: int = Field(ge=1, le=MAX_NUMBER)
    slot: int = Field(ge=0, le=MAX_NUMBER)
    slots: int = Field(ge=1, le=MAX_NUMBER)


class MalformedMessage(ValueError):
    """A body that is not a gpucloud slot message; str() is the one-line problem."""


def slot_messages(job_id: str, attempt: int, slots: int) -> list[SlotMessage]:
    return [SlotMessage(v=BODY_VERSION, job_id=job_id, attempt=attempt, slot=i, slots=slots) for i in range(slots)]


def send_entry(message: SlotMessage, *, delay_seconds: int = 0) -> dict:
    """The ``SendMessage`` parameters (without ``QueueUrl``) for one slot message."""
    return {
        "MessageBody": message.model_dump_json(),
        "DelaySeconds": max(0, min(MAX_DELAY_S, int(delay_seconds))),
        "MessageAttributes": {
            ATTR_JOB_ID: {"DataType": "String", "StringValue": message.job_id},
            ATTR_ATTEMPT: {"DataType": "Number", "StringValue": str(message.attempt)},
            ATTR_SLOT: {"DataType": "Number", "StringValue": str(message.slot)},
        },
    }


def parse_slot_message(body: str) -> SlotMessage:
    """The slot message in ``body``, or ``MalformedMessage`` (one line) — never another exception,
    whatever the body: a receive must never fail because of one message."""
    if not isinstance(body, str):
        raise MalformedMessage(f"body is {type(body).__name__}, expected JSON text")
    data = parse_json(body, "body", MalformedMessage)
    if not isinstance(data, dict):
        raise MalformedMessage(
            f"body is a JSON {type(data).__name__}, expected an object with v, job_id, attempt, slot, slots"
        )
    if data.get("v") != BODY_VERSION:
        version = preview(data.get("v"))
        raise MalformedMessage(f"body version {version} is not {BODY_VERSION}, the version this gpucloud reads")
    try:
        message = SlotMessage.model_validate(data)
    except ValidationError as err:
        first = err.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "body"
        # The location may be a key of the body: any length, any characters. Quote it short, on one line.
        where = where if where.isidentifier() else repr(where[:PREVIEW_CHARS])
        raise MalformedMessage(f"{where}: {first['msg']}") from err
    if message.slot >= message.slots:
        raise MalformedMessage(f"slot {message.slot} is outside the gang of {message.slots} slot(s)")
    return message


def visibility_seconds(seconds: float) -> int:
    """A lease length as an SQS visibility timeout: whole seconds, at least 1, at most 12 hours."""
    return max(1, min(MAX_VISIBILITY_S, math.ceil(seconds)))


class Action(str, enum.Enum):
    CLAIM = "claim"
    TAKEOVER = "takeover"
    PARK = "park"
    REPOST = "repost"
    DELETE = "delete"


@dataclasses.dataclass(frozen=True)
class Decision:
    action: Action
    reason: str
    hide_seconds: int = 0  # PARK: visibility timeout; REPOST: delay of the fresh copy


@dataclasses.dataclass(frozen=True)
class Holder:
    """Who keeps a slot now, as the table has it: a gang member's slot item, or the job item of a
    single-node worker."""

    worker: str
    lease_until: float
    message_id: str | None  # the slot message it keeps hidden (None: claimed without one)


def decide(
    message: SlotMessage,
    job: Job | None,
    holder: Holder | None,
    *,
    message_id: str,
    receive_count: int,
    max_receives: int | None,
    now: float,
) -> Decision:
    """What a receiver does with a well-formed slot message, given the job and the slot's holder."""
    if job is None:
        return Decision(Action.DELETE, f"job {message.job_id} is gone")
    if job.state.terminal:
        return Decision(Action.DELETE, f"job {job.id} is {job.state.value}")
    if message.attempt > job.attempt:
        return Decision(
            Action.DELETE, f"attempt {message.attempt} of job {job.id} does not exist (current: {job.attempt})"
        )
    if message.attempt < job.attempt:
        return Decision(
            Action.DELETE, f"attempt {message.attempt} of job {job.id} was superseded by attempt {job.attempt}"
        )
    if message.slot >= job.spec.nodes:
        return Decision(Action.DELETE, f"job {job.id} has no slot {message.slot} (it runs on {job.spec.nodes} node(s))")
    lease_left = holder.lease_until - now if holder is not None else -1.0
    if lease_left < 0:
        if job.state is JobState.QUEUED:
            return Decision(Action.CLAIM, f"slot {message.slot} of attempt {job.attempt} of job {job.id} is free")
        who = f"worker {holder.worker}" if holder is not None else "its holder"
        return Decision(Action.TAKEOVER, f"{who} stopped renewing slot {message.slot} of job {job.id}")
    assert holder is not None  # a live lease (lease_left >= 0) has a holder
    if holder is not None and holder.message_id in (message_id, None):
        # The holder's own message (or one for a holder that claimed from the table without one:
        # it adopts this one, so its slot has a wake-up again if it dies).
        # Every receive counts toward maxReceiveCount: parking the holder's own message over and
        # over would end in the dead-letter queue while the job runs fine. Near the limit, a fresh
        # copy (receive count 0) replaces it.
        if max_receives is not None and receive_count >= max_receives - 1:
            return Decision(
                Action.REPOST,
                f"job {job.id}'s slot {message.slot} message was received {receive_count} times",
                hide_seconds=min(MAX_DELAY_S, visibility_seconds(lease_left)),
            )
        return Decision(
            Action.PARK,
            f"worker {holder.worker} holds slot {message.slot} of job {job.id}",
            hide_seconds=visibility_seconds(lease_left),
        )
    return Decision(
        Action.DELETE,
        f"a duplicate: worker {holder.worker} already holds slot {message.slot} of attempt {job.attempt} of job {job.id}",
    )
