"""A gpucloud notice on a Ray node → a drain of that node with reason PREEMPTION and the notice's deadline.

Ray Train's preemption watcher polls Ray Core's draining nodes (``get_draining_nodes``) and hands
the deadline to the training function (``ray.train.get_preemption_info()``). Nothing in Ray reads
the EC2 notice, so on AWS that watcher never fires before the node is gone. ``NoticeDrainer`` runs
next to the raylet on each node: the ``SignalHub`` sources gpucloud already has (IMDS, SIGTERM,
``publish`` for queue-mode EventBridge events) feed it, and each stop or rebalance notice becomes
one ``DrainNode`` request (``GcsClient.drain_node``, the call ``ray drain-node`` makes).

    python -m gpucloud.integrations.ray.drain --address HEAD:6379 --node-id <this node's hex id>
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import math
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from gpucloud.signals.events import Notice
from gpucloud.signals.hub import SignalHub

log = logging.getLogger("gpucloud.integrations.ray")

# ray.core.generated.autoscaler_pb2.DrainNodeReason: PREEMPTION drains cannot be rejected by the
# raylet (IDLE_TERMINATION ones can), and a worker killed on such a node is reported as preempted.
PREEMPTION_REASON = "DRAIN_NODE_REASON_PREEMPTION"
_HEX_NODE_ID_LEN = 56  # a Ray NodeID is 28 bytes


@dataclasses.dataclass(frozen=True)
class DrainRequest:
    """One DrainNode call: the node, why, and by when it goes (epoch ms; 0 = no deadline, Ray's convention)."""

    node_id: str
    message: str
    deadline_ms: int


def drain_request(notice: Notice, node_id: str) -> DrainRequest | None:
    """The drain a notice asks for, or None when it asks for none.

    Stop notices (spot warning, ASG terminate, scheduled maintenance, SIGTERM) carry their own
    deadline, passed on as it is: never an assumed 120 s. A rebalance recommendation has no deadline
    (the instance is at elevated risk, not yet reclaimed): it drains with none, which Ray Train
    treats as its default window, so the run moves off the node at a checkpoint of its choosing."""
    if not notice.is_stop and notice.kind != "rebalance":
        return None
    deadline_ms = 0 if notice.deadline is None else max(1, math.floor(notice.deadline * 1000))
    action = f" ({notice.action})" if notice.action else ""
    return DrainRequest(node_id, f"gpucloud: {notice.kind}{action} from {notice.source}", deadline_ms)


def validate_node_id(node_id: str) -> str:
    """A Ray node id as ``drain_node`` takes it: 56 hex digits. Anything else is one clear line."""
    text = str(node_id).strip().lower()
    if len(text) != _HEX_NODE_ID_LEN or any(c not in "0123456789abcdef" for c in text):
        raise ValueError(
            f"Ray node id {str(node_id)[:80]!r} is not {_HEX_NODE_ID_LEN} hex digits "
            "(ray.get_runtime_context().get_node_id(), or NodeID in `ray list nodes`)"
        )
    return text


class GcsDrain:
    """Sends DrainRequests to the cluster's GCS (``ray._raylet.GcsClient.drain_node``)."""

    def __init__(self, gcs_address: str, *, timeout: float = 10.0) -> None:
        import ray._raylet
        from ray.core.generated import autoscaler_pb2

        self._client = ray._raylet.GcsClient(address=gcs_address)
        self._reason = autoscaler_pb2.DrainNodeReason.Value(PREEMPTION_REASON)
        self._timeout = timeout

    def __call__(self, request: DrainRequest) -> tuple[bool, str]:
        # The node id goes as hex: drain_node decodes it with FromHex, and a binary id becomes a
        # nil id that the GCS accepts without draining anything (ray/_private/node.py says so too).
        accepted, rejection = self._client.drain_node(
            request.node_id, self._reason, request.message, request.deadline_ms, timeout=self._timeout
        )
        return bool(accepted), str(rejection or "")

    def draining(self) -> dict[str, int]:
        """The cluster's draining nodes: hex node id → deadline in epoch ms (0 = none)."""
        return dict(self._client.get_draining_nodes(timeout=self._timeout))


class NoticeDrainer:
    """Drains one Ray node on its gpucloud notices: one drain per node, the first notice's deadline,
    tightened when a later notice is more urgent (Ray keeps the newest request's deadline)."""

    def __init__(
        self,
        node_id: str,
        drain: Callable[[DrainRequest], tuple[bool, str]],
        hub: SignalHub | None = None,
        *,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.node_id = validate_node_id(node_id)
        self.hub = hub or SignalHub(clock=clock)
        self._drain = drain
        self._clock = clock
        self.sent: list[DrainRequest] = []
        self.sent_at: list[float] = []  # clock time each accepted drain came back
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def publish(self, notice: Notice) -> bool:
        """A notice from another source (a queue-mode EventBridge event for this node's instance)."""
        return self.hub.publish(notice)

    def handle(self, notice: Notice) -> DrainRequest | None:
        """Drain for ``notice`` if it asks for it and is more urgent than the drain already sent."""
        request = drain_request(notice, self.node_id)
        if request is None:
            return None
        if self.sent and not _more_urgent(request, self.sent[-1]):
            log.info("%s: node %s already draining by an earlier notice", notice.kind, self.node_id[:12])
            return None
        try:
            accepted, rejection = self._drain(request)
        except Exception as exc:  # noqa: BLE001 - a failed RPC must not end the watch; the next notice retries
            log.error("drain of Ray node %s failed: %s", self.node_id[:12], " ".join(str(exc).split())[:300])
            return None
        if not accepted:
            log.error("Ray rejected the drain of node %s: %s", self.node_id[:12], rejection or "no reason given")
            return None
        self.sent.append(request)
        self.sent_at.append(self._clock())
        left = "no deadline" if not request.deadline_ms else f"{request.deadline_ms / 1000 - self._clock():.1f}s left"
        log.warning("%s: draining Ray node %s (reason PREEMPTION, %s)", notice.kind, self.node_id[:12], left)
        return request

    def start(self) -> NoticeDrainer:
        self.hub.start()
        self._thread = threading.Thread(target=self._run, name="gpucloud-ray-drain", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self.hub.stop()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def __enter__(self) -> NoticeDrainer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _run(self) -> None:
        while not self._stop.is_set():
            notice = self.hub.get(timeout=0.2)
            if notice is not None:
                self.handle(notice)


def _more_urgent(new: DrainRequest, old: DrainRequest) -> bool:
    if not new.deadline_ms:
        return False
    return not old.deadline_ms or new.deadline_ms < old.deadline_ms


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m gpucloud.integrations.ray.drain",
        description="Drain this Ray node (reason PREEMPTION, the notice's deadline) on a spot notice.",
    )
    parser.add_argument("--address", required=True, help="the cluster's GCS address, HOST:PORT")
    parser.add_argument("--node-id", required=True, help="this node's Ray node id (56 hex digits)")
    parser.add_argument("--imds-endpoint", default=None, help="default: $AWS_EC2_METADATA_SERVICE_ENDPOINT or IMDS")
    parser.add_argument("--interval", type=float, default=1.0, help="IMDS poll period in seconds (default 1)")
    parser.add_argument("--grace", type=float, default=30.0, help="SIGTERM → deadline now + GRACE s (default 30)")
    args = parser.parse_args(argv)
    try:
        node_id = validate_node_id(args.node_id)
        if not args.interval > 0 or not args.grace >= 0:
            raise ValueError(f"--interval must be > 0 and --grace >= 0, got {args.interval} and {args.grace}")
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    hub = SignalHub()
    hub.add_imds(args.imds_endpoint, interval=args.interval)
    hub.add_os_signals(args.grace)
    drainer = NoticeDrainer(node_id, GcsDrain(args.address), hub)
    hub.start()
    try:
        while True:
            notice: Any = hub.get(timeout=1.0)
            if notice is not None:
                drainer.handle(notice)
    except KeyboardInterrupt:
        return 0
    finally:
        hub.stop()


if __name__ == "__main__":
    raise SystemExit(main())
