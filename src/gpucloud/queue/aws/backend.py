"""The AWS job queue: SQS slot messages + a DynamoDB job table, behind the ``JobQueue`` protocol.

**DynamoDB is the truth** (key design in ``aws_schema``): the job item holds state, current attempt,
lease and the slot message its holder keeps; attempts and timeline events are items beside it.
What a request changes is decided by ``gpucloud.lifecycle.transitions`` (the same decisions the
SQLite queue stores); here every change that must happen once is a conditional write:

* claim: one ``TransactWriteItems`` — job ``queued`` at attempt k -> ``running`` (condition on state
  and attempt), attempt k -> running, a ``claimed`` event. Takeover after a lease expired adds
  "attempt k -> LOST" and "put attempt k+1 if it does not exist".
* end_attempt: one ``TransactWriteItems`` — attempt k ``running`` -> ended (the gate), the job item
  (condition: still running at attempt k), for a requeue "put attempt k+1 if it does not exist",
  and the timeline event. DynamoDB transactions are serializable and all-or-nothing, and a
  condition is evaluated atomically with its write, so of any number of racing processes exactly
  one commits; the rest are cancelled with ``ConditionalCheckFailed`` (-> ``applied=False``) or
  ``TransactionConflict`` (-> re-read and retry, and the re-read sees the winner's result). Each
  call carries a ``ClientRequestToken``, so botocore's retry of a transaction that committed but
  whose answer was lost is answered as the success it was, not as a failed condition.
* heartbeat: one conditional ``UpdateItem`` (state, attempt and worker must match).

Leases compare the writer's clock with the stored ``lease_until``; nodes run chrony against the
Amazon Time Sync Service, so skew is milliseconds against leases of a minute.

**SQS carries one message per gang slot** (``aws_messages``): sent after the transaction that
creates the attempt commits (so only the winner sends), kept hidden by its holder — every heartbeat
calls ``ChangeMessageVisibility`` with the lease — and deleted when the attempt ends. If a worker
dies, its message reappears when its lease runs out and the next receiver takes the job over. A
crash between a commit and its send would strand a queued job without a message, so a claim that
finds nothing in SQS also looks in the table's ``by-state`` index for a claimable job (the same
conditional transaction decides). It leaves a job to its message for ``sweep_grace_s`` first
(queued that long, or its lease expired that long ago), so the table is read only for strays.
"""

from __future__ import annotations

import enum
import functools
import itertools
import json
import logging
import random
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any, TypeVar

from gpucloud.checkpoint.layout import validate_job_id
from gpucloud.errors import UserError
from gpucloud.lifecycle import transitions
from gpucloud.lifecycle.model import (
    CANCEL_GRACE_S,
    EVENT_KINDS,
    Attempt,
    AttemptEnd,
    Event,
    Job,
    JobSpec,
    JobState,
    NodeRecord,
    Progress,
    SlotClaim,
    SlotOffer,
    StopRequest,
)
from gpucloud.lifecycle.transitions import Change, Guard, Refusal, StopRecord
from gpucloud.queue.aws import ops as aws_ops
from gpucloud.queue.aws.items import (
    ATTEMPT_PREFIX,
    EVENT_PREFIX,
    META,
    NODE_PREFIX,
    NODES_PK,
    attempt_item,
    attempt_sk,
    av,
    event_item,
    event_sk,
    held_message,
    item_to_attempt,
    item_to_event,
    item_to_job,
    item_to_node,
    item_to_slot,
    job_item,
    job_pk,
    key,
    node_item,
    plain,
    slot_item,
    slot_sk,
    slot_sk_prefix,
)
from gpucloud.queue.aws.messages import Action, Decision, Holder, MalformedMessage, decide, parse_slot_message
from gpucloud.queue.aws.schema import HASH_KEY, RANGE_KEY, STATE_INDEX, STATE_INDEX_HASH_KEY
from gpucloud.queue.aws.slot_box import ReceivedMessage, SlotMessageBox, held_slot_message
from gpucloud.queue.aws.uri import AwsQueueAddress
from gpucloud.queue.gang import gang_worker, view
from gpucloud.queue.protocol import NotCancellable, NotResumable, Transition, UnknownJob
from gpucloud.signals.events import Notice

log = logging.getLogger(__name__)

MAX_RECEIVES_PER_CLAIM = 10  # stale and malformed messages a single claim clears before giving up
WORKER_PASS_DELAY_S = 5.0  # a `gpucloud worker` hands a gang's slot message back for the agents this late
CONFLICT_RETRIES = 8  # TransactionConflict: another transaction touched the same items; retry
SWEEP_GRACE_S = 60.0  # a message normally arrives within milliseconds; only strays wait this long
_ATTEMPT_FIELDS = ("started_at", "resumed_step", "last_step", "node")
_CREDENTIAL_CODES = {
    "UnrecognizedClientException",
    "InvalidClientTokenId",
    "ExpiredToken",
    "ExpiredTokenException",
    "InvalidSignatureException",
    "SignatureDoesNotMatch",
    "AccessDenied",
    "AccessDeniedException",
    "MissingAuthenticationToken",
}
_MISSING_CODES = {"ResourceNotFoundException", "AWS.SimpleQueueService.NonExistentQueue", "QueueDoesNotExist"}

F = TypeVar("F", bound=Callable[..., Any])
T = TypeVar("T")


def _aws_call(doing: str) -> Callable[[F], F]:
    """Turn credential, endpoint and missing-resource failures of one public call into one line."""

    def wrap(method: F) -> F:
        @functools.wraps(method)
        def translated(self: AwsQueue, *args: Any, **kwargs: Any) -> Any:
            from botocore.exceptions import (
                BotoCoreError,
                ClientError,
                ConnectTimeoutError,
                EndpointConnectionError,
                NoCredentialsError,
                NoRegionError,
                PartialCredentialsError,
            )

            try:
                return method(self, *args, **kwargs)
            except (NoCredentialsError, PartialCredentialsError) as err:
                raise UserError(
                    f"{doing} on {self.uri}: no usable AWS credentials ({err}); set AWS_PROFILE or "
                    "AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, or run on a node with its instance role"
                ) from err
            except (EndpointConnectionError, ConnectTimeoutError) as err:
                raise UserError(
                    f"{doing} on {self.uri}: cannot reach AWS ({err}); check the region, AWS_ENDPOINT_URL and the network"
                ) from err
            except NoRegionError as err:  # pragma: no cover - the URI always names the region
                raise UserError(f"{doing} on {self.uri}: no region ({err})") from err
            except ClientError as err:
                code = err.response.get("Error", {}).get("Code", "")
                message = err.response.get("Error", {}).get("Message", "")
                if code in _CREDENTIAL_CODES:
                    raise UserError(f"{doing} on {self.uri}: AWS refused the credentials ({code}: {message})") from err
                if code in _MISSING_CODES:
                    raise UserError(
                        f"{doing} on {self.uri}: the table or queue does not exist in {self.address.region} "
                        f"({code}: {message}); check the stack outputs jobTableName and jobQueueUrl"
                    ) from err
                raise
            except BotoCoreError as err:
                raise UserError(f"{doing} on {self.uri}: {err}") from err

        return translated  # type: ignore[return-value]

    return wrap


class AwsQueue:
    """``JobQueue`` on SQS + DynamoDB. Thread-safe (boto3 clients are); one per process is enough."""

    def __init__(
        self,
        address: AwsQueueAddress,
        *,
        uri: str | None = None,
        sweep_grace_s: float = SWEEP_GRACE_S,
        clock: Callable[[], float] = time.time,
    ) -> None:
        """``clock``: the time leases, timeline events and transitions are judged and stamped with
        (SQS visibility timeouts still run on AWS's clock)."""
        import boto3
        from botocore.config import Config

        self.address = address
        self.uri = uri or address.uri
        self.table = address.table
        self.queue_url = address.queue_url
        self.sweep_grace_s = sweep_grace_s
        self.clock = clock
        config = Config(
            retries={"mode": "standard", "max_attempts": 5},
            connect_timeout=5,
            read_timeout=address.wait_seconds + 20,  # a long poll holds the connection that long
        )
        session = boto3.session.Session(region_name=address.region)
        self._ddb = session.client("dynamodb", config=config)
        self._sqs = session.client("sqs", config=config)
        self._writer = uuid.uuid4().hex[:8]
        self._seq = itertools.count()
        self._seq_lock = threading.Lock()
        self.max_receives, dead_letter_url = self._read_redrive_policy()
        self._box = SlotMessageBox(self._sqs, self.queue_url, self.max_receives, dead_letter_url)
        self._next_stray_sweep = 0.0  # monotonic: the table is read for stray slots at most this often
        self._unreadable: set[str] = set()  # job items already reported unreadable (one line each)

    @_aws_call("opening the job queue")
    def _read_redrive_policy(self) -> tuple[int | None, str | None]:
        """The queue's redrive ``maxReceiveCount`` and its dead-letter queue's URL (None, None: no
        dead-letter queue). Also proves, at open, that the credentials work and the queue exists.
        https://docs.aws.amazon.com/AWSSimpleQueueService/latest/SQSDeveloperGuide/sqs-dead-letter-queues.html"""
        attributes = self._sqs.get_queue_attributes(QueueUrl=self.queue_url, AttributeNames=["RedrivePolicy"])
        policy = attributes.get("Attributes", {}).get("RedrivePolicy")
        if not policy:
            return None, None
        redrive = json.loads(policy)
        # deadLetterTargetArn: arn:aws:sqs:<region>:<account>:<name>
        arn_parts = str(redrive.get("deadLetterTargetArn", "")).split(":")
        dead_letter_url = None
        if len(arn_parts) == 6:
            dead_letter_url = self._sqs.get_queue_url(QueueName=arn_parts[5], QueueOwnerAWSAccountId=arn_parts[4])[
                "QueueUrl"
            ]
        return int(redrive["maxReceiveCount"]), dead_letter_url

    def close(self) -> None:
        self._ddb.close()
        self._sqs.close()

    # -- plumbing ---------------------------------------------------------------------------

    def _event(self, job_id: str, attempt: int, kind: str, at: float, data: Mapping[str, Any]) -> dict[str, Any]:
        if kind not in EVENT_KINDS:
            raise ValueError(f"unknown timeline event {kind!r}; expected one of {', '.join(EVENT_KINDS)}")
        with self._seq_lock:
            sk = event_sk(time.time_ns(), self._writer, next(self._seq))
        return {"Put": aws_ops.put(self.table, event_item(job_id, attempt, kind, at, data, sk))}

    def _transact(self, items: list[dict[str, Any]]) -> list[str] | None:
        """Run one transaction. None: committed. Otherwise the cancellation reason codes."""
        from botocore.exceptions import ClientError

        try:
            self._ddb.transact_write_items(TransactItems=items, ClientRequestToken=uuid.uuid4().hex)
        except ClientError as err:
            if err.response.get("Error", {}).get("Code") != "TransactionCanceledException":
                raise
            reasons = err.response.get("CancellationReasons") or []
            return [str(r.get("Code", "None")) for r in reasons] or ["Unknown"]
        return None

    def _meta(self, job_id: str) -> dict[str, Any] | None:
        return self._ddb.get_item(TableName=self.table, Key=key(job_id, META), ConsistentRead=True).get("Item")

    def _job_op(self, job_id: str, change: Change, message: tuple[str, str] | None = None) -> dict[str, Any]:
        """The ``Update`` of the job item that ``change`` makes, conditional on its guard. Whenever
        the holder changes, so does the slot message it keeps hidden (``message``: id, receipt)."""
        fields = {_JOB_ATTRIBUTES.get(name, name): _stored(value) for name, value in change.job.items()}
        if "worker" in change.job:
            fields["message_id"], fields["receipt"] = message if message is not None else (None, None)
        condition, values = _guard_condition(change.guard)
        return aws_ops.update(self.table, key(job_id, META), fields, condition=condition, values=values)

    def _change_items(
        self, job_id: str, change: Change, message: tuple[str, str] | None = None
    ) -> list[dict[str, Any]]:
        """The transaction that stores ``change``: the guarded job update, the attempt gate, the new
        attempt (only if it does not exist yet) and the timeline events. Stop requests and the
        first put of a job are written by their own callers."""
        items: list[dict[str, Any]] = []
        if change.job:
            items.append({"Update": self._job_op(job_id, change, message)})
        if change.attempt is not None:
            gate = change.attempt
            fields = {name: _stored(value) for name, value in gate.fields.items()}
            items.append(
                {
                    "Update": aws_ops.update(
                        self.table,
                        key(job_id, attempt_sk(gate.number)),
                        fields,
                        condition="#state = :was",
                        values={"was": gate.was.value},
                    )
                }
            )
        if change.new_attempt is not None:
            new = change.new_attempt
            item = attempt_item(job_id, new.number, new.state, new.created_at, worker=new.worker, node=new.node)
            items.append({"Put": aws_ops.put(self.table, item, condition="attribute_not_exists(#pk)")})
        items += [self._event(job_id, e.attempt, e.kind, e.at, e.data) for e in change.events]
        return items

    # -- jobs -------------------------------------------------------------------------------

    @_aws_call("submitting a job")
    def submit(self, spec: JobSpec, *, job_id: str | None = None) -> Job:
        job_id = validate_job_id(job_id) if job_id is not None else f"j-{uuid.uuid4().hex[:10]}"
        job, change = transitions.submit(job_id, spec, self.clock())
        reasons = self._transact(
            [
                {"Put": aws_ops.put(self.table, job_item(job), condition="attribute_not_exists(#pk)")},
                *self._change_items(job_id, change),
            ]
        )
        if reasons is not None:
            if reasons[0] == "ConditionalCheckFailed":
                raise UserError(f"job {job_id!r} already exists in {self.uri}; pick another --job-id")
            raise UserError(
                f"submitting job {job_id!r} to {self.uri} was cancelled by DynamoDB ({', '.join(reasons)}); try again"
            )
        self._box.send_slots(job_id, 1, spec.nodes)
        return job

    @_aws_call("reading a job")
    def get(self, job_id: str) -> Job:
        item = self._meta(job_id)
        if item is None:
            raise UnknownJob(job_id, self.uri)
        return item_to_job(item, self.table)

    @_aws_call("listing jobs")
    def list_jobs(self, states: Iterable[JobState] | None = None) -> list[Job]:
        # The index is eventually consistent (like every DynamoDB GSI): a job changed within the
        # last moment may still be listed under its previous state.
        wanted = [JobState(s) for s in states] if states is not None else list(JobState)
        items = [item for state in wanted for item in self._by_state(state)]
        return sorted(self._readable_jobs(items), key=lambda j: (j.created_at, j.id))

    def _readable_jobs(self, items: Iterable[dict[str, Any]]) -> Iterator[Job]:
        return (job for _, job in self._readable_items(items))

    def _readable_items(self, items: Iterable[dict[str, Any]]) -> Iterator[tuple[dict[str, Any], Job]]:
        """(item, job) for each job item that can be read; each unreadable one is skipped with one
        log line (once per queue connection), so one bad item never hides or blocks the rest."""
        for item in items:
            try:
                yield item, item_to_job(item, self.table)
            except UserError as problem:
                name = str(item.get(HASH_KEY))
                if name not in self._unreadable:
                    self._unreadable.add(name)
                    log.warning("%s; skipped, the rest of the queue goes on", problem)

    def _by_state(self, state: JobState, *, filter_expression: str | None = None, **values: Any) -> Iterable[dict]:
        params: dict[str, Any] = {
            "TableName": self.table,
            "IndexName": STATE_INDEX,
            "KeyConditionExpression": "#job_state = :state",
            "ExpressionAttributeNames": {"#job_state": STATE_INDEX_HASH_KEY},
            "ExpressionAttributeValues": {":state": {"S": state.value}},
            "ScanIndexForward": True,  # oldest first
        }
        if filter_expression:
            params["FilterExpression"] = filter_expression
            params["ExpressionAttributeNames"].update(aws_ops.names_in(filter_expression))
            params["ExpressionAttributeValues"].update(aws_ops.values_in(filter_expression, values))
        for page in self._ddb.get_paginator("query").paginate(**params):
            yield from page.get("Items", [])

    # -- claiming and leases ----------------------------------------------------------------

    @_aws_call("claiming a job")
    def claim(
        self,
        worker: str,
        *,
        lease_seconds: float,
        job_id: str | None = None,
        node: str | None = None,
        attempt: int | None = None,
    ) -> Job | None:
        if attempt is not None and job_id is None:
            raise ValueError("claim(attempt=...) needs job_id")
        if job_id is not None:
            item = self._meta(job_id)
            if item is None:
                return None
            # The claim transaction is conditional on the job as read here: if it moved on since, it fails.
            return self._try_claim(item, worker, lease_seconds, node, None, attempt=attempt)
        # A whole-job claim (`gpucloud worker`, `spot-train --queue`) takes single-node jobs only;
        # gangs, and jobs an agent runs as a gang of one, are the agents' (their holder is a slot).
        for _ in range(MAX_RECEIVES_PER_CLAIM):
            received = self._box.receive(wait_seconds=self.address.wait_seconds, hide_seconds=lease_seconds)
            if received is None:
                break
            offer = self._offer_from(received)
            if offer is None:
                continue
            item = self._meta(offer.job_id)
            found = None if item is None else item_to_job(item, self.table)
            if (
                item is None
                or found is None
                or found.spec.nodes != 1
                or found.worker == gang_worker(found.id, found.attempt)
            ):
                self._box.give_back(offer.ref, delay_seconds=WORKER_PASS_DELAY_S)
                continue
            claimed = self._try_claim(item, worker, lease_seconds, node, (offer.ref.message_id, offer.ref.receipt))
            if claimed is not None:
                return claimed
            self._box.hide(offer.ref.receipt, 0)  # lost a race; the next receive sees the winner and decides again
        return self._sweep(worker, lease_seconds, node)

    def _offer_from(self, message: dict[str, Any]) -> SlotOffer | None:
        """Read one received message against the table: an offer when its slot needs a worker
        (claim) or its attempt lost its holder (take over); otherwise the message is parked for its
        holder, replaced, deleted or left for the dead-letter queue here, and None is returned."""
        message_id, receipt = message["MessageId"], message["ReceiptHandle"]
        try:
            body = parse_slot_message(message.get("Body", ""))
        except MalformedMessage as problem:
            where = self._box.dead_letter(message, f"not a gpucloud slot message: {problem}")
            log.warning("job queue message %s is not a gpucloud slot message (%s); %s", message_id, problem, where)
            return None
        item = self._meta(body.job_id)
        try:
            job = None if item is None else item_to_job(item, self.table)
        except UserError as problem:
            where = self._box.dead_letter(message, f"names an unreadable job: {problem}")
            log.warning("job queue message %s names an unreadable job (%s); %s", message_id, problem, where)
            return None
        holder_key, holder = (
            self._holder(job, item, body.slot)
            if job is not None and item is not None and body.attempt == job.attempt
            else (None, None)
        )
        received = ReceivedMessage(
            message_id, receipt, int(message.get("Attributes", {}).get("ApproximateReceiveCount", "1")), body
        )
        decision = decide(
            body,
            job,
            holder,
            message_id=message_id,
            receive_count=received.receive_count,
            max_receives=self.max_receives,
            now=self.clock(),
        )
        if decision.action in (Action.CLAIM, Action.TAKEOVER):
            return SlotOffer(
                job_id=body.job_id,
                attempt=body.attempt,
                slot=body.slot,
                lost=decision.action is Action.TAKEOVER,
                ref=received,
            )
        if decision.action is Action.DELETE:
            log.info("job queue message %s deleted: %s", message_id, decision.reason)
            self._box.delete(receipt)
        elif decision.action in (Action.PARK, Action.REPOST):
            self._hand_to_holder(holder_key, holder, received, decision)
        return None

    def _holder(self, job: Job, item: dict[str, Any], slot: int) -> tuple[dict[str, Any] | None, Holder | None]:
        """(key of the holder's item, the holder) of ``slot`` of the job's current attempt. A
        single-node worker holds the job item; a gang member (any agent-run attempt) its slot item."""
        if job.state is JobState.RUNNING and job.worker != gang_worker(job.id, job.attempt):
            held_id, _ = held_message(item)
            return key(job.id, META), Holder(
                worker=job.worker or "", lease_until=job.lease_until or 0.0, message_id=held_id
            )
        slot_key = key(job.id, slot_sk(job.attempt, slot))
        slot_record = self._ddb.get_item(TableName=self.table, Key=slot_key, ConsistentRead=True).get("Item")
        if slot_record is None:
            return slot_key, None
        claim = item_to_slot(slot_record, self.table)
        held_id, _ = held_message(slot_record)
        return slot_key, Holder(worker=claim.worker, lease_until=claim.lease_until, message_id=held_id)

    def _hand_to_holder(
        self, holder_key: dict[str, Any] | None, holder: Holder | None, message: ReceivedMessage, decision: Decision
    ) -> None:
        """PARK: hide the holder's message again and hand its new receipt to the holder, whose
        renewals keep extending it. REPOST: replace it by a fresh, delayed copy (receive count 0)
        and hand the holder the copy's id. The write is conditional on the holder still keeping
        this message (or none), so a change of holder meanwhile leaves the message stale."""
        from botocore.exceptions import ClientError

        assert holder_key is not None and holder is not None  # decide() parks only for a holder
        if decision.action is Action.PARK:
            if not self._box.hide(message.receipt, decision.hide_seconds):
                return
            fields = {"message_id": message.message_id, "receipt": message.receipt, "receives": message.receive_count}
        else:
            fresh = self._box.repost(message.body, message.receipt, delay_seconds=decision.hide_seconds)
            fields = {"message_id": fresh, "receipt": None, "receives": 0}
        try:
            self._ddb.update_item(
                **aws_ops.update(
                    self.table,
                    holder_key,
                    fields,
                    condition="#worker = :w AND (attribute_not_exists(#message_id) OR #message_id = :mid)",
                    values={"w": holder.worker, "mid": message.message_id},
                )
            )
        except ClientError as err:
            if err.response.get("Error", {}).get("Code") != "ConditionalCheckFailedException":
                raise
            # The holder changed meanwhile: a reposted copy is a duplicate now and will be deleted.

    def _sweep(self, worker: str, lease_seconds: float, node: str | None) -> Job | None:
        """Claim straight from the table a single-node job its message should have brought by now:
        the oldest one queued for ``sweep_grace_s``, else a running one whose lease expired that
        long ago."""
        cutoff = self.clock() - self.sweep_grace_s
        for state, expired in (
            (JobState.QUEUED, "#updated_at < :cutoff"),
            (JobState.RUNNING, "#lease_until < :cutoff"),
        ):
            for item, job in self._readable_items(self._by_state(state, filter_expression=expired, cutoff=cutoff)):
                if job.spec.nodes != 1 or job.worker == gang_worker(job.id, job.attempt):
                    continue
                claimed = self._try_claim(item, worker, lease_seconds, node, None)
                if claimed is not None:
                    return claimed
        return None

    def _try_claim(
        self,
        item: dict[str, Any],
        worker: str,
        lease_seconds: float,
        node: str | None,
        message: tuple[str, str] | None,
        *,
        attempt: int | None = None,
    ) -> Job | None:
        """One conditional transaction taking ``item``'s job as it was read; None when not claimable
        or when another claimer won."""
        job = item_to_job(item, self.table)
        change = transitions.claim(
            job, worker, lease_seconds=lease_seconds, node=node, now=self.clock(), attempt=attempt
        )
        if isinstance(change, Refusal):
            return None
        if self._transact(self._change_items(job.id, change, message)) is not None:
            return None  # another claimer's transaction won (or conflicted): not ours
        if not change.outcome.claims:  # its holder died after a cancel: the job ended, nobody runs it
            self._delete_slot_messages(job.id, job.attempt)
            return None
        return self.get(job.id)

    @_aws_call("renewing a lease")
    def heartbeat(
        self, job_id: str, attempt: int, worker: str, *, lease_seconds: float, progress: Progress | None = None
    ) -> bool:
        change = transitions.heartbeat(
            attempt, worker, lease_seconds=lease_seconds, now=self.clock(), progress=progress
        )
        # One UpdateItem: the progress costs no write of its own.
        return self._renew_holding(self._job_op(job_id, change), lease_until=change.job["lease_until"])

    def _renew_holding(self, update: dict[str, Any], *, lease_until: float) -> bool:
        """Apply a conditional lease renewal; False when its condition failed (not the holder any
        more). Then keep the message the item holds hidden until ``lease_until``: after the table
        write, so the message stays hidden at least as long as the lease lasts."""
        from botocore.exceptions import ClientError

        try:
            updated = self._ddb.update_item(**update, ReturnValues="ALL_NEW")
        except ClientError as err:
            if err.response.get("Error", {}).get("Code") == "ConditionalCheckFailedException":
                return False
            raise
        _, receipt = held_message(updated.get("Attributes", {}))
        if receipt:
            self._box.hide(receipt, lease_until - self.clock())
        return True

    # -- the timeline -----------------------------------------------------------------------

    @_aws_call("recording a timeline event")
    def record(
        self, job_id: str, attempt: int, kind: str, *, at: float | None = None, data: dict[str, Any] | None = None
    ) -> None:
        event = self._event(job_id, attempt, kind, self.clock() if at is None else at, data or {})
        reasons = self._transact(
            [
                {"ConditionCheck": aws_ops.check(self.table, key(job_id, META), "attribute_exists(#pk)")},
                event,
            ]
        )
        if reasons is not None:
            if reasons[0] == "ConditionalCheckFailed":
                raise UnknownJob(job_id, self.uri)
            raise UserError(
                f"recording {kind!r} on job {job_id!r} in {self.uri} was cancelled by DynamoDB ({', '.join(reasons)})"
            )

    @_aws_call("updating an attempt")
    def update_attempt(self, job_id: str, attempt: int, **fields: Any) -> None:
        from botocore.exceptions import ClientError

        unknown = set(fields) - set(_ATTEMPT_FIELDS)
        if unknown:
            raise ValueError(f"update_attempt cannot set {sorted(unknown)}; allowed: {', '.join(_ATTEMPT_FIELDS)}")
        if not fields:
            return
        try:
            # attribute_exists: never create a stray attempt item for a job or attempt that is not there.
            self._ddb.update_item(
                **aws_ops.update(
                    self.table, key(job_id, attempt_sk(attempt)), fields, condition="attribute_exists(#pk)"
                )
            )
        except ClientError as err:
            if err.response.get("Error", {}).get("Code") != "ConditionalCheckFailedException":
                raise

    @_aws_call("ending an attempt")
    def end_attempt(self, job_id: str, attempt: int, end: AttemptEnd) -> Transition:
        def once() -> Transition | None:
            item = self._meta(job_id)
            if item is None:
                raise UnknownJob(job_id, self.uri)
            job = item_to_job(item, self.table)
            change = transitions.end(job, attempt, end, self.clock())
            if isinstance(change, Refusal):
                return Transition(job=job, applied=False)  # already ended, or superseded by a takeover
            _, receipt = held_message(item)
            reasons = self._transact(self._change_items(job_id, change))
            if reasons is None:
                self._box.delete(receipt)
                self._delete_slot_messages(job_id, attempt)
                if change.new_attempt is not None:
                    self._box.send_slots(job_id, change.new_attempt.number, job.spec.nodes)
                return Transition(job=self.get(job_id), applied=True)
            if "ConditionalCheckFailed" in reasons:
                return Transition(job=self.get(job_id), applied=False)
            return None  # TransactionConflict: the racer's outcome is visible to the next read

        return self._until_decided(once, f"ending attempt {attempt} of job {job_id!r}")

    def _until_decided(self, once: Callable[[], T | None], doing: str) -> T:
        """Run ``once`` until it decides (returns non-None); None means a TransactionConflict (a
        racing transaction held the same items), retried after a jittered backoff so the racers do
        not collide again in lockstep."""
        for round_ in range(CONFLICT_RETRIES):
            decided = once()
            if decided is not None:
                return decided
            time.sleep(random.uniform(0, 0.02 * (2**round_)))
        raise UserError(f"{doing} in {self.uri} kept conflicting with other writers; try again")

    def _delete_slot_messages(self, job_id: str, attempt: int) -> None:
        """The messages the members of an ended attempt kept hidden: nobody needs them now (a
        receipt gone stale meanwhile leaves its message to be deleted by its next receiver)."""
        for item in self._partition(job_id, slot_sk_prefix(attempt)):
            self._box.delete(held_message(item)[1])

    # -- reading ----------------------------------------------------------------------------

    def _partition(self, job_id: str, prefix: str | None = None) -> list[dict[str, Any]]:
        """The items of one job's partition whose sort key starts with ``prefix`` (None: all of them),
        in one paginated, strongly consistent Query."""
        items: list[dict[str, Any]] = []
        for page in self._ddb.get_paginator("query").paginate(
            **aws_ops.key_condition(self.table, job_pk(job_id), prefix)
        ):
            items.extend(page.get("Items", []))
        return items

    @_aws_call("reading attempts")
    def attempts(self, job_id: str) -> list[Attempt]:
        self.get(job_id)
        return [item_to_attempt(i, self.table) for i in self._partition(job_id, ATTEMPT_PREFIX)]

    @_aws_call("reading the timeline")
    def events(self, job_id: str) -> list[Event]:
        self.get(job_id)
        items = self._partition(job_id, EVENT_PREFIX)  # in sort-key (recording) order
        events = [item_to_event(i, self.table) for i in items]
        order = sorted(range(len(events)), key=lambda i: (events[i].at, i))
        return [events[i] for i in order]

    @_aws_call("reading the jobs with their attempts and timelines")
    def histories(self, states: Iterable[JobState] | None = None) -> list[tuple[Job, list[Attempt], list[Event]]]:
        """Every listed job with its attempts and events, in reads that do not grow twice per job.

        All states: one Scan of the table (paginated: a request per MB of items), not a GetItem and
        a Query of attempts and of events per job: DynamoDB has no Query across the jobs'
        partitions. A consistent Scan holds every write that completed before it began; its filter
        drops node records and slot items after they are read (API_Scan: ConsistentRead,
        FilterExpression, https://docs.aws.amazon.com/amazondynamodb/latest/APIReference/API_Scan.html).
        Needs ``dynamodb:Scan`` on the table (the node role grants it, ``infra/iam.py``).

        Some states (``jobs --state running``): the ``by-state`` index lists them, then one Query of
        each listed job's partition reads its attempts and events together; a Scan would read the
        whole history of the table to find a few running jobs."""
        wanted = {JobState(s) for s in (states if states is not None else JobState)}
        if wanted != set(JobState):
            return [self._history(job, self._partition(job.id)) for job in self.list_jobs(wanted)]
        metas: list[dict[str, Any]] = []
        partitions: dict[str, list[dict[str, Any]]] = {}
        params: dict[str, Any] = {
            "TableName": self.table,
            "ConsistentRead": True,
            "FilterExpression": "#sk = :meta OR begins_with(#sk, :attempt) OR begins_with(#sk, :event)",
            "ExpressionAttributeNames": {"#sk": RANGE_KEY},
            "ExpressionAttributeValues": {
                ":meta": {"S": META},
                ":attempt": {"S": ATTEMPT_PREFIX},
                ":event": {"S": EVENT_PREFIX},
            },
        }
        for page in self._ddb.get_paginator("scan").paginate(**params):
            for item in page.get("Items", []):
                if str(item[RANGE_KEY].get("S")) == META:
                    metas.append(item)
                else:
                    partitions.setdefault(str(item[HASH_KEY].get("S")), []).append(item)
        jobs = sorted(self._readable_jobs(metas), key=lambda j: (j.created_at, j.id))
        return [self._history(job, partitions.get(job_pk(job.id), [])) for job in jobs]

    def _history(self, job: Job, items: Iterable[dict[str, Any]]) -> tuple[Job, list[Attempt], list[Event]]:
        """``job`` with the attempts and events among ``items`` (its partition's), ordered as
        ``attempts`` and ``events`` order them; meta, slot and other items are left out."""
        keyed = sorted(((str(i[RANGE_KEY].get("S")), i) for i in items), key=lambda p: p[0])
        tried = [item_to_attempt(i, self.table) for sk, i in keyed if sk.startswith(ATTEMPT_PREFIX)]
        timeline = [item_to_event(i, self.table) for sk, i in keyed if sk.startswith(EVENT_PREFIX)]
        order = sorted(range(len(timeline)), key=lambda i: (timeline[i].at, i))  # as ``events``: by time
        return job, tried, [timeline[i] for i in order]

    # -- gang slots and node records (GangStore) ----------------------------------------------
    # A slot claim is an item of its own (``slot#<attempt>#<slot>`` in the job's partition), taken
    # and released in a transaction with a ConditionCheck that the job is still QUEUED at that
    # attempt: once a gang starts, its slots cannot change hands. The claim also keeps the slot
    # message that brought it (id, receipt, receive count, body): renewing the slot re-hides the
    # message, releasing it shows the message again, the attempt's end deletes it.

    def _queued_check(self, job_id: str, attempt: int) -> dict[str, Any]:
        return {
            "ConditionCheck": aws_ops.check(
                self.table,
                key(job_id, META),
                "#job_state = :queued AND #attempt = :k",
                {"queued": JobState.QUEUED.value, "k": attempt},
            )
        }

    @_aws_call("reading the job queue")
    def slot_offers(self, *, hide_seconds: float, now: float | None = None) -> list[SlotOffer]:
        for _ in range(MAX_RECEIVES_PER_CLAIM):
            received = self._box.receive(wait_seconds=self.address.wait_seconds, hide_seconds=hide_seconds)
            if received is None:
                break
            offer = self._offer_from(received)
            if offer is not None:
                return [offer]
        return self._stray_offers(self.clock() if now is None else now)

    def _stray_offers(self, now: float) -> list[SlotOffer]:
        """Slots whose message should have come by now (``sweep_grace_s``) but did not — lost
        between a commit and its send, or dead-lettered: read from the table, at most every
        quarter grace period, so an idle fleet does not query the table every second."""
        if time.monotonic() < self._next_stray_sweep:
            return []
        self._next_stray_sweep = time.monotonic() + self.sweep_grace_s / 4
        cutoff = now - self.sweep_grace_s
        lost: list[SlotOffer] = []
        for job in self._readable_jobs(self._by_state(JobState.RUNNING)):
            if job.worker != gang_worker(job.id, job.attempt):
                if job.lease_until is not None and job.lease_until < cutoff:
                    lost.append(SlotOffer(job_id=job.id, attempt=job.attempt, slot=0, lost=True))
                continue
            stale = view(self.slot_claims(job.id, job.attempt), job.spec.nodes, cutoff).free_slots
            lost += [SlotOffer(job_id=job.id, attempt=job.attempt, slot=s, lost=True) for s in stale[:1]]
        free: list[SlotOffer] = []
        queued = self._by_state(JobState.QUEUED, filter_expression="#updated_at < :cutoff", cutoff=cutoff)
        for job in self._readable_jobs(queued):
            current = view(self.slot_claims(job.id, job.attempt), job.spec.nodes, now)
            free += [SlotOffer(job_id=job.id, attempt=job.attempt, slot=s) for s in current.free_slots]
        return lost + free

    @_aws_call("deleting a job queue message")
    def offer_done(self, offer: SlotOffer) -> None:
        if isinstance(offer.ref, ReceivedMessage):
            self._box.delete(offer.ref.receipt)

    @_aws_call("returning a job queue message")
    def offer_back(self, offer: SlotOffer, *, delay_seconds: float = 0.0) -> None:
        if isinstance(offer.ref, ReceivedMessage):
            self._box.give_back(offer.ref, delay_seconds=delay_seconds)

    @_aws_call("claiming a gang slot")
    def take_slot(self, claim: SlotClaim, *, now: float, offer: SlotOffer | None = None) -> bool:
        item = slot_item(claim)
        if offer is not None and isinstance(offer.ref, ReceivedMessage):
            message = offer.ref
            item.update(
                {
                    "message_id": av(message.message_id),
                    "receipt": av(message.receipt),
                    "receives": av(message.receive_count),
                    "body": av(message.body.model_dump_json()),
                }
            )
        return (
            self._transact(
                [
                    self._queued_check(claim.job_id, claim.attempt),
                    {
                        "Put": aws_ops.put(
                            self.table,
                            item,
                            condition="attribute_not_exists(#pk) OR #lease_until < :now OR #worker = :w",
                            values={"now": now, "w": claim.worker},
                        )
                    },
                ]
            )
            is None
        )

    @_aws_call("renewing a gang slot")
    def renew_slot(self, job_id: str, attempt: int, slot: int, worker: str, *, lease_until: float) -> bool:
        return self._renew_holding(
            aws_ops.update(
                self.table,
                key(job_id, slot_sk(attempt, slot)),
                {"lease_until": lease_until},
                condition="attribute_exists(#pk) AND #worker = :w",
                values={"w": worker},
            ),
            lease_until=lease_until,
        )

    @_aws_call("releasing a gang slot")
    def release_slot(self, job_id: str, attempt: int, slot: int, worker: str) -> bool:
        slot_key = key(job_id, slot_sk(attempt, slot))
        record = self._ddb.get_item(TableName=self.table, Key=slot_key, ConsistentRead=True).get("Item") or {}
        released = (
            self._transact(
                [
                    self._queued_check(job_id, attempt),
                    {"Delete": aws_ops.delete(self.table, slot_key, condition="#worker = :w", values={"w": worker})},
                ]
            )
            is None
        )
        message = held_slot_message(record)
        if released and message is not None:
            self._box.give_back(message)  # the slot is free again: so is its wake-up
        return released

    @_aws_call("reading gang slots")
    def slot_claims(self, job_id: str, attempt: int) -> list[SlotClaim]:
        return [item_to_slot(i, self.table) for i in self._partition(job_id, slot_sk_prefix(attempt))]

    @_aws_call("recording a node")
    def register_node(self, node: NodeRecord) -> None:
        self._ddb.put_item(**aws_ops.put(self.table, node_item(node)))

    @_aws_call("listing nodes")
    def nodes(self) -> list[NodeRecord]:
        params = aws_ops.key_condition(self.table, NODES_PK, NODE_PREFIX)
        items = [i for page in self._ddb.get_paginator("query").paginate(**params) for i in page.get("Items", [])]
        return sorted((item_to_node(i, self.table) for i in items), key=lambda n: n.id)

    # -- cancelling -------------------------------------------------------------------------------

    @_aws_call("cancelling a job")
    def cancel(self, job_id: str, *, grace_seconds: float = CANCEL_GRACE_S) -> Job:
        def once() -> Job | None:
            item = self._meta(job_id)
            if item is None:
                raise UnknownJob(job_id, self.uri)
            job = item_to_job(item, self.table)
            change = transitions.cancel(job, grace_seconds=grace_seconds, now=self.clock())
            if isinstance(change, Refusal):
                if change.error:
                    raise NotCancellable(job, change.reason)
                return job
            if self._transact(self._change_items(job_id, change)) is not None:
                return None  # it was claimed (or changed) meanwhile: decide again
            if change.stop is not None:
                # After the flag: an attempt that ends meanwhile ends CANCELLED anyway.
                self._until_decided(lambda: self._store_stop(job_id, change.guard, change.stop), "recording the stop")
            else:
                self._delete_slot_messages(job_id, job.attempt)  # members waiting for the gang let go
            return self.get(job_id)

        return self._until_decided(once, f"cancelling job {job_id!r}")

    @_aws_call("resuming a job")
    def resume(self, job_id: str, *, from_step: int | None = None) -> Job:
        def once() -> Job | None:
            item = self._meta(job_id)
            if item is None:
                raise UnknownJob(job_id, self.uri)
            job = item_to_job(item, self.table)
            change = transitions.resume(job, from_step=from_step, now=self.clock())
            if isinstance(change, Refusal):
                raise NotResumable(job, change.reason)
            if self._transact(self._change_items(job_id, change)) is not None:
                return None  # another resume (or a change) won meanwhile: read again and decide
            assert change.new_attempt is not None  # a resume always queues attempt k+1
            self._box.send_slots(job_id, change.new_attempt.number, job.spec.nodes)
            return self.get(job_id)

        return self._until_decided(once, f"resuming job {job_id!r}")

    # -- stop requests ----------------------------------------------------------------------------
    # The stop request of attempt k lives on the job's meta item: ``stop_attempt`` = k and
    # ``stop_request`` = the request as JSON. One transaction writes it, conditional on the job
    # RUNNING at k and no request for k yet, together with its timeline event; so the first request
    # per attempt wins, a later attempt overwrites the pair, and a member polls it with one
    # consistent GetItem of two attributes.

    @_aws_call("requesting a stop")
    def request_stop(self, job_id: str, attempt: int, notice: Notice) -> bool:
        change = transitions.request_stop(attempt, notice, now=self.clock())
        assert change.stop is not None

        def once() -> bool | None:
            stored = self._store_stop(job_id, change.guard, change.stop)
            if stored is False and self._meta(job_id) is None:
                raise UnknownJob(job_id, self.uri)
            return stored

        return self._until_decided(once, f"requesting a stop of job {job_id!r} attempt {attempt}")

    def _store_stop(self, job_id: str, guard: Guard, stop: StopRecord | None) -> bool | None:
        """Write ``stop`` on the job item under ``guard``, only if its attempt has no request yet,
        with its timeline event. False: the guard failed or a request came first; None: a
        TransactionConflict (decide again)."""
        assert stop is not None
        condition, values = _guard_condition(guard)
        event = stop.event
        reasons = self._transact(
            [
                {
                    "Update": aws_ops.update(
                        self.table,
                        key(job_id, META),
                        {"stop_attempt": stop.attempt, "stop_request": stop.request.model_dump_json()},
                        condition=f"{condition} AND (attribute_not_exists(#stop_attempt) OR #stop_attempt <> :stop_k)",
                        values={**values, "stop_k": stop.attempt},
                    )
                },
                self._event(job_id, event.attempt, event.kind, event.at, event.data),
            ]
        )
        if reasons is None:
            return True
        return False if "ConditionalCheckFailed" in reasons else None

    @_aws_call("reading a stop request")
    def stop_request(self, job_id: str, attempt: int) -> Notice | None:
        item = (
            self._ddb.get_item(
                TableName=self.table,
                Key=key(job_id, META),
                ConsistentRead=True,
                ProjectionExpression="#stop_attempt, #stop_request",
                ExpressionAttributeNames={"#stop_attempt": "stop_attempt", "#stop_request": "stop_request"},
            ).get("Item")
            or {}
        )
        if "stop_attempt" not in item or plain(item["stop_attempt"]) != attempt or "stop_request" not in item:
            return None
        try:
            return StopRequest.model_validate_json(plain(item["stop_request"])).notice()
        except ValueError as err:  # pydantic's ValidationError included
            raise UserError(
                f"the stop request of job {job_id!r} attempt {attempt} in table {self.table} is unreadable "
                f"({' '.join(str(err).split())[:200]}); it was not written by gpucloud"
            ) from err


# The job item's attribute for a model field, where the names differ (``job_state`` keys the index).
_JOB_ATTRIBUTES = {"state": STATE_INDEX_HASH_KEY}


def _stored(value: Any) -> Any:
    return value.value if isinstance(value, enum.Enum) else value


def _guard_condition(guard: Guard) -> tuple[str, dict[str, Any]]:
    """The ConditionExpression (and its values) under which a change to the job item applies."""
    condition = "#job_state = :guard_state AND #attempt = :guard_k"
    values: dict[str, Any] = {"guard_state": guard.state.value, "guard_k": guard.attempt}
    if guard.worker is not None:
        condition += " AND #worker = :guard_w"
        values["guard_w"] = guard.worker
    if guard.lease_expired_at is not None:
        condition += " AND #lease_until < :guard_now"
        values["guard_now"] = guard.lease_expired_at
    return condition, values
