"""The node-side wiring shared by ``spot-train``, ``worker`` and ``demo``: the notice source and the
live progress lines printed while a job runs."""

from __future__ import annotations

import time
from typing import Any

from gpucloud.signals.hub import SignalHub
from gpucloud.signals.imds import resolve_endpoint


def start_signal_hub(*, imds_endpoint: str | None, use_imds: bool, poll_interval: float, grace: float) -> SignalHub:
    """A started hub watching IMDS (unless ``use_imds`` is False) and SIGTERM/SIGINT to this process."""
    hub = SignalHub()
    if use_imds:
        hub.add_imds(resolve_endpoint(imds_endpoint), interval=poll_interval)
    hub.add_os_signals(grace)
    hub.start()
    return hub


def describe_event(kind: str, data: dict[str, Any]) -> str | None:
    """One human line for a timeline event as it happens (None: not worth a line)."""
    attempt = data.get("attempt")
    at = time.strftime("%H:%M:%S", time.localtime(data.get("at") or time.time()))
    step = data.get("step")
    text = {
        "claimed": f"attempt {attempt} claimed by {data.get('worker')}",
        "started": f"attempt {attempt} started (pid {data.get('pid')})",
        "resume": f"attempt {attempt} resumed from step {step}"
        if step is not None
        else f"attempt {attempt} started fresh",
        "notice": f"{data.get('kind')} notice from {data.get('source')}"
        + (
            f", deadline in {data['deadline'] - data['at']:.0f}s"
            if isinstance(data.get("deadline"), (int, float))
            else ""
        ),
        "flag": "stop flag written; waiting for every rank to agree on a step",
        "save": "early checkpoint requested (rebalance recommendation)",
        "ack": f"all ranks stop after step {step}",
        "commit": f"checkpoint of step {step} committed",
        "stop": f"sent {data.get('signal')} to the process group: {data.get('reason')}",
        "requeue": f"job requeued as attempt {int(attempt or 0) + 1}"
        + (f" ({data['reason']})" if data.get("reason") else ""),
        "finish": "job finished",
        "failed": f"job failed: {data.get('reason')}",
    }.get(kind)
    return None if text is None else f"[{at}] {text}"
