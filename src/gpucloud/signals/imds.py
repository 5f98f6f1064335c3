"""A small IMDSv2 client: token PUT with a TTL, refresh before expiry, one retry on 401.

Why our own (and not botocore's ``IMDSFetcher`` or the ``ec2-metadata`` package): the watcher needs
a retry with a fresh token on 401, a connect timeout short enough that a hop-limit
misconfiguration is a loud log line rather than a hang, and a client that never raises on an HTTP
status (404 means "no notice", which is the normal answer). Each request uses a new connection, so
a restarted or refusing metadata service is noticed on the very next request.
"""

from __future__ import annotations

import dataclasses
import http.client
import io
import logging
import os
import re
import socket
import threading
import time
from collections.abc import Callable
from urllib.parse import urlsplit

from gpucloud.errors import UserError
from gpucloud.signals.ratelimit import RateLimitedLog

log = logging.getLogger("gpucloud.signals")

DEFAULT_ENDPOINT = "http://169.254.169.254"
DEFAULT_ENDPOINT_IPV6 = "http://[fd00:ec2::254]"
ENDPOINT_ENV = "AWS_EC2_METADATA_SERVICE_ENDPOINT"  # the variable botocore honours too
ENDPOINT_MODE_ENV = "AWS_EC2_METADATA_SERVICE_ENDPOINT_MODE"  # "IPv6" selects the IPv6 address

TOKEN_PATH = "/latest/api/token"
TOKEN_HEADER = "X-aws-ec2-metadata-token"
TOKEN_TTL_HEADER = "X-aws-ec2-metadata-token-ttl-seconds"
MIN_TOKEN_TTL = 1
MAX_TOKEN_TTL = 21600
TOKEN_REFRESH_MARGIN = 15.0
# After a token PUT timed out (hop limit), retry IMDSv2 only this often; in between use IMDSv1.
TOKEN_RETRY_AFTER_TIMEOUT = 30.0

# A token goes back in a request header, so it must be visible ASCII with no spaces or line breaks
# (real tokens are ~56 base64 characters); anything else is a broken answer, never sent back.
_TOKEN_SHAPE = re.compile(r"[\x21-\x7e]{1,1024}")
MAX_BODY = 1024 * 1024  # bytes: every interruption item is tiny; a larger answer is refused, not buffered

HOP_LIMIT_HINT = (
    "IMDS token request timed out — is HttpPutResponseHopLimit ≥ 2 for containers? "
    "(set it in the launch template's metadata options, or run with host networking)"
)


class ImdsUnavailable(Exception):
    """The metadata service could not be reached or did not answer in time (no HTTP status).

    ``reason`` is one of ``refused``, ``connect-timeout``, ``read-timeout`` (no complete answer
    within the request's total time), ``reset``, ``too-large``, ``token-timeout``, ``error``.
    ``SERVICE_DOWN`` are the reasons that say nothing at all can be read now; the others concern one
    request.
    """

    SERVICE_DOWN = frozenset({"refused", "connect-timeout", "token-timeout"})

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


@dataclasses.dataclass(frozen=True)
class ImdsResponse:
    status: int
    text: str
    path: str

    @property
    def ok(self) -> bool:
        return self.status == 200

    @property
    def absent(self) -> bool:
        """404: the item does not exist (for interruption items: no notice)."""
        return self.status == 404


def resolve_endpoint(flag: str | None) -> str:
    """The IMDS base URL: ``flag``, else ``$AWS_EC2_METADATA_SERVICE_ENDPOINT``, else the link-local one.

    ``AWS_EC2_METADATA_SERVICE_ENDPOINT_MODE=IPv6`` picks ``http://[fd00:ec2::254]`` as the default,
    as the AWS SDKs do. Raises ``UserError`` for a value that is not an http(s) URL with a host.
    """
    if flag:
        return _validated_endpoint(flag, "--imds-endpoint")
    env = os.environ.get(ENDPOINT_ENV)
    if env:
        return _validated_endpoint(env, f"${ENDPOINT_ENV}")
    if os.environ.get(ENDPOINT_MODE_ENV, "").strip().lower() == "ipv6":
        return DEFAULT_ENDPOINT_IPV6
    return DEFAULT_ENDPOINT


def _validated_endpoint(value: str, origin: str) -> str:
    value = value.strip()
    try:
        parts = urlsplit(value)
        port = parts.port  # raises ValueError for a non-numeric or out-of-range port
    except ValueError as err:
        raise UserError(
            f"{origin} {value!r} is not a valid URL ({err}); expected http://HOST[:PORT], e.g. {DEFAULT_ENDPOINT}"
        ) from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise UserError(
            f"{origin} {value!r} is not an http(s) URL with a host; expected http://HOST[:PORT], e.g. {DEFAULT_ENDPOINT}"
        )
    if parts.path not in ("", "/") or parts.query or parts.fragment:
        raise UserError(
            f"{origin} {value!r} must be the service root without a path; expected http://HOST[:PORT], e.g. {DEFAULT_ENDPOINT}"
        )
    host = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
    return f"{parts.scheme}://{host}" + (f":{port}" if port is not None else "")


@dataclasses.dataclass
class _Token:
    value: str
    ttl: float  # as granted
    expires_at: float  # on the client's clock

    def refresh_at(self) -> float:
        # NTH refreshes when <= 15 s remain; a short-lived token is refreshed in its last 10 %.
        return self.expires_at - min(TOKEN_REFRESH_MARGIN, self.ttl * 0.1)


class ImdsClient:
    """IMDSv2 GETs with token management. Thread-safe.

    ``get`` returns the status and body for any HTTP answer (404 and 5xx included) and raises
    ``ImdsUnavailable`` only when no answer came: connection refused, connect or read timeout.
    A token PUT that times out is logged loudly with the hop-limit hint; the client then falls back
    to tokenless (IMDSv1) GETs for 30 s, as the AWS SDKs do, so a node with v1 allowed still sees its
    notices. Where IMDSv1 is refused (401), a later token timeout raises ``ImdsUnavailable``
    (``token-timeout``), so a poll round costs one timeout, not one per item.
    """

    def __init__(
        self,
        endpoint: str | None = None,
        *,
        connect_timeout: float = 1.0,
        read_timeout: float = 2.0,
        total_timeout: float | None = None,
        token_ttl: int = 21600,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not MIN_TOKEN_TTL <= int(token_ttl) <= MAX_TOKEN_TTL:
            raise ValueError(f"token_ttl must be {MIN_TOKEN_TTL}..{MAX_TOKEN_TTL} seconds, got {token_ttl}")
        if connect_timeout <= 0 or read_timeout <= 0 or (total_timeout is not None and total_timeout <= 0):
            raise ValueError("connect_timeout, read_timeout and total_timeout must be positive")
        self.endpoint = resolve_endpoint(endpoint)
        parts = urlsplit(self.endpoint)
        self._https = parts.scheme == "https"
        self._host = parts.hostname or ""
        self._port = parts.port or (443 if self._https else 80)
        self.connect_timeout = float(connect_timeout)
        self.read_timeout = float(read_timeout)
        # One request, connect to last byte, never takes longer than this: a service that drips a
        # byte just inside each read timeout would otherwise hold a GET (and the poll round) for minutes.
        self.total_timeout = float(total_timeout) if total_timeout is not None else connect_timeout + read_timeout
        self.token_ttl = int(token_ttl)
        self._clock = clock
        self._lock = threading.Lock()
        self._token: _Token | None = None
        self._v1_until = float("-inf")  # tokenless (IMDSv1) GETs until this time, after a failed token PUT
        self._hop_limit_reported = False
        self._v1_reported = False
        self._v1_refused = False  # a tokenless GET answered 401: IMDSv1 is not an option here
        self.tokens_fetched = 0  # how many token PUTs succeeded (observability and tests)
        self.token_problem: str | None = None  # why the last token PUT gave no token, if it did not
        self._logs = RateLimitedLog(log)

    # -- public -----------------------------------------------------------------------------
    def get(self, path: str) -> ImdsResponse:
        """GET ``path`` (e.g. ``/latest/meta-data/spot/instance-action``) with a valid token."""
        if not path.startswith("/"):
            path = "/" + path
        token = self._current_token()
        response = self._request("GET", path, self._token_headers(token))
        if response.status == 401:
            if token is None:
                # Tokenless (IMDSv1) is refused here (HttpTokens=required), so the v1 fallback is
                # useless: from now on a token timeout is reported as the service being unavailable.
                self._end_v1_fallback()
            else:
                # The token was rejected (expired early, IMDS restarted, revoked): one retry, fresh token.
                self._drop_token(token)
                token = self._current_token()
                response = self._request("GET", path, self._token_headers(token))
        if response.ok and token is not None:
            self._note_remaining_ttl(token, response)
        return response

    def get_text(self, path: str) -> str | None:
        """The body of a 200 answer, None on 404; raises ``ImdsUnavailable`` for anything else."""
        response = self.get(path)
        if response.ok:
            return response.text
        if response.absent:
            return None
        raise ImdsUnavailable("error", f"IMDS {path} answered HTTP {response.status}")

    # -- token management -------------------------------------------------------------------
    def _token_headers(self, token: _Token | None) -> dict[str, str]:
        return {TOKEN_HEADER: token.value} if token is not None else {}

    def _current_token(self) -> _Token | None:
        with self._lock:
            now = self._clock()
            token = self._token
            if token is not None and now < token.refresh_at():
                return token
            if now < self._v1_until:
                return None
            self._token = self._fetch_token()
            return self._token

    def _end_v1_fallback(self) -> None:
        with self._lock:
            self._v1_until = float("-inf")
            self._v1_refused = True

    def _drop_token(self, token: _Token) -> None:
        with self._lock:
            if self._token is token:
                self._token = None

    def _note_remaining_ttl(self, token: _Token, response: ImdsResponse) -> None:
        remaining = response.ttl_remaining if isinstance(response, _TtlAware) else None
        if remaining is None:
            return
        with self._lock:
            if self._token is token:
                token.expires_at = min(token.expires_at, self._clock() + remaining)

    def _fetch_token(self) -> _Token | None:
        """PUT a token request. Called with the lock held. None means "use IMDSv1 for this GET"."""
        try:
            response = self._request("PUT", TOKEN_PATH, {TOKEN_TTL_HEADER: str(self.token_ttl)})
        except ImdsUnavailable as err:
            if err.reason != "read-timeout":
                raise
            # Connected, but the answer never came back: the PUT response's IP TTL (the hop limit)
            # ran out on the way into a container. Say so loudly (once per episode), then try IMDSv1
            # for a while instead of paying this timeout on every request.
            if not self._hop_limit_reported:
                log.error("%s [endpoint %s]", HOP_LIMIT_HINT, self.endpoint)
                self._hop_limit_reported = True
            if self._v1_refused:
                raise ImdsUnavailable("token-timeout", f"{HOP_LIMIT_HINT} [endpoint {self.endpoint}]") from err
            self._v1_until = self._clock() + TOKEN_RETRY_AFTER_TIMEOUT
            return None
        if response.status in (403, 404, 405):
            # IMDSv2 disabled or not offered here (botocore reads these the same way): try IMDSv1.
            if not self._v1_reported:
                log.warning(
                    "IMDS token request to %s answered HTTP %s; continuing without a token (IMDSv1)",
                    self.endpoint,
                    response.status,
                )
                self._v1_reported = True
            self._v1_until = self._clock() + TOKEN_RETRY_AFTER_TIMEOUT
            return None
        if response.status != 200 or not response.text.strip():
            # A transient error (5xx, throttling): this GET goes without a token, the next one retries.
            self._no_token(f"answered HTTP {response.status}{'' if response.status != 200 else ' with no token'}")
            return None
        value = response.text.strip()
        if not _TOKEN_SHAPE.fullmatch(value):
            # Never sent back: a line break in a header would be a request-splitting hazard, and
            # http.client refuses it anyway.
            self._no_token(f"answered a token that is not 1..1024 visible ASCII characters ({value[:20]!r}...)")
            return None
        ttl = float(self.token_ttl)
        if response.ttl_remaining is not None:  # the service may grant less than asked
            ttl = min(ttl, response.ttl_remaining)
        self.tokens_fetched += 1
        self.token_problem = None
        self._hop_limit_reported = self._v1_reported = False
        self._logs.forget("token")
        return _Token(value=value, ttl=ttl, expires_at=self._clock() + ttl)

    def _no_token(self, why: str) -> None:
        self.token_problem = f"IMDS token request to {self.endpoint} {why}"
        self._logs.warning("token", "%s; retrying on the next request", self.token_problem)

    # -- transport --------------------------------------------------------------------------
    def _request(self, method: str, path: str, headers: dict[str, str]) -> _TtlAware:
        deadline = time.monotonic() + self.total_timeout
        conn_cls = http.client.HTTPSConnection if self._https else http.client.HTTPConnection
        conn = conn_cls(self._host, self._port, timeout=min(self.connect_timeout, self.total_timeout))
        where = f"{method} {self.endpoint}{path}"
        try:
            try:
                conn.connect()
            except ConnectionRefusedError as err:
                raise ImdsUnavailable("refused", f"IMDS {where}: connection refused") from err
            except TimeoutError as err:
                raise ImdsUnavailable(
                    "connect-timeout", f"IMDS {where}: no connection within {self.connect_timeout:g}s"
                ) from err
            except OSError as err:
                raise ImdsUnavailable("refused", f"IMDS {where}: cannot connect ({err})") from err
            assert conn.sock is not None
            try:
                timed = _DeadlineSocket(conn.sock, deadline, self.read_timeout)
                timed.arm()
                conn.request(method, path, headers=headers)
                raw = http.client.HTTPResponse(timed, method=method)  # type: ignore[arg-type]
                raw.begin()
                body = raw.read(MAX_BODY + 1)
            except TimeoutError as err:
                raise ImdsUnavailable(
                    "read-timeout",
                    f"IMDS {where}: no complete answer within {min(self.read_timeout, self.total_timeout):g}s "
                    f"(a read) or {self.total_timeout:g}s (the whole request)",
                ) from err
            except (http.client.HTTPException, OSError) as err:
                raise ImdsUnavailable(
                    "reset", f"IMDS {where}: connection dropped ({err.__class__.__name__}: {_one_line(err)})"
                ) from err
            except ValueError as err:  # a header value http.client will not send
                raise ImdsUnavailable("error", f"IMDS {where}: request not sent ({_one_line(err)})") from err
        finally:
            conn.close()
        if len(body) > MAX_BODY:
            raise ImdsUnavailable("too-large", f"IMDS {where}: answer larger than {MAX_BODY} bytes; not read")
        ttl = _parse_ttl(raw.getheader(TOKEN_TTL_HEADER))
        return _TtlAware(status=raw.status, text=body.decode("utf-8", errors="replace"), path=path, ttl_remaining=ttl)


class _DeadlineSocket:
    """The connected socket as ``http.client`` reads it, with each read's timeout cut to what is
    left of the request's total time, so no answer, however slowly it drips, outlives ``deadline``."""

    def __init__(self, sock: socket.socket, deadline: float, read_timeout: float) -> None:
        self._sock = sock
        self._deadline = deadline
        self._read_timeout = read_timeout

    def arm(self) -> None:
        left = self._deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("the request's total time ran out")
        self._sock.settimeout(min(self._read_timeout, left))

    def makefile(self, mode: str) -> io.BufferedReader:
        return io.BufferedReader(_DeadlineReader(self))

    def recv_into(self, buffer: memoryview) -> int:
        self.arm()
        return self._sock.recv_into(buffer)


class _DeadlineReader(io.RawIOBase):
    def __init__(self, timed: _DeadlineSocket) -> None:
        self._timed = timed

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: memoryview) -> int:  # type: ignore[override]
        return self._timed.recv_into(buffer)


def _one_line(err: BaseException) -> str:
    return " ".join(str(err).split())[:200] or type(err).__name__


@dataclasses.dataclass(frozen=True)
class _TtlAware(ImdsResponse):
    """A response that also carries the token TTL header, when the service sent one."""

    ttl_remaining: float | None = None


def _parse_ttl(value: str | None) -> float | None:
    if value is None:
        return None
    try:
        ttl = float(value)
    except ValueError:
        return None
    return ttl if ttl >= 0 else None
