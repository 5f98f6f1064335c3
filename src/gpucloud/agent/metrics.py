"""The agent's own exporter: ``/metrics`` for Prometheus, one per node (docs/monitoring.md).

What it knows comes from two places, never from a collective:

* the agent itself: its state, the notices it received, the attempt it runs, how each attempt
  ended (requeues, steps lost), and the attempt's timeline events (notice -> commit);
* the training session, through the attempt's control directory: the ``progress`` file carries the
  step and the session's cumulative step, save and stall histograms (``gpucloud.training_metrics``).
  The exporter reads it when scraped and once more when the attempt ends, and adds what changed to
  the node's totals, so the histograms and counters only ever grow while the agent runs.

Every series carries ``instance_id`` and ``node_group``: on a cluster they equal the labels EC2
service discovery's relabelling puts on every target of the node (so a rule joins the agent's
series with dcgm-exporter's and node_exporter's on ``instance_id`` either way; a clash only renames
the scraped copy to ``exported_instance_id``, see
https://prometheus.io/docs/prometheus/latest/configuration/configuration/#scrape_config
``honor_labels``); offline there is no discovery, and the agent's own worker id stands in.

The metrics are rendered by one custom collector on a registry of our own (not the process-wide
default one), so a scrape sees one consistent state:
https://prometheus.github.io/client_python/collector/custom/
"""

from __future__ import annotations

import dataclasses
import logging
import math
import threading
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, get_args

from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

from gpucloud import control
from gpucloud.agent.efa_metrics import EfaCollector
from gpucloud.errors import UserError
from gpucloud.lifecycle.model import JobState, NodeState, steps_lost
from gpucloud.signals.events import STOP_KINDS, Notice, NoticeKind
from gpucloud.training_metrics import SAVE_KINDS, Histogram, Snapshot

if TYPE_CHECKING:
    from gpucloud.agent.identity import NodeIdentity, NodeLabels
    from gpucloud.jobs.runner import AttemptResult

log = logging.getLogger("gpucloud.agent.metrics")

# Not 9400 (dcgm-exporter) nor 9100 (node_exporter), which run beside the agent on every node, nor
# 9464 (OpenTelemetry's Prometheus exporter, OTEL_EXPORTER_PROMETHEUS_PORT, which a training script
# may open on the same node). 9401: next to dcgm-exporter, so the monitor's ingress is one range.
DEFAULT_PORT = 9401
OFFLINE_ADDRESS = "127.0.0.1"  # a laptop does not publish an unauthenticated endpoint on its LAN
# Every interface, as node_exporter and dcgm-exporter: the node's security group admits the monitor
# only, and managed mode's collector on the node itself scrapes 127.0.0.1.
CLUSTER_ADDRESS = "0.0.0.0"
NOTICE_TO_COMMIT_BUCKETS = (1.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 45.0, 60.0, 90.0, 120.0, 180.0, 300.0)
NOTICE_KINDS: tuple[str, ...] = get_args(NoticeKind)
# After a notice stopped the agent, /metrics stays up this long (``--metrics-linger``): two scrapes at
# the monitor's 15 s interval (cluster/monitoring_plan.py), so Prometheus sees the notice, the emergency
# save and notice-to-commit, which all happen in the ~2 s before the agent would otherwise exit.
DEFAULT_LINGER_SECONDS = 30.0
_SEEN_NOTICES = 1024  # event ids remembered for deduplication (a hub already deduplicates; this is cheap)


def linger_seconds(requested: float, notice: Notice | None, now: float) -> float:
    """How long /metrics outlives the agent's work: ``requested`` after a stop notice, never past the
    notice's deadline (the node may be gone then). None after an idle exit or ``--exit-after-attempts``
    (nothing happened that a scrape must see), nor after SIGTERM/SIGINT (the operator, or systemd
    stopping the service, wants the process gone)."""
    if notice is None or notice.kind == "sigterm" or requested <= 0:
        return 0.0
    left = notice.seconds_left(now)
    return max(0.0, requested if left is None else min(requested, left))


def default_address(identity: NodeIdentity) -> str:
    """Where /metrics listens unless ``--metrics-address`` says: every interface on an EC2 instance
    (Prometheus on the monitor reaches it over the VPC), loopback off EC2."""
    return CLUSTER_ADDRESS if identity.instance_id else OFFLINE_ADDRESS


@dataclasses.dataclass
class _Attempt:
    job_id: str
    attempt: int
    control_dir: Path
    last: Snapshot | None = None  # the session's payload at the previous read
    step: int | None = None
    progress_at: float | None = None  # ``written_at`` of the progress file last read
    notice_at: float | None = None  # the first stop notice of this attempt (epoch seconds)
    committed: bool = False


class NodeMetrics:
    """The node's metrics state. Thread-safe: the agent's loop, its slot keeper and the HTTP
    server's threads all touch it."""

    def __init__(self, labels: NodeLabels) -> None:
        self.labels = labels
        self._lock = threading.Lock()
        self._state = NodeState.IDLE
        self._notices = dict.fromkeys(NOTICE_KINDS, 0)  # every kind from 0: increase() sees the first one
        self._seen: dict[str, None] = {}  # event ids, oldest first
        self._totals = Snapshot()
        self._notice_to_commit = Histogram(NOTICE_TO_COMMIT_BUCKETS)
        self._steps_lost = 0
        self._requeues = 0
        self._attempt: _Attempt | None = None

    # -- what the agent tells it --------------------------------------------------------------

    def set_state(self, state: NodeState) -> None:
        with self._lock:
            self._state = state

    def noticed(self, notice: Notice) -> None:
        """A notice this node received (any kind, once per event id)."""
        with self._lock:
            if notice.event_id in self._seen:
                return
            self._seen[notice.event_id] = None
            if len(self._seen) > _SEEN_NOTICES:
                del self._seen[next(iter(self._seen))]
            self._notices[notice.kind] = self._notices.get(notice.kind, 0) + 1

    def attempt_started(self, job_id: str, attempt: int, control_dir: Path) -> None:
        with self._lock:
            self._attempt = _Attempt(job_id, attempt, Path(control_dir))

    def timeline(self, kind: str, payload: dict[str, Any]) -> None:
        """An event of the running attempt's timeline (the supervisor's ``on_event``)."""
        at = payload.get("at")
        if isinstance(at, bool) or not isinstance(at, (int, float)) or not math.isfinite(at):
            return
        with self._lock:
            current = self._attempt
            if current is None:
                return
            if kind == "notice" and payload.get("kind") in STOP_KINDS:
                current.notice_at = at if current.notice_at is None else min(current.notice_at, at)
            elif kind == "commit" and current.notice_at is not None and not current.committed:
                current.committed = True
                self._notice_to_commit.observe(max(0.0, at - current.notice_at))

    def attempt_ended(self, result: AttemptResult | None) -> None:
        """The attempt is over (``result`` None: it never reached an end of its own). Its last
        progress is read, its series go away; a requeue this node recorded counts, with its steps lost."""
        with self._lock:
            current = self._attempt
            if current is not None:
                self._read(current)
            self._attempt = None
            if result is None or not result.transition.applied:
                return  # another member recorded the end: counted once per attempt, there
            if result.transition.job.state is JobState.QUEUED:
                self._requeues += 1
                self._steps_lost += steps_lost(result.end.last_step, result.end.resume_from) or 0

    # -- the session's numbers ----------------------------------------------------------------

    def _read(self, current: _Attempt) -> None:
        """Add what the session observed since the last read (lock held)."""
        progress = control.read(current.control_dir, control.PROGRESS)
        if current.step is None and progress is None:
            resumed = control.read(current.control_dir, control.RESUMED)
            current.step = _int(resumed.get("step")) if resumed else None
        if progress is None or progress.get("written_at") == current.progress_at:
            return
        current.progress_at = progress.get("written_at")
        step = _int(progress.get("step"))
        if step is not None:
            current.step = step
        snapshot = Snapshot.from_json(progress.get("metrics"))
        if snapshot is not None:
            self._totals.add(snapshot.since(current.last))
            current.last = snapshot

    # -- the exposition -----------------------------------------------------------------------

    def families(self) -> list[Metric]:
        with self._lock:
            if self._attempt is not None:
                self._read(self._attempt)
            return list(self._families())

    def _families(self) -> Iterator[Metric]:
        node = self.labels
        names, values = ["instance_id", "node_group"], [node.instance_id, node.node_group]

        info = GaugeMetricFamily(
            "gpucloud_node_info",
            "This node: always 1; its labels name the instance, its group, type and life cycle, and the agent.",
            labels=[*names, "instance_type", "lifecycle", "worker"],
        )
        info.add_metric([*values, node.instance_type, node.lifecycle, node.worker], 1)
        yield info

        state = GaugeMetricFamily(
            "gpucloud_agent_state", "1 for the agent's current state, 0 for the others.", labels=[*names, "state"]
        )
        for each in NodeState:
            state.add_metric([*values, each.value], 1 if each is self._state else 0)
        yield state

        running = GaugeMetricFamily(
            "gpucloud_attempt_running",
            "1 while this node runs the attempt; the series goes away when the attempt ends.",
            labels=["job_id", "attempt", "node_group", "instance_id"],
        )
        step = GaugeMetricFamily(
            "gpucloud_training_step",
            "The last step the running attempt completed (its progress file; the resumed step before).",
            labels=["job_id", *names],
        )
        current = self._attempt
        if current is not None:
            running.add_metric([current.job_id, str(current.attempt), node.node_group, node.instance_id], 1)
            if current.step is not None:
                step.add_metric([current.job_id, *values], current.step)
        yield running
        yield step

        totals = self._totals
        yield _histogram(
            "gpucloud_step_seconds", "Seconds per training step (the node's local rank 0).", names, values, totals.steps
        )
        saves = HistogramMetricFamily(
            "gpucloud_checkpoint_save_seconds",
            "Seconds from a save's start to its durable commit; kind: emergency (a notice's) or periodic.",
            labels=[*names, "kind"],
        )
        for kind in SAVE_KINDS:
            hist = totals.saves[kind]
            saves.add_metric([*values, kind], buckets=hist.cumulative(), sum_value=hist.sum)
        yield saves
        size = GaugeMetricFamily(
            "gpucloud_checkpoint_bytes", "Size of the last committed checkpoint (every rank's files).", labels=names
        )
        if totals.last_bytes is not None:
            size.add_metric(values, totals.last_bytes)
        yield size
        yield _histogram(
            "gpucloud_checkpoint_stall_seconds",
            "Seconds the training loop was blocked by one save (rate of the _sum: the share of time stalled).",
            names,
            values,
            totals.stalls,
        )
        yield _counter("gpucloud_checkpoint_failures", "Saves that failed to commit.", names, values, totals.failures)
        notices = CounterMetricFamily(
            "gpucloud_notices", "Interruption notices this node received, by kind.", labels=[*names, "kind"]
        )
        for kind, count in self._notices.items():
            notices.add_metric([*values, kind], count)
        yield notices
        yield _histogram(
            "gpucloud_notice_to_commit_seconds",
            "Seconds from a stop notice to the commit of the emergency checkpoint.",
            names,
            values,
            self._notice_to_commit,
        )
        yield _counter(
            "gpucloud_steps_lost",
            "Steps the next attempt recomputes: last completed - resumed-from, per requeue this node recorded.",
            names,
            values,
            self._steps_lost,
        )
        yield _counter(
            "gpucloud_requeues",
            "Attempts this node requeued (notice, crash or lost member).",
            names,
            values,
            self._requeues,
        )


def _histogram(name: str, doc: str, names: list[str], values: list[str], hist: Histogram) -> HistogramMetricFamily:
    family = HistogramMetricFamily(name, doc, labels=names)
    family.add_metric(values, buckets=hist.cumulative(), sum_value=hist.sum)
    return family


def _counter(name: str, doc: str, names: list[str], values: list[str], value: float) -> CounterMetricFamily:
    family = CounterMetricFamily(name, doc, labels=names)
    family.add_metric(values, value)
    return family


def _int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


class _Collector(Collector):
    def __init__(self, node: NodeMetrics) -> None:
        self.node = node

    def collect(self) -> Iterable[Metric]:
        return self.node.families()


def registry_for(node: NodeMetrics, *, sysfs: Path | None = None) -> CollectorRegistry:
    """A registry of our own with the node's collector and, given ``sysfs`` (the root node_exporter's
    ``--path.sysfs`` would get), the EFA devices' counters (``efa_metrics``). Not the default registry,
    which would add this process's python_* and process_* series, which node_exporter covers for the
    whole node."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Collector(node))
    if sysfs is not None:
        registry.register(EfaCollector(node.labels, sysfs))
    return registry


class MetricsServer:
    """``/metrics`` over HTTP in a daemon thread (prometheus_client's WSGI server)."""

    def __init__(self, node: NodeMetrics, *, address: str, port: int, sysfs: Path | None = None) -> None:
        try:
            registry = registry_for(node, sysfs=sysfs)
            self._server, self._thread = start_http_server(port, addr=address, registry=registry)
        except OSError as err:
            reason = err.strerror or str(err)
            raise UserError(
                f"cannot serve /metrics on {address}:{port}: {reason}; pass --metrics-port PORT "
                "(0: any free port), --metrics-address ADDRESS, or --no-metrics"
            ) from None
        self.address = address
        self.port = int(self._server.server_port)

    @property
    def url(self) -> str:
        host = f"[{self.address}]" if ":" in self.address else self.address
        return f"http://{host}:{self.port}/metrics"

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)


def serve(
    node: NodeMetrics,
    *,
    address: str,
    port: int | None,
    default_port: int = DEFAULT_PORT,
    sysfs: Path | None = None,
) -> tuple[MetricsServer | None, str | None]:
    """The server, or (None, why) when the *default* port cannot be bound: the agent then runs on
    without /metrics (several agents on one host, each a "node" of a local fleet; Prometheus then
    reports the target down). A port asked for (``port`` not None) that cannot be bound is the
    UserError: the operator chose it and must choose again."""
    if port is not None:
        return MetricsServer(node, address=address, port=port, sysfs=sysfs), None
    try:
        return MetricsServer(node, address=address, port=default_port, sysfs=sysfs), None
    except UserError as err:
        return None, f"{err}; the agent runs without /metrics"
