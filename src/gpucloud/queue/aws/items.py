"""Pure mapping between the job model and DynamoDB items (low-level attribute values).

Keys follow ``aws_schema``. Absent optional fields are left out of an item rather than stored as
NULL, so a condition such as ``attribute_not_exists(worker)`` means what it says. Numbers travel
as decimal strings (``repr`` of a float round-trips exactly), which is what DynamoDB's ``N`` type
takes; nothing here needs ``Decimal``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from pydantic import ValidationError

from gpucloud.errors import UserError
from gpucloud.lifecycle.model import Attempt, AttemptState, Event, Job, JobSpec, JobState, NodeRecord, SlotClaim
from gpucloud.payload import parse_json
from gpucloud.queue.aws.schema import HASH_KEY, RANGE_KEY, STATE_INDEX_HASH_KEY, STATE_INDEX_RANGE_KEY

META = "meta"
PROGRESS_FIELDS = ("last_step", "step_rate", "progress_at")  # the job's live progress (``JobQueue.heartbeat``)
ATTEMPT_PREFIX = "attempt#"
EVENT_PREFIX = "event#"

Item = dict[str, dict[str, Any]]


def job_pk(job_id: str) -> str:
    return f"job#{job_id}"


def attempt_sk(number: int) -> str:
    return f"{ATTEMPT_PREFIX}{number:06d}"


def event_sk(written_ns: int, writer: str, seq: int) -> str:
    """Unique per event; sorts in recording order for one writer (ties on ``at`` keep that order)."""
    return f"{EVENT_PREFIX}{written_ns:020d}#{writer}#{seq:08d}"


def key(job_id: str, sk: str) -> Item:
    return {HASH_KEY: {"S": job_pk(job_id)}, RANGE_KEY: {"S": sk}}


def created_key(created_at: float, job_id: str) -> str:
    """The index's range key: zero-padded so string order is time order, the id breaks ties."""
    return f"{created_at:020.6f}#{job_id}"


def av(value: str | int | float | bool) -> dict[str, Any]:
    """One attribute value."""
    if isinstance(value, bool):
        return {"BOOL": value}
    if isinstance(value, str):
        return {"S": value}
    if isinstance(value, (int, float)):
        return {"N": repr(value)}
    raise TypeError(f"cannot store {type(value).__name__} in the job table")


def plain(value: Mapping[str, Any]) -> Any:
    """The Python value of one attribute value (the subset ``av`` writes)."""
    if "S" in value:
        return value["S"]
    if "N" in value:
        number = value["N"]
        return int(number) if number.lstrip("-").isdigit() else float(number)
    if "BOOL" in value:
        return bool(value["BOOL"])
    if "NULL" in value:
        return None
    raise ValueError(f"unexpected attribute type {sorted(value)}")


def _fields(item: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    return {name: plain(value) for name, value in item.items()}


# -- jobs ---------------------------------------------------------------------------------------


def job_item(job: Job) -> Item:
    item = key(job.id, META)
    item.update(
        {
            "job_id": av(job.id),
            "spec": av(job.spec.model_dump_json()),
            STATE_INDEX_HASH_KEY: av(job.state.value),
            STATE_INDEX_RANGE_KEY: av(created_key(job.created_at, job.id)),
            "attempt": av(job.attempt),
            "crashes": av(job.crashes),
            "created_at": av(job.created_at),
            "updated_at": av(job.updated_at),
        }
    )
    for name in ("worker", "lease_until", "reason", "exit_code", "cancel_requested_at", *PROGRESS_FIELDS):
        value = getattr(job, name)
        if value is not None:
            item[name] = av(value)
    return item


def item_to_job(item: Mapping[str, Mapping[str, Any]], table: str) -> Job:
    fields = _fields(item)
    job_id = fields.get("job_id", fields.get(HASH_KEY, "?"))
    try:
        return Job(
            id=job_id,
            spec=JobSpec.model_validate_json(fields["spec"]),
            state=JobState(fields[STATE_INDEX_HASH_KEY]),
            attempt=fields["attempt"],
            crashes=fields.get("crashes", 0),
            created_at=fields["created_at"],
            updated_at=fields["updated_at"],
            worker=fields.get("worker"),
            lease_until=fields.get("lease_until"),
            reason=fields.get("reason"),
            exit_code=fields.get("exit_code"),
            cancel_requested_at=fields.get("cancel_requested_at"),
            **{name: fields.get(name) for name in PROGRESS_FIELDS},
        )
    except KeyError as err:
        raise UserError(
            f"job {job_id!r} in table {table} is unreadable (missing {err.args[0]}); it was not written by gpucloud"
        ) from err
    except (ValueError, ValidationError) as err:
        raise UserError(
            f"job {job_id!r} in table {table} is unreadable ({_first_problem(err)}); it was not written by gpucloud"
        ) from err


def held_message(item: Mapping[str, Mapping[str, Any]]) -> tuple[str | None, str | None]:
    """(message id, receipt handle) of the slot message the current holder keeps hidden, if any."""
    fields = _fields(item)
    return fields.get("message_id"), fields.get("receipt")


# -- attempts -----------------------------------------------------------------------------------


def attempt_item(job_id: str, number: int, state: AttemptState, created_at: float, **fields: Any) -> Item:
    item = key(job_id, attempt_sk(number))
    item.update({"job_id": av(job_id), "number": av(number), "state": av(state.value), "created_at": av(created_at)})
    for name, value in fields.items():
        if value is not None:
            item[name] = av(value)
    return item


def item_to_attempt(item: Mapping[str, Mapping[str, Any]], table: str) -> Attempt:
    fields = {k: v for k, v in _fields(item).items() if k not in (HASH_KEY, RANGE_KEY)}
    try:
        return Attempt(**fields)
    except ValidationError as err:
        raise UserError(
            f"an attempt of job {fields.get('job_id')!r} in table {table} is unreadable ({_first_problem(err)})"
        ) from err


# -- timeline events ----------------------------------------------------------------------------


def event_item(job_id: str, attempt: int, kind: str, at: float, data: Mapping[str, Any], sk: str) -> Item:
    item = key(job_id, sk)
    item.update(
        {
            "job_id": av(job_id),
            "attempt": av(attempt),
            "kind": av(kind),
            "at": av(at),
            "data": av(json.dumps(dict(data), default=str)),
        }
    )
    return item


def item_to_event(item: Mapping[str, Mapping[str, Any]], table: str) -> Event:
    fields = _fields(item)
    try:
        return Event(
            job_id=fields["job_id"],
            attempt=fields["attempt"],
            kind=fields["kind"],
            at=fields["at"],
            data=parse_json(fields.get("data") or "{}", "its data", ValueError),
        )
    except (KeyError, ValueError, ValidationError) as err:
        raise UserError(
            f"a timeline event of job {fields.get('job_id')!r} in table {table} is unreadable ({err})"
        ) from err


def _first_problem(err: Exception) -> str:
    if isinstance(err, ValidationError):
        first = err.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "value"
        return f"{where}: {first['msg']}"
    return str(err)


# -- gang slots and node records ----------------------------------------------------------------

SLOT_PREFIX = "slot#"
NODES_PK = "nodes"  # one partition holds every agent's record: a Query lists them, no Scan
NODE_PREFIX = "node#"


def slot_sk_prefix(attempt: int) -> str:
    return f"{SLOT_PREFIX}{attempt:06d}#"


def slot_sk(attempt: int, slot: int) -> str:
    return f"{slot_sk_prefix(attempt)}{slot:04d}"


def slot_item(claim: SlotClaim) -> Item:
    item = key(claim.job_id, slot_sk(claim.attempt, claim.slot))
    item.update({name: av(value) for name, value in claim.model_dump().items()})
    return item


def item_to_slot(item: Mapping[str, Mapping[str, Any]], table: str) -> SlotClaim:
    fields = _fields(item)
    try:
        return SlotClaim(**{name: fields[name] for name in SlotClaim.model_fields})
    except (KeyError, ValidationError) as err:
        raise UserError(
            f"slot claim {fields.get(RANGE_KEY)!r} in table {table} is unreadable ({err}); it was not written by gpucloud"
        ) from err


def node_key(node_id: str) -> Item:
    return {HASH_KEY: {"S": NODES_PK}, RANGE_KEY: {"S": f"{NODE_PREFIX}{node_id}"}}


def node_item(node: NodeRecord) -> Item:
    item = node_key(node.id)
    item["record"] = av(node.model_dump_json())
    return item


def item_to_node(item: Mapping[str, Mapping[str, Any]], table: str) -> NodeRecord:
    fields = _fields(item)
    try:
        return NodeRecord.model_validate_json(fields["record"])
    except (KeyError, ValidationError) as err:
        raise UserError(
            f"node record {fields.get(RANGE_KEY)!r} in table {table} is unreadable; it was not written by gpucloud"
        ) from err
