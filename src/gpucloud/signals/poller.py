"""The IMDS monitor: poll the interruption items every ``interval`` and turn them into Notices.

One round reads ``spot/instance-action`` first (the most urgent), ``spot/termination-time`` only
when the instance-action item is absent or failed (it is the legacy view of the same notice),
then the rebalance recommendation, the ASG target lifecycle state and the scheduled events. Each
item is read and interpreted on its own: an item answering an error, a malformed body, a body
that breaks the interpreter (any exception), a drip-fed answer (each request has a total time
limit) or an oversized one costs that item only, and the round goes on to the next. Only when the
service itself is down (connection refused, connect timeout, the token PUT timing out with IMDSv1
refused, or no request of the previous round answered) does the round end at once, so a dead or
hung service costs a round one timeout, not one per item.
Notices are handed to ``on_notice`` as soon as their item is read, not at the end of the round.

Nothing but a well-formed, current payload makes a notice: 404, 5xx, 401 after the retry,
timeouts, refused connections and malformed bodies are counted and logged -- one line per item
when its problem starts or changes, and at most one a minute per item while it keeps changing
(``RateLimitedLog``) -- and the round goes on. A notice is reported once: the poller keeps the
``event_id`` of everything it has reported.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Callable

from gpucloud.signals import interpret
from gpucloud.signals.events import Notice
from gpucloud.signals.imds import ImdsClient, ImdsUnavailable
from gpucloud.signals.interpret import InterpretRules, MalformedPayload
from gpucloud.signals.ratelimit import RateLimitedLog

log = logging.getLogger("gpucloud.signals")


@dataclasses.dataclass
class PollerHealth:
    """What the poller has seen so far (for logs, ``doctor`` and tests)."""

    rounds: int = 0
    requests: int = 0
    failed_requests: int = 0  # no answer, or an answer other than 200/404
    malformed: int = 0  # 200 with a body that is not the documented format
    stale_ignored: int = 0  # spot and rebalance notices whose time is past the stale limit (interpret.is_stale)
    notices: int = 0
    last_error: str | None = None
    last_ok_at: float | None = None  # clock time of the last round in which every item answered


class _Unreachable(Exception):
    """The service is down (refused, connect or token timeout): end this round early."""


class ImdsPoller:
    def __init__(
        self,
        client: ImdsClient,
        *,
        interval: float = 1.0,
        on_notice: Callable[[Notice], None],
        clock: Callable[[], float] = time.time,
        rules: InterpretRules = InterpretRules(),
    ) -> None:
        if interval <= 0:
            raise ValueError(f"poll interval must be positive seconds, got {interval}")
        self.client = client
        self.interval = float(interval)
        self.on_notice = on_notice
        self.rules = rules
        self._clock = clock
        self._seen: set[str] = set()
        self._logged: dict[str, str] = {}  # item -> its problem already logged, so an outage is one line
        self._logs = RateLimitedLog(log)  # and a problem that changes every round, one line a minute
        self._stale_logged: set[str] = set()
        # Every request of the last round timed out (the whole service hangs, not one item): this
        # round then ends at its first timeout, so a hung service costs a round one timeout, not
        # one per item; any answer ends that mode at once.
        self._service_hung = False
        self._answered = self._timed_out = False
        self._round_lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.health = PollerHealth()

    # -- one round -----------------------------------------------------------------------------
    def poll_once(self) -> list[Notice]:
        """Read every item once; report (``on_notice``) and return the notices not seen before."""
        with self._round_lock:  # a manual round and the thread's never interleave
            return self._round()

    def _round(self) -> list[Notice]:
        now = self._clock()
        problems: dict[str, str] = {}  # item path -> what went wrong with it this round
        self._answered = self._timed_out = False
        fresh: list[Notice] = []
        rules = self.rules

        def item(path: str, build: Callable[[str], Notice | list[Notice] | None]) -> bool:
            """Read and interpret one item, report its new notices at once; True if it was usable."""
            text = self._read(path, problems)
            if text is None:
                return False
            notices = self._interpret(path, problems, lambda: build(text))
            fresh.extend(self._report(notices or [], now))
            return notices is not None

        try:
            if not item(interpret.INSTANCE_ACTION, lambda text: interpret.instance_action_notice(text, now, rules)):
                # Absent, failed or malformed: the legacy item may still carry the notice.
                item(interpret.TERMINATION_TIME, lambda text: interpret.termination_time_notice(text, now, rules))
            item(interpret.REBALANCE, lambda text: interpret.rebalance_notice(text, now, rules))
            item(interpret.TARGET_LIFECYCLE_STATE, lambda text: interpret.lifecycle_notice(text, now, rules))
            item(interpret.SCHEDULED_EVENTS, lambda text: self._scheduled(text, now, problems))

        except _Unreachable:
            pass  # the service did not answer at all: the rest of the round would only wait too
        self._service_hung = self._timed_out and not self._answered
        self.health.rounds += 1
        self._log_problems(problems, now)
        return fresh

    def _report(self, notices: list[Notice], now: float) -> list[Notice]:
        """Hand new notices to ``on_notice`` right away (not at the end of the round: a later item
        may take a whole timeout to fail)."""
        fresh = [notice for notice in notices if notice.event_id not in self._seen]
        for notice in fresh:
            self._seen.add(notice.event_id)
            self.health.notices += 1
            log.warning(
                "interruption notice from IMDS: %s %s, deadline %s (event %s)",
                notice.kind,
                notice.action,
                _when(notice.deadline, now),
                notice.event_id,
            )
            try:
                self.on_notice(notice)
            except Exception:  # the consumer's bug must not stop the watcher
                log.exception("on_notice handler failed for %s", notice.event_id)
        return fresh

    def _read(self, path: str, problems: dict[str, str]) -> str | None:
        """The 200 body; None when the item is absent (404) or answered an error this round."""
        self.health.requests += 1
        try:
            response = self.client.get(path)
        except ImdsUnavailable as err:
            if err.reason in ImdsUnavailable.SERVICE_DOWN:
                self._failed(problems, "service", str(err))
                raise _Unreachable from err
            self._failed(problems, path, f"{err}; no notice assumed")  # this item only: read the next
            self._timed_out = True
            if self._service_hung and not self._answered:
                raise _Unreachable from err
            return None
        self._answered = True
        if response.ok:
            return response.text
        if not response.absent:
            self._failed(problems, path, f"IMDS {path} answered HTTP {response.status}; no notice assumed")
        return None

    def _failed(self, problems: dict[str, str], key: str, message: str) -> None:
        self.health.failed_requests += 1
        self.health.last_error = message
        problems[key] = message

    def _interpret(
        self, path: str, problems: dict[str, str], build: Callable[[], Notice | list[Notice] | None]
    ) -> list[Notice] | None:
        """The notices in a 200 body; None when the body is malformed or cannot be interpreted."""
        try:
            result = build()
        except MalformedPayload as err:
            self.health.malformed += 1
            problems[path] = f"IMDS answer malformed: {err}; no notice assumed"
            return None
        except Exception as err:  # noqa: BLE001 - whatever breaks on one item must not end the round
            self.health.malformed += 1
            detail = " ".join(str(err).split())[:200]
            problems[path] = (
                f"IMDS {path} answer cannot be interpreted ({type(err).__name__}: {detail}); no notice assumed"
            )
            return None
        if isinstance(result, list):
            return result
        if result is None:
            if path in (interpret.INSTANCE_ACTION, interpret.TERMINATION_TIME, interpret.REBALANCE):
                self.health.stale_ignored += 1
                if path not in self._stale_logged:
                    self._stale_logged.add(path)
                    log.info(
                        "ignoring a stale notice at %s: its time is more than %gs past",
                        path,
                        self.rules.stale_after,
                    )
            return []
        return [result]

    def _scheduled(self, text: str, now: float, problems: dict[str, str]) -> list[Notice]:
        notices, bad = interpret.scheduled_notices(text, now)
        if bad:
            self.health.malformed += 1
            problems[interpret.SCHEDULED_EVENTS] = f"{interpret.SCHEDULED_EVENTS}: " + "; ".join(bad)
        return notices

    def _log_problems(self, problems: dict[str, str], now: float) -> None:
        """One line per item whose problem is new or changed; an item whose message changes every
        round (a counter, a time in it) still writes at most one line a minute."""
        if not problems:
            if self._logged:
                log.info("IMDS answers normally again (%s)", self.client.endpoint)
                for key in self._logged:
                    self._logs.forget(key)
                self._logged.clear()
            self.health.last_ok_at = now
            return
        for key, message in problems.items():
            if self._logged.get(key) != message:
                self._logs.warning(key, "%s", message)
        for key in self._logged.keys() - problems.keys():
            self._logs.forget(key)
        self._logged = dict(problems)

    # -- background thread ---------------------------------------------------------------------
    def start(self) -> None:
        """Poll in a daemon thread until ``stop``; the first round runs at once."""
        if self._thread is not None:
            raise RuntimeError("ImdsPoller already started")
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="gpucloud-imds-poller", daemon=True)
        self._thread.start()

    def stop(self, timeout: float | None = None) -> None:
        self._stop.set()
        thread, self._thread = self._thread, None
        if thread is not None and thread is not threading.current_thread():
            # A round in flight ends within the client's timeouts; do not wait longer than that.
            thread.join(
                timeout if timeout is not None else self.client.connect_timeout + self.client.read_timeout + 1.0
            )

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def _run(self) -> None:
        while not self._stop.is_set():
            started = time.monotonic()
            try:
                self.poll_once()
            except Exception:
                log.exception("IMDS poll round failed unexpectedly; polling continues")
            self._stop.wait(max(0.0, self.interval - (time.monotonic() - started)))


def _when(deadline: float | None, now: float) -> str:
    if deadline is None:
        return "none (checkpoint early, keep running)"
    return f"in {deadline - now:+.1f}s"
