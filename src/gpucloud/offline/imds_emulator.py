"""An EC2 instance metadata service (IMDSv2) on 127.0.0.1 that can inject interruption notices.

Used by the tests, by ``gpucloud demo`` and by users checking their setup
(``gpucloud imds-emulator``). The answers come from ``EmulatorScenario`` (the IMDS contract);
this module adds the HTTP server, the refuse/accept fault (the listening socket really closes
and reopens on the same port) and the control API under ``/gpucloud/emulator/`` (kept off
``/latest/`` so it can never collide with a real metadata path) for processes that did not start
the emulator::

    POST /gpucloud/emulator/spot-interruption   {"action": "terminate", "lead_seconds": 120, "after": 5, "with_rebalance": false}
    POST /gpucloud/emulator/rebalance           {"after": 0}
    POST /gpucloud/emulator/lifecycle           {"state": "Terminated", "after": 0}
    POST /gpucloud/emulator/scheduled-event     {"code": "instance-stop", "not_before_in": 3600}
    POST /gpucloud/emulator/scheduled-event-state {"event_id": "...", "state": "canceled"}
    POST /gpucloud/emulator/stale-termination-time {"seconds_ago": 600}
    POST /gpucloud/emulator/fault               {"kind": "token|status|hang|malformed|refuse", "count": 1, "status": 500, "seconds": 3}
    POST /gpucloud/emulator/clear
    GET  /gpucloud/emulator/state
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from pydantic import BaseModel, ValidationError

from gpucloud.offline.emulator_scenario import (
    EmulatorScenario,
    FaultRequest,
    InstanceIdentity,
    LifecycleRequest,
    RebalanceRequest,
    ScheduledEventRequest,
    ScheduledEventStateRequest,
    SpotInterruptionRequest,
    StaleTerminationRequest,
)
from gpucloud.payload import parse_json
from gpucloud.signals.imds import MAX_TOKEN_TTL

log = logging.getLogger("gpucloud.signals.emulator")

CONTROL_PREFIX = "/gpucloud/emulator/"
MAX_CONTROL_BODY = 64 * 1024


class ControlRequestError(ValueError):
    """A control API request that cannot be applied (answered 400 with this message)."""


class ImdsEmulator(EmulatorScenario):
    """``EmulatorScenario`` served over HTTP. ``start()`` returns the endpoint; also a context manager."""

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        token_max_ttl: int = MAX_TOKEN_TTL,
        require_token: bool = True,
        clock: Callable[[], float] = time.time,
        **instance_identity: Any,
    ) -> None:
        try:
            identity = InstanceIdentity(**instance_identity)
        except ValidationError as err:
            raise ValueError(f"bad instance identity: {_first_error(err)}") from None
        super().__init__(identity, token_max_ttl=token_max_ttl, require_token=require_token, clock=clock)
        self.host = host
        self.port = int(port)
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self._serving_lock = threading.Lock()
        self._stopping = threading.Event()
        self._reopen_timer: threading.Timer | None = None
        self._started = False

    @property
    def endpoint(self) -> str:
        return f"http://{self.host}:{self.port}"

    # -- server lifecycle ------------------------------------------------------------------------
    def start(self) -> str:
        """Listen (port 0 picks a free one, kept across refuse/accept) and return the endpoint URL."""
        with self._serving_lock:
            if self._started:
                raise RuntimeError("ImdsEmulator already started")
            self._stopping.clear()
            self._open()
            self._started = True
        log.info("IMDS emulator listening on %s", self.endpoint)
        return self.endpoint

    def stop(self) -> None:
        with self._serving_lock:
            self._started = False
            self._stopping.set()  # wakes requests stalled by a hang fault
            if self._reopen_timer is not None:
                self._reopen_timer.cancel()
                self._reopen_timer = None
            self._close()

    def __enter__(self) -> ImdsEmulator:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def refuse_connections(self, seconds: float | None = None) -> None:
        """Close the listening socket: clients get "connection refused" (reopen with ``accept_connections``,
        or by itself after ``seconds``)."""
        with self._serving_lock:
            if not self._started:
                raise RuntimeError("ImdsEmulator is not started")
            self._close()
            if seconds is not None:
                self._reopen_timer = threading.Timer(seconds, self.accept_connections)
                self._reopen_timer.daemon = True
                self._reopen_timer.start()

    def accept_connections(self) -> None:
        """Listen again on the same port."""
        with self._serving_lock:
            if not self._started or self._server is not None:
                return
            self._open()

    @property
    def accepting(self) -> bool:
        return self._server is not None

    def _open(self) -> None:
        server = ThreadingHTTPServer((self.host, self.port), _make_handler(self))
        server.daemon_threads = True  # a request stalled by a hang fault must not block stop()
        self.port = server.server_address[1]
        self._server = server
        self._thread = threading.Thread(
            target=server.serve_forever, kwargs={"poll_interval": 0.05}, name=f"imds-emulator-{self.port}", daemon=True
        )
        self._thread.start()

    def _close(self) -> None:
        server, thread = self._server, self._thread
        if server is not None:
            server.shutdown()
            server.server_close()
        if thread is not None and thread is not threading.current_thread():
            thread.join()
        self._server = self._thread = None  # only now: ``accepting`` is False once the socket is closed

    def _stall(self, seconds: float) -> None:
        self._stopping.wait(seconds)

    # -- control API -----------------------------------------------------------------------------
    def control(self, name: str, body: dict[str, Any]) -> dict[str, Any]:
        """Apply one control request (``name`` is the path after ``/gpucloud/emulator/``); returns the state."""
        handler = _CONTROL.get(name)
        if handler is None:
            raise ControlRequestError(
                f"unknown control request {name!r}; expected one of {', '.join(sorted(_CONTROL))}"
            )
        model_cls, apply = handler
        try:
            request = model_cls.model_validate(body)
        except ValidationError as err:
            raise ControlRequestError(f"{name}: {_first_error(err)}") from None
        try:
            apply(self, request)
        except (ValueError, KeyError, OverflowError) as err:
            raise ControlRequestError(f"{name}: {err.args[0] if err.args else err}") from None
        return self.snapshot()

    def _appears(self, at: float | None, after: float | None) -> float | None:
        if at is not None and after is not None:
            raise ValueError("give either 'at' (epoch seconds) or 'after' (seconds from now), not both")
        return self.clock() + after if after is not None else at


class _Empty(BaseModel):
    model_config = {"extra": "forbid"}


def _apply_spot(emu: ImdsEmulator, req: SpotInterruptionRequest) -> None:
    emu.spot_interruption(
        req.action, lead_seconds=req.lead_seconds, at=emu._appears(req.at, req.after), with_rebalance=req.with_rebalance
    )


def _apply_scheduled(emu: ImdsEmulator, req: ScheduledEventRequest) -> None:
    if (req.not_before is None) == (req.not_before_in is None):
        raise ValueError("give exactly one of 'not_before' (epoch seconds) or 'not_before_in' (seconds from now)")
    not_before = req.not_before if req.not_before is not None else emu.clock() + (req.not_before_in or 0.0)
    emu.add_scheduled_event(req.code, not_before, state=req.state, not_after=req.not_after, event_id=req.event_id)


def _apply_fault(emu: ImdsEmulator, req: FaultRequest) -> None:
    if req.kind == "token":
        emu.fail_tokens(req.count)
    elif req.kind == "status":
        emu.fail_with(req.status, req.count)
    elif req.kind == "hang":
        emu.hang(req.seconds, req.count, target=req.target)
    elif req.kind == "malformed":
        emu.malformed(req.count)
    else:
        if req.seconds <= 0:
            raise ValueError("a 'refuse' fault needs 'seconds' > 0 (how long to refuse, then listen again)")
        # From another thread: the request that asked for it is answered before the socket closes.
        threading.Thread(target=emu.refuse_connections, args=(req.seconds,), daemon=True).start()


_CONTROL: dict[str, tuple[type[BaseModel], Callable[[ImdsEmulator, Any], None]]] = {
    "spot-interruption": (SpotInterruptionRequest, _apply_spot),
    "rebalance": (RebalanceRequest, lambda emu, req: emu.rebalance(at=emu._appears(req.at, req.after))),
    "lifecycle": (
        LifecycleRequest,
        lambda emu, req: emu.set_lifecycle_state(req.state, at=emu._appears(req.at, req.after)),
    ),
    "scheduled-event": (ScheduledEventRequest, _apply_scheduled),
    "scheduled-event-state": (
        ScheduledEventStateRequest,
        lambda emu, req: emu.set_scheduled_event_state(req.event_id, req.state),
    ),
    "stale-termination-time": (
        StaleTerminationRequest,
        lambda emu, req: emu.stale_termination_time(req.seconds_ago, with_instance_action=req.with_instance_action),
    ),
    "fault": (FaultRequest, _apply_fault),
    "clear": (_Empty, lambda emu, req: emu.clear()),
}


def _first_error(err: ValidationError) -> str:
    first = err.errors()[0]
    where = ".".join(str(part) for part in first.get("loc", ())) or "body"
    return f"{where}: {first.get('msg', 'invalid')}"


# -- HTTP ------------------------------------------------------------------------------------------
def _make_handler(emu: ImdsEmulator) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        server_version = "EC2ws"
        sys_version = ""

        def log_message(self, format: str, *args: Any) -> None:
            log.debug("%s %s", self.address_string(), format % args)

        def do_GET(self) -> None:
            if self.path.startswith(CONTROL_PREFIX):
                self._control_get()
            else:
                self._imds()

        def do_HEAD(self) -> None:
            self._imds(head=True)

        def do_PUT(self) -> None:
            self._imds()

        def do_POST(self) -> None:
            if self.path.startswith(CONTROL_PREFIX):
                self._control_post()
            else:
                self._reply(405, "Method Not Allowed")

        def _imds(self, head: bool = False) -> None:
            answer = emu.answer(self.command, self.path, dict(self.headers.items()))
            if answer.hang > 0:
                emu._stall(answer.hang)
            self._reply(answer.status, answer.body, answer.headers, head=head)

        def _control_get(self) -> None:
            if self.path.rstrip("/") == CONTROL_PREFIX + "state":
                self._reply(200, json.dumps(emu.snapshot()), content_type="application/json")
            else:
                self._reply(
                    404,
                    json.dumps(
                        {"error": f"unknown control path {self.path}; GET {CONTROL_PREFIX}state or POST a scenario"}
                    ),
                    content_type="application/json",
                )

        def _control_post(self) -> None:
            name = self.path[len(CONTROL_PREFIX) :].strip("/")
            try:
                declared = (self.headers.get("Content-Length") or "0").strip()
                if not declared.isascii() or not declared.isdigit():
                    self.close_connection = True  # the body's end is unknown: nothing more is read
                    raise ControlRequestError(f"Content-Length {declared[:40]!r} is not a number of bytes")
                length = int(declared) if len(declared) <= 18 else MAX_CONTROL_BODY + 1
                if length > MAX_CONTROL_BODY:
                    self.close_connection = True
                    raise ControlRequestError(
                        f"body of {declared[:40]} bytes is over the {MAX_CONTROL_BODY}-byte limit"
                    )
                raw = self.rfile.read(length) if length else b""
                # parse_json: a 5000-digit number or deep nesting is this one line too
                body = parse_json(raw, f"{name}: body", ControlRequestError) if raw.strip() else {}
                if not isinstance(body, dict):
                    raise ControlRequestError(f"{name}: body must be a JSON object, got {type(body).__name__}")
                state = emu.control(name, body)
            except ControlRequestError as err:
                self._reply(400, json.dumps({"error": str(err)}), content_type="application/json")
                return
            self._reply(200, json.dumps(state), content_type="application/json")

        def _reply(
            self,
            status: int,
            body: str,
            headers: tuple[tuple[str, str], ...] = (),
            *,
            content_type: str = "text/plain",
            head: bool = False,
        ) -> None:
            data = body.encode()
            try:
                self.send_response(status)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(data)))
                for key, value in headers:
                    self.send_header(key, value)
                self.end_headers()
                if not head:
                    self.wfile.write(data)
            except (BrokenPipeError, ConnectionResetError):
                pass  # the client gave up (e.g. its read timeout during a hang fault)

    return Handler
