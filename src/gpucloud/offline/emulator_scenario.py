"""The IMDS emulator's state and its answers, without any sockets.

``EmulatorScenario.answer(method, path, headers)`` is the whole IMDS contract as the EC2 User Guide
documents it ("Use the Instance Metadata Service"; AWS's own emulator, AEMM, fixed where it strays
from AWS): token PUT rules (TTL 1..21600 else 400, ``X-Forwarded-For`` or a versioned path -> 403,
GET on the token path -> 405), 401 for a missing, unknown or expired token, ``text/plain``
bodies, 404 for an item that is not there, ``[]`` for no scheduled events, a *fixed* notice time
(set when the notice is injected, not recomputed per request), ``instance-life-cycle`` ``spot``
and the identity document. Scenario methods and fault injection are thread-safe and may be called
while the server is answering.
"""

from __future__ import annotations

import dataclasses
import json
import re
import secrets
import threading
import time
from collections.abc import Callable
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from gpucloud.signals import interpret
from gpucloud.signals.imds import MAX_TOKEN_TTL, MIN_TOKEN_TTL, TOKEN_HEADER, TOKEN_PATH, TOKEN_TTL_HEADER

# What a hang fault stalls: any request, token PUTs only, metadata GETs only, or one metadata path.
HANG_TARGETS = ("any", "token", "metadata")
HangTarget = str

_VERSIONED_TOKEN_PATH = re.compile(r"^/[^/]+/api/token/?$")
_NOT_FOUND_BODY = (
    '<?xml version="1.0" encoding="iso-8859-1"?>\n<!DOCTYPE html>\n<html><head><title>404 - Not Found</title>'
    "</head><body><h1>404 - Not Found</h1></body></html>\n"
)
_META_DATA_INDEX = "\n".join(
    [
        "ami-id",
        "autoscaling/",
        "events/",
        "instance-id",
        "instance-life-cycle",
        "instance-type",
        "local-ipv4",
        "placement/",
        "spot/",
    ]
)
_MALFORMED_BODY = '{"action": "terminate", "time": "20'  # truncated JSON: what a proxy cut-off looks like


class InstanceIdentity(BaseModel):
    """Static facts the emulator serves (defaults follow AEMM, except life cycle ``spot``)."""

    model_config = ConfigDict(extra="forbid")

    instance_id: str = "i-1234567890abcdef0"
    instance_type: str = "p5.48xlarge"
    instance_life_cycle: Literal["spot", "on-demand"] = "spot"
    region: str = "us-east-1"
    availability_zone: str = "us-east-1a"
    account_id: str = "123456789012"
    image_id: str = "ami-0123456789abcdef0"
    private_ip: str = "10.0.0.10"

    def document(self) -> dict[str, Any]:
        return {
            "accountId": self.account_id,
            "architecture": "x86_64",
            "availabilityZone": self.availability_zone,
            "imageId": self.image_id,
            "instanceId": self.instance_id,
            "instanceType": self.instance_type,
            "pendingTime": "2026-01-01T00:00:00Z",
            "privateIp": self.private_ip,
            "region": self.region,
            "version": "2017-09-30",
        }


@dataclasses.dataclass(frozen=True)
class Answer:
    status: int
    body: str = ""
    headers: tuple[tuple[str, str], ...] = ()
    hang: float = 0.0  # seconds to stall before answering (fault injection)


@dataclasses.dataclass
class _Timed:
    value: Any
    appears_at: float


@dataclasses.dataclass
class ScheduledEvent:
    event_id: str
    code: str
    not_before: float
    state: str
    not_after: float | None

    def document(self) -> dict[str, Any]:
        doc = {
            "Code": self.code,
            "Description": f"The instance is scheduled for {self.code}",
            "EventId": self.event_id,
            "NotBefore": interpret.format_event_time(self.not_before),
            "State": self.state,
        }
        if self.not_after is not None:
            doc["NotAfter"] = interpret.format_event_time(self.not_after)
        return doc


@dataclasses.dataclass
class _Faults:
    token_failures: int = 0
    status: int = 500
    status_count: int = 0
    hang_seconds: float = 0.0
    hang_count: int = 0
    hang_target: HangTarget = "any"
    malformed: int = 0


class EmulatorScenario:
    def __init__(
        self,
        identity: InstanceIdentity,
        *,
        token_max_ttl: int = MAX_TOKEN_TTL,
        require_token: bool = True,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if not MIN_TOKEN_TTL <= token_max_ttl <= MAX_TOKEN_TTL:
            raise ValueError(f"token_max_ttl must be {MIN_TOKEN_TTL}..{MAX_TOKEN_TTL} seconds, got {token_max_ttl}")
        self.identity = identity
        self.token_max_ttl = int(token_max_ttl)
        self.require_token = require_token  # IMDSv2 required (HttpTokens=required), as on v2.0 AMIs
        self.clock = clock
        self._lock = threading.RLock()
        self._tokens: dict[str, float] = {}
        self._faults = _Faults()
        self._stats: dict[str, int] = {}
        self._reset_scenario()

    def _reset_scenario(self) -> None:
        self._spot: _Timed | None = None  # value: {"action", "time"}
        self._termination_time: _Timed | None = None  # value: epoch seconds
        self._rebalance: _Timed | None = None  # value: epoch seconds (noticeTime)
        self._lifecycle: list[_Timed] = []  # value: target state; none -> 404 (not in an ASG)
        self._events: list[ScheduledEvent] = []

    # -- scenario control ----------------------------------------------------------------------
    def spot_interruption(
        self,
        action: str = "terminate",
        *,
        lead_seconds: float = 120,
        at: float | None = None,
        with_rebalance: bool = False,
    ) -> None:
        """A spot notice appearing at ``at`` (default now) for ``at + lead_seconds`` (hibernate: ``at``)."""
        if action not in interpret.SPOT_ACTIONS:
            raise ValueError(f"spot action {action!r} is not one of {', '.join(interpret.SPOT_ACTIONS)}")
        if lead_seconds < 0:
            raise ValueError(f"lead_seconds must be >= 0, got {lead_seconds}")
        with self._lock:
            appears = self.clock() if at is None else float(at)
            when = appears if action == "hibernate" else appears + lead_seconds
            self._spot = _Timed({"action": action, "time": interpret.format_rfc3339(when)}, appears)
            # The legacy item exists only when the instance is marked for termination.
            self._termination_time = _Timed(when, appears) if action == "terminate" else None
            if with_rebalance:
                self._rebalance = _Timed(appears, appears)

    def rebalance(self, at: float | None = None) -> None:
        with self._lock:
            appears = self.clock() if at is None else float(at)
            self._rebalance = _Timed(appears, appears)

    def set_lifecycle_state(self, state: str, *, at: float | None = None) -> None:
        """The ASG target lifecycle state from ``at`` (default now), e.g. ``InService`` then ``Terminated``."""
        if state not in interpret.LIFECYCLE_STATES:
            raise ValueError(f"lifecycle state {state!r} is not one of {', '.join(interpret.LIFECYCLE_STATES)}")
        with self._lock:
            appears = self.clock() if at is None else float(at)
            self._lifecycle.append(_Timed(state, appears))
            self._lifecycle.sort(key=lambda item: item.appears_at)

    def add_scheduled_event(
        self,
        code: str,
        not_before: float,
        *,
        state: str = "active",
        not_after: float | None = None,
        event_id: str | None = None,
    ) -> str:
        """Add a scheduled event (times in epoch seconds); returns its EventId."""
        if code not in interpret.EVENT_CODES:
            raise ValueError(f"event code {code!r} is not one of {', '.join(interpret.EVENT_CODES)}")
        if state not in interpret.EVENT_STATES:
            raise ValueError(f"event state {state!r} is not one of {', '.join(interpret.EVENT_STATES)}")
        if not_after is not None and not_after < not_before:
            raise ValueError("not_after must not be before not_before")
        with self._lock:
            event = ScheduledEvent(
                event_id or f"instance-event-{secrets.token_hex(8)}", code, float(not_before), state, not_after
            )
            self._events.append(event)
            return event.event_id

    def set_scheduled_event_state(self, event_id: str, state: str) -> None:
        """Move a scheduled event to ``completed`` or ``canceled`` (or back to ``active``)."""
        if state not in interpret.EVENT_STATES:
            raise ValueError(f"event state {state!r} is not one of {', '.join(interpret.EVENT_STATES)}")
        with self._lock:
            for event in self._events:
                if event.event_id == event_id:
                    event.state = state
                    return
        raise KeyError(f"no scheduled event {event_id!r}")

    def stale_termination_time(self, seconds_ago: float = 600, *, with_instance_action: bool = False) -> None:
        """A termination that failed: ``termination-time`` (and optionally the notice) stays in the past."""
        with self._lock:
            now = self.clock()
            when = now - seconds_ago
            self._termination_time = _Timed(when, now)
            if with_instance_action:
                self._spot = _Timed({"action": "terminate", "time": interpret.format_rfc3339(when)}, now)

    def clear(self) -> None:
        """Back to a quiet instance: no notices, no lifecycle state, no events, no pending faults."""
        with self._lock:
            self._reset_scenario()
            self._faults = _Faults()

    # -- fault injection -----------------------------------------------------------------------
    def fail_tokens(self, count: int) -> None:
        """A 401 storm: the next ``count`` metadata GETs answer 401 and revoke the token they carried."""
        _check_count(count)
        with self._lock:
            self._faults.token_failures = count

    def fail_with(self, status: int, count: int) -> None:
        if not 400 <= status <= 599:
            raise ValueError(f"status must be an HTTP error 400..599, got {status}")
        _check_count(count)
        with self._lock:
            self._faults.status, self._faults.status_count = status, count

    def hang(self, seconds: float, count: int = 1, *, target: HangTarget = "any") -> None:
        """Stall the next ``count`` matching requests. ``target``: ``any``; ``token`` (token PUTs:
        the hop-limit failure); ``metadata`` (GETs); or one path such as
        ``/latest/meta-data/events/maintenance/scheduled``."""
        if seconds < 0:
            raise ValueError(f"hang seconds must be >= 0, got {seconds}")
        if target not in HANG_TARGETS and not target.startswith("/latest/"):
            raise ValueError(f"hang target {target!r} is not one of {', '.join(HANG_TARGETS)} or a /latest/... path")
        _check_count(count)
        with self._lock:
            self._faults.hang_seconds, self._faults.hang_count, self._faults.hang_target = float(seconds), count, target

    def malformed(self, count: int) -> None:
        """The next ``count`` metadata GETs answer 200 with a truncated JSON body."""
        _check_count(count)
        with self._lock:
            self._faults.malformed = count

    # -- observation ---------------------------------------------------------------------------
    def stats(self) -> dict[str, int]:
        with self._lock:
            return dict(self._stats)

    def snapshot(self) -> dict[str, Any]:
        """The scenario as JSON (``GET /gpucloud/emulator/state``)."""
        with self._lock:
            now = self.clock()
            return {
                "now": now,
                "spot": _timed_json(self._spot, now),
                "termination_time": _timed_json(self._termination_time, now),
                "rebalance": _timed_json(self._rebalance, now),
                "lifecycle": [_timed_json(item, now) for item in self._lifecycle],
                "scheduled_events": [event.document() for event in self._events],
                "faults": dataclasses.asdict(self._faults),
                "require_token": self.require_token,
                "token_max_ttl": self.token_max_ttl,
                "live_tokens": sum(1 for expiry in self._tokens.values() if expiry > now),
                "stats": dict(self._stats),
            }

    # -- the IMDS contract ---------------------------------------------------------------------
    def answer(self, method: str, path: str, headers: dict[str, str]) -> Answer:
        """The answer to one request (header names compared case-insensitively)."""
        headers = {key.lower(): value for key, value in headers.items()}
        path = path.split("?", 1)[0]
        with self._lock:
            self._count(f"{method} {path}")
            is_token = path.rstrip("/") == TOKEN_PATH or bool(_VERSIONED_TOKEN_PATH.match(path))
            hang = self._take_hang("token" if is_token and method == "PUT" else "metadata", path)
            if method == "PUT":
                answer = self._token_put(path, headers) if is_token else _text(403, "Forbidden")
            elif method in ("GET", "HEAD"):
                answer = _text(405, "Method Not Allowed") if is_token else self._metadata_get(path, headers)
            else:
                answer = _text(405, "Method Not Allowed")
            self._count(f"status {answer.status}")
            return dataclasses.replace(answer, hang=hang)

    def _count(self, key: str) -> None:
        self._stats[key] = self._stats.get(key, 0) + 1

    def _take_hang(self, kind: str, path: str) -> float:
        faults = self._faults
        if faults.hang_count > 0 and faults.hang_target in ("any", kind, path.rstrip("/")):
            faults.hang_count -= 1
            return faults.hang_seconds
        return 0.0

    def _token_put(self, path: str, headers: dict[str, str]) -> Answer:
        if path.rstrip("/") != TOKEN_PATH or "x-forwarded-for" in headers:
            return _text(403, "Forbidden")
        raw = headers.get(TOKEN_TTL_HEADER.lower(), "").strip()
        if not raw.isdigit() or not MIN_TOKEN_TTL <= int(raw) <= MAX_TOKEN_TTL:
            return _text(400, "Missing or Invalid Parameters")
        ttl = min(int(raw), self.token_max_ttl)
        token = secrets.token_urlsafe(32)
        now = self.clock()
        self._tokens = {key: exp for key, exp in self._tokens.items() if exp > now}
        self._tokens[token] = now + ttl
        self._count("tokens issued")
        return _text(200, token, ((TOKEN_TTL_HEADER, str(ttl)),))

    def _metadata_get(self, path: str, headers: dict[str, str]) -> Answer:
        now = self.clock()
        token = headers.get(TOKEN_HEADER.lower())
        faults = self._faults
        if faults.token_failures > 0:  # a 401 storm: the presented token is rejected and revoked
            faults.token_failures -= 1
            self._tokens.pop(token or "", None)
            return _text(401, "Unauthorized")
        extra: tuple[tuple[str, str], ...] = ()
        if token is not None or self.require_token:
            expiry = self._tokens.get(token or "")
            if expiry is None or expiry <= now:
                return _text(401, "Unauthorized")
            extra = ((TOKEN_TTL_HEADER, str(max(0, int(expiry - now)))),)
        if faults.status_count > 0:
            faults.status_count -= 1
            return _text(faults.status, "Internal Server Error" if faults.status == 500 else "Error")
        if faults.malformed > 0:
            faults.malformed -= 1
            return _text(200, _MALFORMED_BODY, extra)
        body = self._item(path.rstrip("/"), now)
        if body is None:
            return _text(404, _NOT_FOUND_BODY)
        return _text(200, body, extra)

    def _item(self, path: str, now: float) -> str | None:
        ident = self.identity
        static = {
            "/latest/meta-data/instance-id": ident.instance_id,
            "/latest/meta-data/instance-type": ident.instance_type,
            "/latest/meta-data/instance-life-cycle": ident.instance_life_cycle,
            "/latest/meta-data/ami-id": ident.image_id,
            "/latest/meta-data/local-ipv4": ident.private_ip,
            "/latest/meta-data/placement/availability-zone": ident.availability_zone,
            "/latest/meta-data/placement/region": ident.region,
            "/latest/meta-data/events/maintenance/history": "[]",
            "/latest/dynamic/instance-identity/document": json.dumps(ident.document(), indent=2),
        }
        if path in static:
            return static[path]
        if path == "/latest/meta-data":
            return _META_DATA_INDEX
        if path == interpret.INSTANCE_ACTION:
            spot = _visible(self._spot, now)
            return json.dumps(spot) if spot is not None else None
        if path == interpret.TERMINATION_TIME:
            when = _visible(self._termination_time, now)
            return interpret.format_rfc3339(when) if when is not None else None
        if path == interpret.REBALANCE:
            notice_time = _visible(self._rebalance, now)
            return (
                json.dumps({"noticeTime": interpret.format_rfc3339(notice_time)}) if notice_time is not None else None
            )
        if path == interpret.TARGET_LIFECYCLE_STATE:
            current = [item.value for item in self._lifecycle if item.appears_at <= now]
            return current[-1] if current else None
        if path == interpret.SCHEDULED_EVENTS:
            return json.dumps([event.document() for event in self._events])
        return None


def _visible(item: _Timed | None, now: float) -> Any:
    return item.value if item is not None and item.appears_at <= now else None


def _timed_json(item: _Timed | None, now: float) -> dict[str, Any] | None:
    if item is None:
        return None
    return {"value": item.value, "appears_at": item.appears_at, "visible": item.appears_at <= now}


def _text(status: int, body: str, headers: tuple[tuple[str, str], ...] = ()) -> Answer:
    return Answer(status=status, body=body, headers=headers)


def _check_count(count: int) -> None:
    if int(count) != count or count < 0:
        raise ValueError(f"count must be a whole number >= 0, got {count}")


# -- control API request bodies (also validate the CLI's flags) ---------------------------------
# Every number has a finite range, so no request can make a time the RFC 3339 and IMDS formats
# cannot write (an ``at`` of 1e308, a lead of 10**400, NaN): each is a 400 naming the field.
MAX_EPOCH = 253402300799.0  # 9999-12-31T23:59:59Z, the last second both time formats can write
MAX_SECONDS = 10 * 365 * 86400.0  # a lead, a delay or an age: ten years is more than any scenario
MAX_COUNT = 1_000_000_000
Epoch = Annotated[float, Field(ge=0, le=MAX_EPOCH)]
Seconds = Annotated[float, Field(ge=0, le=MAX_SECONDS)]


class _Request(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


class SpotInterruptionRequest(_Request):
    action: Literal["terminate", "stop", "hibernate"] = "terminate"
    lead_seconds: Seconds = 120.0
    at: Epoch | None = None  # epoch seconds; or
    after: Seconds | None = None  # seconds from now
    with_rebalance: bool = False


class RebalanceRequest(_Request):
    at: Epoch | None = None
    after: Seconds | None = None


class LifecycleRequest(_Request):
    state: Literal[interpret.LIFECYCLE_STATES] = "Terminated"  # type: ignore[valid-type]
    at: Epoch | None = None
    after: Seconds | None = None


class ScheduledEventRequest(_Request):
    code: Literal[interpret.EVENT_CODES] = "system-reboot"  # type: ignore[valid-type]
    not_before: Epoch | None = None  # epoch seconds; or
    not_before_in: float | None = Field(None, ge=-MAX_SECONDS, le=MAX_SECONDS)  # seconds from now
    state: Literal[interpret.EVENT_STATES] = "active"  # type: ignore[valid-type]
    not_after: Epoch | None = None
    event_id: str | None = None


class ScheduledEventStateRequest(_Request):
    event_id: str
    state: Literal[interpret.EVENT_STATES]  # type: ignore[valid-type]


class StaleTerminationRequest(_Request):
    seconds_ago: float = Field(600.0, gt=0, le=MAX_SECONDS)
    with_instance_action: bool = False


class FaultRequest(_Request):
    kind: Literal["token", "status", "hang", "malformed", "refuse"]
    count: int = Field(1, ge=0, le=MAX_COUNT)
    status: int = Field(500, ge=400, le=599)
    seconds: Seconds = 0.0  # hang: stall per request; refuse: how long to refuse
    target: str = Field("any", description="any, token, metadata, or a /latest/... path")

    @field_validator("target")
    @classmethod
    def _known_target(cls, value: str) -> str:
        if value not in HANG_TARGETS and not value.startswith("/latest/"):
            raise ValueError(f"{value!r} is not one of {', '.join(HANG_TARGETS)} or a /latest/... path")
        return value
