"""Queue mode: every agent consumes the cluster's events queue, so a node whose agent died is still
handled.

Each agent watches its own IMDS; a spot warning or ASG termination for a node whose agent process
died (its torchrun ranks may still run as orphans, or be gone too) would otherwise reach nobody: its
gang peers would not save, the lifecycle action would wait out its heartbeat timeout, and the
attempt would end CRASHED when the peers' collective failed. EventBridge sends the same warnings to
the events queue; any agent's background consumer (``fleet.events_queue``, fleet level) hands each
one to ``FleetEventHandler``:

* ``decide`` (pure) looks at the noticed instance's node records and the jobs they hold:

  - its agent is alive (reported within the node lease, not stopped): it handles its own notice;
    the handler only makes sure the gang's stop is requested (idempotent) -- nothing else, and
    never the lifecycle action, which the agent completes after its commit;
  - its agent is dead, or it never had one: a stop notice on a running attempt requests the
    gang's stop through the job table (the surviving members save, orphaned ranks included), the
    record is marked stopped with the reason, a spot warning asks for the replacement at once
    (detach without decrement), and an ASG termination's lifecycle action is completed (CONTINUE)
    once the attempt ended or its deadline is near;
  - a rebalance recommendation asks for nothing (Capacity Rebalancing replaces the node);
  - a capacity block's expiration warning names a reservation: ``on_reservation`` finds its
    running instances (EC2 DescribeInstances, filter ``capacity-reservation-id``) and handles one
    stop notice per instance as above, so the gangs on them save and requeue before EC2 terminates
    them (10 minutes after the warning). No lifecycle action is completed for these: the instances
    are InService, and EC2, not the group, ends them. It backs up the group's wind-down, which the
    busy agents see themselves, earlier (``asg_hooks.wind_down_notice``).

* the handler carries it out and returns only when done, so the consumer deletes the message only
  then; a failure raises, and the message comes back after the visibility timeout. Every step is
  safe to repeat (duplicate deliveries, racing consumers on several agents): the table's
  conditional writes decide who applies a stop request, and completing an action that is already
  complete is a logged no-op.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import re
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from gpucloud.agent.asg_hooks import FleetHooks
from gpucloud.agent.events_queue import DEFAULT_VISIBILITY_TIMEOUT, EventsQueueConsumer, check_queue_url
from gpucloud.agent.loop import REPLACE_KINDS
from gpucloud.agent.table_notices import request_gang_stop
from gpucloud.errors import UserError
from gpucloud.lifecycle.model import Job, JobState, NodeRecord, NodeState
from gpucloud.queue.gang import GangQueue
from gpucloud.queue.protocol import UnknownJob
from gpucloud.signals.eventbridge import CAPACITY_BLOCK_ACTION, QueueRules, ReservationExpiring, instance_of
from gpucloud.signals.events import Notice
from gpucloud.signals.lifecycle_action import lifecycle_action_of

log = logging.getLogger("gpucloud.agent")

EVENTS_QUEUE_ENV = "GPUCLOUD_EVENTS_QUEUE_URL"  # node.env: the stack's eventsQueueUrl output
LIFECYCLE_TIMEOUT_ENV = "GPUCLOUD_LIFECYCLE_TIMEOUT"  # node.env: the drain hook's heartbeat timeout (s)
LIFECYCLE_MARGIN = 15.0  # s: complete the lifecycle action this long before its deadline at the latest
VISIBILITY_SLACK = 30.0  # s: a handler waits at most the visibility timeout minus this
_RESTART_AFTER_ERROR = 5.0  # s: the consumer loop failed unexpectedly; start it again after this


# -- the decision (pure) ----------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, order=True)
class GangAttempt:
    job_id: str
    attempt: int


@dataclasses.dataclass(frozen=True)
class FleetAction:
    """What to do about one notice from the events queue."""

    instance_id: str
    agent_alive: bool
    stop: tuple[GangAttempt, ...] = ()  # running attempts whose gang must stop (request_stop)
    mark_lost: tuple[str, ...] = ()  # node records to close as stopped
    replace: bool = False  # detach without decrement: the replacement boots now
    complete_lifecycle: bool = False  # CONTINUE once every ``stop`` attempt ended (or the deadline is near)
    reason: str = ""  # one line for the log


def agent_alive(record: NodeRecord, *, now: float, node_lease: float) -> bool:
    """An agent renews its record at least every quarter slot lease while it runs anything."""
    return record.state is not NodeState.STOPPED and now - record.updated_at <= node_lease


def decide(
    notice: Notice, records: Sequence[NodeRecord], jobs: Mapping[str, Job], *, now: float, node_lease: float
) -> FleetAction:
    """What to do about ``notice`` (from the events queue, about one instance), given every node
    record and the jobs those records hold (by id)."""
    instance = instance_of(notice)
    mine = [r for r in records if r.instance_id == instance]
    alive = [r for r in mine if agent_alive(r, now=now, node_lease=node_lease)]
    running = tuple(
        sorted(
            {
                GangAttempt(r.job_id, r.attempt)
                for r in mine
                if r.job_id is not None and r.attempt is not None and _running_at(jobs.get(r.job_id), r.attempt)
            }
        )
    )
    held = ", ".join(f"{t.job_id} attempt {t.attempt}" for t in running)
    if alive:
        who = f"agent {alive[0].id} on {instance} is alive"
        if not notice.is_stop:
            return FleetAction(instance, True, reason=f"{notice.kind} for {instance}: {who} and handles it itself")
        return FleetAction(
            instance,
            True,
            stop=running,
            reason=f"{notice.kind} for {instance}: {who} and handles it itself"
            + (f"; gang stop of {held} requested" if running else ""),
        )
    if not notice.is_stop:
        return FleetAction(
            instance,
            False,
            reason=f"{notice.kind} for {instance}: "
            + ("its agent is dead" if mine else "no agent of this fleet runs there")
            + "; nothing to do (Capacity Rebalancing replaces the node)",
        )
    # EC2 ends a capacity block's instances itself: no lifecycle action of the group to complete.
    group_action = notice.kind == "asg-terminate" and notice.action != CAPACITY_BLOCK_ACTION
    if not mine:
        if group_action:
            return FleetAction(
                instance,
                False,
                complete_lifecycle=True,
                reason=f"asg-terminate for {instance}: no agent ever reported from it, nothing to save; "
                "lifecycle action completed",
            )
        return FleetAction(
            instance, False, reason=f"{notice.kind} for {instance}: no agent of this fleet runs there; nothing to do"
        )
    newest = max(mine, key=lambda r: r.updated_at)
    silent = f"silent for {now - newest.updated_at:.0f}s" if newest.state is not NodeState.STOPPED else "stopped"
    replace = notice.kind in REPLACE_KINDS
    complete = group_action
    steps = [f"gang stop of {held} requested" if running else "it held no running attempt"]
    if replace:
        steps.append("replacement requested")
    if complete:
        steps.append("lifecycle action completed once the attempt ended" if running else "lifecycle action completed")
    return FleetAction(
        instance,
        False,
        stop=running,
        mark_lost=tuple(r.id for r in mine if r.state is not NodeState.STOPPED),
        replace=replace,
        complete_lifecycle=complete,
        reason=f"{notice.kind} for {instance}: its agent {newest.id} is dead ({silent}); " + "; ".join(steps),
    )


def _running_at(job: Job | None, attempt: int) -> bool:
    return job is not None and job.state is JobState.RUNNING and job.attempt == attempt


# -- carrying it out --------------------------------------------------------------------------


class AttemptStillRunning(RuntimeError):
    """The noticed node's attempt has not ended within the handler's wait; the message comes back
    after the visibility timeout and the wait continues then."""


class FleetEventHandler:
    """``on_notice`` of the fleet-level events-queue consumer (see the module doc).

    ``node_lease``: a record older than this is a dead agent (the agents' ``--slot-lease``).
    ``max_wait``: the longest the handler blocks for an attempt to end before the lifecycle action
    is completed; below the consumer's visibility timeout, so the message is not handed to a
    second consumer meanwhile.
    """

    def __init__(
        self,
        queue: GangQueue,
        hooks: FleetHooks,
        *,
        node_lease: float,
        max_wait: float,
        marked_by: str,
        lifecycle_margin: float = LIFECYCLE_MARGIN,
        poll_interval: float = 0.5,
        reservation_instances: Callable[[str], list[str]] | None = None,
        clock: Callable[[], float] = time.time,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        if node_lease <= 0 or max_wait < 0 or poll_interval <= 0:
            raise ValueError("node_lease and poll_interval must be more than 0 seconds, max_wait at least 0")
        self.queue, self.hooks = queue, hooks
        self.node_lease, self.max_wait, self.marked_by = node_lease, max_wait, marked_by
        self.lifecycle_margin, self.poll_interval = lifecycle_margin, poll_interval
        self._clock, self._sleep = clock, sleep
        self.reservation_instances = reservation_instances

    def on_reservation(self, expiring: ReservationExpiring) -> list[FleetAction]:
        """A capacity block is ending: every running instance in it gets its stop notice."""
        if self.reservation_instances is None:
            raise UserError(
                f"capacity block {expiring.reservation_id} is expiring, but this handler cannot list its instances"
            )
        instances = self.reservation_instances(expiring.reservation_id)
        log.warning(
            "events queue: capacity block %s ends; EC2 terminates its %d instance(s) from %s: stopping their work",
            expiring.reservation_id,
            len(instances),
            time.strftime("%H:%M:%SZ", time.gmtime(expiring.deadline)),
        )
        actions = [self(expiring.notice_for(instance)) for instance in instances]
        # Idle agents on those instances learn it from their group (this message reaches one agent).
        log.info(
            "events queue: %s", self.hooks.mark_block_ending(instances, expiring.reservation_id, expiring.deadline)
        )
        return actions

    def __call__(self, notice: Notice) -> FleetAction:
        instance = instance_of(notice)
        records = [r for r in self.queue.nodes() if r.instance_id == instance]
        jobs: dict[str, Job] = {}
        for job_id in {r.job_id for r in records if r.job_id is not None}:
            try:
                jobs[job_id] = self.queue.get(job_id)
            except UnknownJob:
                continue  # a record naming a job that is gone: nothing to stop there
        action = decide(notice, records, jobs, now=self._clock(), node_lease=self.node_lease)
        log.info("events queue: %s", action.reason)
        for target in action.stop:
            request_gang_stop(self.queue, target.job_id, target.attempt, notice, instance_id=instance)
        for record in records:
            if record.id in action.mark_lost:
                self._mark_lost(record, notice)
        if action.replace:
            try:
                outcome = self.hooks.noticed(instance_id=instance)
            except UserError as err:  # AsgError included: the gang's stop is what matters most
                outcome = f"replacement not requested: {err}"
            log.info("events queue: %s: %s", instance, outcome)
        if action.complete_lifecycle:
            self._wait_for_end(action.stop, notice)
            completed = self.hooks.committed(instance_id=instance, action=lifecycle_action_of(notice))
            log.info(
                "events queue: lifecycle action of %s %s",
                instance,
                "completed (CONTINUE)" if completed else "not completed (none active, or no Auto Scaling group)",
            )
        return action

    def _mark_lost(self, record: NodeRecord, notice: Notice) -> None:
        reason = (
            f"agent found dead at a {notice.kind} notice from the events queue "
            f"(last report {self._clock() - record.updated_at:.0f}s before; closed by {self.marked_by})"
        )
        # updated_at stays the agent's own last report: `gpucloud nodes` shows when it went silent.
        self.queue.register_node(record.model_copy(update={"state": NodeState.STOPPED, "reason": reason}))

    def _wait_for_end(self, targets: tuple[GangAttempt, ...], notice: Notice) -> None:
        """Return once every target attempt ended (committed and requeued, or otherwise), or the
        notice's deadline is near; raise ``AttemptStillRunning`` after ``max_wait``."""
        started = self._clock()
        while True:
            pending = [t for t in targets if _running_at(self.queue.get(t.job_id), t.attempt)]
            if not pending:
                return
            now = self._clock()
            if notice.deadline is not None and now >= notice.deadline - self.lifecycle_margin:
                log.warning(
                    "events queue: the deadline of %s is %.0fs away and %s attempt %d still runs; "
                    "completing the lifecycle action now",
                    instance_of(notice),
                    notice.deadline - now,
                    pending[0].job_id,
                    pending[0].attempt,
                )
                return
            if now - started >= self.max_wait:
                raise AttemptStillRunning(
                    f"{pending[0].job_id} attempt {pending[0].attempt} still runs after {self.max_wait:.0f}s; "
                    f"the lifecycle action of {instance_of(notice)} is completed when the message comes back"
                )
            self._sleep(self.poll_interval)


# -- the background consumer ------------------------------------------------------------------


class FleetEventsWatcher:
    """Runs an ``EventsQueueConsumer`` in a daemon thread while the agent runs."""

    def __init__(self, consumer: EventsQueueConsumer) -> None:
        self.consumer = consumer
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="events-queue", daemon=True)

    def start(self) -> FleetEventsWatcher:
        self._thread.start()
        return self

    def stop(self, timeout: float = 2.0) -> None:
        """Stop polling; a long poll or a handler in progress is not waited for past ``timeout``
        (its message comes back after the visibility timeout for another agent)."""
        self._stop.set()
        self._thread.join(timeout)

    def is_running(self) -> bool:
        return self._thread.is_alive()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.consumer.run(self._stop)
            except Exception as err:  # noqa: BLE001 - the fleet's safety net must outlive one bad poll
                log.error(
                    "events queue consumer failed (%s); restarting in %.0fs",
                    " ".join(str(err).split()) or type(err).__name__,
                    _RESTART_AFTER_ERROR,
                )
                self._stop.wait(_RESTART_AFTER_ERROR)


_SQS_HOST = re.compile(
    r"^https?://(?:sqs\.([a-z0-9-]+)\.amazonaws\.com(?:\.cn)?|([a-z0-9-]+)\.queue\.amazonaws\.com(?:\.cn)?)/"
)


def queue_region(queue_url: str, env: Mapping[str, str] | None = None) -> str:
    """The region of an SQS queue URL (``https://sqs.<region>.amazonaws.com/...``); for other URLs
    (a local emulator) the node's ``GPUCLOUD_REGION``, ``AWS_REGION`` or ``AWS_DEFAULT_REGION``."""
    env = os.environ if env is None else env
    match = _SQS_HOST.match(check_queue_url(queue_url))
    if match:
        return match.group(1) or match.group(2)
    for name in ("GPUCLOUD_REGION", "AWS_REGION", "AWS_DEFAULT_REGION"):
        if env.get(name):
            return env[name]
    raise UserError(
        f"cannot tell the region of events queue {queue_url!r}; set GPUCLOUD_REGION "
        "(or give the queue's https://sqs.<region>.amazonaws.com/... URL)"
    )


def lifecycle_timeout(env: Mapping[str, str] | None = None) -> float:
    """The drain hook's heartbeat timeout from the node env (default: QueueRules' 600 s)."""
    env = os.environ if env is None else env
    raw = env.get(LIFECYCLE_TIMEOUT_ENV)
    if not raw:
        return QueueRules().lifecycle_timeout
    try:
        value = float(raw)
    except ValueError:
        raise UserError(f"{LIFECYCLE_TIMEOUT_ENV}={raw!r} is not a number of seconds (30 to 7200)") from None
    QueueRules(lifecycle_timeout=value)  # the range check, with its own one-line error
    return value


def ec2_reservation_instances(ec2_client: Any) -> Callable[[str], list[str]]:
    """The pending or running instances launched into a capacity reservation (DescribeInstances,
    filter ``capacity-reservation-id``; needs ``ec2:DescribeInstances`` on the node role).
    https://docs.aws.amazon.com/AWSEC2/latest/APIReference/API_DescribeInstances.html"""

    def instances(reservation_id: str) -> list[str]:
        found: list[str] = []
        pages = ec2_client.get_paginator("describe_instances").paginate(
            Filters=[
                {"Name": "capacity-reservation-id", "Values": [reservation_id]},
                {"Name": "instance-state-name", "Values": ["pending", "running"]},
            ]
        )
        for page in pages:
            for reservation in page.get("Reservations", []):
                found.extend(i["InstanceId"] for i in reservation.get("Instances", []))
        return sorted(set(found))

    return instances


def watch_events_queue(
    queue_url: str,
    queue: GangQueue,
    hooks: FleetHooks,
    *,
    node_lease: float,
    worker: str,
    wait_seconds: int = 20,
    visibility_timeout: int = DEFAULT_VISIBILITY_TIMEOUT,
    sqs_client: Any = None,
    ec2_client: Any = None,
) -> FleetEventsWatcher:
    """Start consuming ``queue_url`` (fleet level: every instance's notices) in the background."""
    if visibility_timeout <= VISIBILITY_SLACK:
        raise UserError(
            f"events queue visibility timeout {visibility_timeout}s must exceed {VISIBILITY_SLACK:.0f}s "
            "(a handler waits for the attempt to end within it)"
        )
    if sqs_client is None or ec2_client is None:
        import boto3

        session = boto3.session.Session(region_name=queue_region(queue_url))
        sqs_client = sqs_client or session.client("sqs")
        ec2_client = ec2_client or session.client("ec2")
    handler = FleetEventHandler(
        queue,
        hooks,
        node_lease=node_lease,
        max_wait=visibility_timeout - VISIBILITY_SLACK,
        marked_by=worker,
        reservation_instances=ec2_reservation_instances(ec2_client),
    )
    consumer = EventsQueueConsumer(
        sqs_client,
        queue_url,
        on_notice=handler,
        on_reservation=handler.on_reservation,
        instance_ids=None,
        wait_seconds=wait_seconds,
        visibility_timeout=visibility_timeout,
        rules=QueueRules(lifecycle_timeout=lifecycle_timeout()),
    )
    log.info("events queue %s: consuming (fleet level)", queue_url)
    return FleetEventsWatcher(consumer).start()
