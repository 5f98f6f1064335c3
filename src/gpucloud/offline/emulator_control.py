"""Client of the IMDS emulator's control API, for processes that did not start the emulator
(the demo, node agents in a fleet simulation, a user's shell through ``curl``)."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any

from gpucloud.offline.imds_emulator import CONTROL_PREFIX
from gpucloud.signals.imds import resolve_endpoint


class EmulatorControlError(RuntimeError):
    """The emulator refused a request (its one-line reason) or could not be reached."""


class EmulatorControl:
    def __init__(self, url: str | None = None, *, timeout: float = 5.0) -> None:
        """``url``: the emulator's endpoint (default: ``$AWS_EC2_METADATA_SERVICE_ENDPOINT``)."""
        self.url = resolve_endpoint(url)
        self.timeout = timeout

    # -- scenarios -------------------------------------------------------------------------------
    def spot_interruption(
        self,
        action: str = "terminate",
        *,
        lead_seconds: float = 120,
        after: float | None = None,
        at: float | None = None,
        with_rebalance: bool = False,
    ) -> dict[str, Any]:
        return self._post(
            "spot-interruption",
            action=action,
            lead_seconds=lead_seconds,
            after=after,
            at=at,
            with_rebalance=with_rebalance,
        )

    def rebalance(self, *, after: float | None = None, at: float | None = None) -> dict[str, Any]:
        return self._post("rebalance", after=after, at=at)

    def set_lifecycle_state(
        self, state: str = "Terminated", *, after: float | None = None, at: float | None = None
    ) -> dict[str, Any]:
        return self._post("lifecycle", state=state, after=after, at=at)

    def add_scheduled_event(
        self,
        code: str,
        *,
        not_before: float | None = None,
        not_before_in: float | None = None,
        state: str = "active",
        not_after: float | None = None,
        event_id: str | None = None,
    ) -> dict[str, Any]:
        return self._post(
            "scheduled-event",
            code=code,
            not_before=not_before,
            not_before_in=not_before_in,
            state=state,
            not_after=not_after,
            event_id=event_id,
        )

    def set_scheduled_event_state(self, event_id: str, state: str) -> dict[str, Any]:
        return self._post("scheduled-event-state", event_id=event_id, state=state)

    def stale_termination_time(self, seconds_ago: float = 600, *, with_instance_action: bool = False) -> dict[str, Any]:
        return self._post("stale-termination-time", seconds_ago=seconds_ago, with_instance_action=with_instance_action)

    def clear(self) -> dict[str, Any]:
        return self._post("clear")

    # -- faults ----------------------------------------------------------------------------------
    def fail_tokens(self, count: int) -> dict[str, Any]:
        return self._post("fault", kind="token", count=count)

    def fail_with(self, status: int, count: int) -> dict[str, Any]:
        return self._post("fault", kind="status", status=status, count=count)

    def hang(self, seconds: float, count: int = 1, *, target: str = "any") -> dict[str, Any]:
        return self._post("fault", kind="hang", seconds=seconds, count=count, target=target)

    def malformed(self, count: int) -> dict[str, Any]:
        return self._post("fault", kind="malformed", count=count)

    def refuse_connections(self, seconds: float) -> dict[str, Any]:
        """Refuse connections for ``seconds`` (the emulator reopens by itself: this client cannot)."""
        return self._post("fault", kind="refuse", seconds=seconds)

    def state(self) -> dict[str, Any]:
        return self._call("GET", "state", None)

    # -- transport -------------------------------------------------------------------------------
    def _post(self, name: str, **fields: Any) -> dict[str, Any]:
        return self._call("POST", name, {key: value for key, value in fields.items() if value is not None})

    def _call(self, method: str, name: str, body: dict[str, Any] | None) -> dict[str, Any]:
        url = f"{self.url}{CONTROL_PREFIX}{name}"
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(url, data=data, method=method, headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as response:
                return json.loads(response.read())
        except urllib.error.HTTPError as err:
            raise EmulatorControlError(_error_text(err)) from None
        except (urllib.error.URLError, OSError) as err:
            reason = getattr(err, "reason", err)
            raise EmulatorControlError(f"IMDS emulator at {self.url} is not reachable ({reason})") from None


def _error_text(err: urllib.error.HTTPError) -> str:
    try:
        return str(json.loads(err.read())["error"])
    except (ValueError, KeyError, TypeError):
        return f"IMDS emulator answered HTTP {err.code} to {err.url}"
