"""The agent loop: claim a slot, wait for the gang, run the attempt under the supervisor, repeat.

One agent per node. Every decision about slots and gangs is ``jobs.gang``'s; every decision about
an attempt is the supervisor's (``jobs.runner.run_attempt``, the same code ``spot-train`` runs).
This module only sequences them and keeps the node's record in the queue current:

* idle: claim a slot the queue offers (failing over attempts that lost a member on the way),
  publish the backlog, scale in when idle long enough (``asg_hooks``);
* idle or busy, at most once a period (``backlog_metric.PERIOD_SECONDS``): publish every group's
  backlog for the scale-out alarms (a cluster whose nodes are all busy must still grow for a
  waiting gang), and once more as the agent stops for a notice, so the attempt it just requeued is
  in the last counts and fallback forecast it leaves behind;
* waiting: renew the slot, wait for the other members; after ``gang_timeout`` give the slot back;
* running: torchrun as member ``slot`` with rank 0's address as the rendezvous, under the
  supervisor; scale-in protection held; a stop notice asks for this node's replacement at once and
  completes the lifecycle action only after the commit; then the agent takes no more work.
  While running it also checks its group every ``group_check_interval``: a wound-down group (a
  capacity block's end) is a stop notice like any other, and once saved the node leaves the group;
* stopped by the group (drain hook) while holding no work: the lifecycle action is completed at
  once (CONTINUE), since there is nothing to save.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gpucloud.agent.asg import InstanceNotInGroup
from gpucloud.agent.asg_hooks import WIND_DOWN, FleetHooks
from gpucloud.agent.fleet_view import fleet_state, group_backlog
from gpucloud.agent.identity import NodeIdentity, NodeLabels
from gpucloud.agent.job_tags import JOB_TAG, JobTagger, tagger_for
from gpucloud.agent.metrics import NodeMetrics
from gpucloud.agent.node_groups import NodeGroups
from gpucloud.agent.noncritical import NonCritical
from gpucloud.agent.table_notices import TableNotices, request_gang_stop
from gpucloud.agent.torchrun import DEFAULT_PORT, gang_argv
from gpucloud.cluster.agent_contract import PERIOD_SECONDS
from gpucloud.errors import UserError
from gpucloud.jobs.runner import AttemptResult, EventHook, NoticeSource, control_dir_for, run_attempt
from gpucloud.jobs.supervisor import SupervisorConfig
from gpucloud.lifecycle.model import Job, JobState, NodeRecord, NodeState, SlotClaim
from gpucloud.queue import gang
from gpucloud.queue.gang import GangQueue
from gpucloud.signals.eventbridge import CAPACITY_BLOCK_ACTION
from gpucloud.signals.events import Notice

log = logging.getLogger("gpucloud.agent")

Status = Callable[[dict[str, Any]], None]
EXIT_STOPPED = 75  # stopped by an interruption notice: the node is going away (as `gpucloud worker`)
# Notices after which EC2 takes the instance without the group replacing it first. Not
# asg-terminate (the group itself is removing the node) and not SIGTERM (`systemctl restart`
# of the agent must not detach a healthy node).
REPLACE_KINDS = frozenset({"spot-interruption", "scheduled-maintenance"})


@dataclasses.dataclass(frozen=True)
class AgentOptions:
    slot_lease: float = 30.0  # a member that stops renewing for this long is lost
    gang_timeout: float = 300.0  # give the slot back if the gang has not formed by then
    poll_interval: float = 1.0  # between claims while idle
    idle_exit: float | None = None  # exit after this long with nothing to claim (None: never)
    max_attempts: int | None = None  # exit after running this many attempts (None: never)
    rendezvous_port: int = DEFAULT_PORT
    local_checkpoint_dir: str | None = None
    run_root: Path | None = None  # per-attempt control directories (default $GPUCLOUD_HOME/run)
    groups: NodeGroups = dataclasses.field(default_factory=NodeGroups)  # the group served: claims, counts
    group_check_interval: float = 60.0  # while running: is the group wound down? (DescribeAutoScalingGroups)

    def __post_init__(self) -> None:
        if self.slot_lease <= 0 or self.gang_timeout <= 0 or self.poll_interval <= 0:
            raise UserError("--slot-lease, --gang-timeout and --poll-interval must be more than 0 seconds")
        if self.group_check_interval <= 0:
            raise UserError(f"group check interval {self.group_check_interval} must be more than 0 seconds")
        if not 1 <= self.rendezvous_port <= 65535:
            raise UserError(f"--rendezvous-port {self.rendezvous_port} is not a TCP port (1..65535)")


@dataclasses.dataclass(frozen=True)
class RanAttempt:
    job_id: str
    attempt: int
    slot: int
    nodes: int
    state: str  # how the attempt ended (the supervisor's AttemptEnd state)
    exit_code: int


@dataclasses.dataclass(frozen=True)
class AgentSummary:
    worker: str
    ran: tuple[RanAttempt, ...]
    stopped_by: str | None  # the notice kind that stopped the agent
    exit_code: int


class _SlotKeeper:
    """Renews this member's slot lease and the node record until stopped (a thread: the
    supervisor's loop is busy with the attempt)."""

    def __init__(self, agent: Agent, claim: SlotClaim) -> None:
        self.agent, self.claim = agent, claim
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"slot-{claim.job_id}-{claim.slot}", daemon=True)

    def __enter__(self) -> _SlotKeeper:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def _run(self) -> None:
        interval = min(self.agent.options.slot_lease / 4, self.agent.options.group_check_interval)
        next_group_check = 0.0  # monotonic; the first check as soon as the attempt runs
        while not self._stop.wait(interval):
            if self.agent.state is NodeState.RUNNING and time.monotonic() >= next_group_check:
                next_group_check = time.monotonic() + self.agent.options.group_check_interval
                self.agent.check_group()
            self.agent.publish_backlog()  # busy nodes publish too: nobody else may be idle to do it
            try:
                # A refused renewal means the slot changed hands while forming (our lease had run
                # out); _wait_for_gang sees that from the stored members and does not start.
                gang.renew(self.agent.queue, self.claim, lease_seconds=self.agent.options.slot_lease)
                self.agent.report()
            except Exception as err:  # noqa: BLE001 - a failed renewal is retried next round; the lease has slack
                log.warning("renewing slot %s of %s failed: %s", self.claim.slot, self.claim.job_id, err)


class _NoticeWatch:
    """The supervisor's notice source, telling the agent about a stop notice the moment it arrives
    (and the metrics about every notice: all of this node's pass here, idle or running)."""

    def __init__(
        self, source: NoticeSource, on_stop: Callable[[Notice], None], on_notice: Callable[[Notice], None]
    ) -> None:
        self.source, self.on_stop, self.on_notice = source, on_stop, on_notice

    def get(self, timeout: float) -> Notice | None:
        notice = self.source.get(timeout)
        if notice is not None:
            self.on_notice(notice)
        if notice is not None and notice.is_stop:
            self.on_stop(notice)
        return notice


class Agent:
    def __init__(
        self,
        queue: GangQueue,
        identity: NodeIdentity,
        notices: NoticeSource,
        hooks: FleetHooks,
        config: SupervisorConfig,
        options: AgentOptions,
        *,
        status: Status | None = None,
        on_event: EventHook | None = None,
        metrics: NodeMetrics | None = None,
        job_tags: JobTagger | None = None,
    ) -> None:
        self.queue, self.identity, self.hooks = queue, identity, hooks
        # gpucloud:job-id on this instance, its volumes and interfaces while an attempt runs (cluster nodes)
        self.job_tags = job_tags if job_tags is not None else tagger_for(identity, hooks)
        self.config, self.options = config, options
        # What /metrics serves (docs/monitoring.md); kept even when nothing serves it: it costs nothing.
        self.metrics = metrics or NodeMetrics(NodeLabels.of(identity, options.groups.own))
        self.notices = _NoticeWatch(notices, self._on_stop, self.metrics.noticed)
        self._status, self._on_event = status, on_event
        self.state = NodeState.IDLE
        self.current: SlotClaim | None = None
        self.stop_notice: Notice | None = None
        self.ran: list[RanAttempt] = []
        self._idle_at_stop = False  # the stop notice came while this node held no slot
        # Gangs this agent gave up waiting for -> when it may try again (monotonic): meanwhile
        # other jobs get their turn, and the idle clock keeps running.
        self._backoff: dict[tuple[str, int], float] = {}
        self._publish_at = 0.0  # next backlog datapoint (monotonic)
        self._publish_lock = threading.Lock()  # the idle loop and a busy slot keeper both publish
        self._group_check_at = 0.0  # next idle look at the group (monotonic)
        self._lock = threading.Lock()
        self.noncritical = NonCritical()  # metrics, node record, protection lift: logged once, retried

    # -- the node record and the status line --------------------------------------------------

    def report(self, state: NodeState | None = None, **extra: Any) -> None:
        """Record this node in the queue (``gpucloud nodes``) and tell the status line on a change."""
        with self._lock:
            changed = state is not None and state is not self.state
            if state is not None:
                self.state = state
            self.metrics.set_state(self.state)
            claim = self.current
            record = NodeRecord(
                id=self.identity.worker,
                address=self.identity.address,
                state=self.state,
                instance_type=self.identity.instance_type,
                lifecycle=self.identity.lifecycle,
                instance_id=self.identity.instance_id,
                group=self.options.groups.own,
                job_id=claim.job_id if claim else None,
                attempt=claim.attempt if claim else None,
                slot=claim.slot if claim else None,
                updated_at=time.time(),
            )
        self.noncritical.call(
            "recording this node in the queue", lambda: self.queue.register_node(record), default=None
        )
        if (changed or extra) and self._status is not None:
            self._status(
                {
                    "worker": record.id,
                    "state": record.state.value,
                    "job_id": record.job_id,
                    "attempt": record.attempt,
                    "slot": record.slot,
                    "at": record.updated_at,
                    **extra,
                }
            )

    def _on_stop(self, notice: Notice) -> None:
        with self._lock:
            first = self.stop_notice is None
            if first:
                self.stop_notice = notice
                self._idle_at_stop = self.current is None
        if not first:
            return
        claim = self.current
        if claim is not None:
            # The gang learns of it through the job table too, so the peers save even if this
            # node's ranks cannot spread the flag (cheap and idempotent; refused while forming).
            self._request_gang_stop(claim.job_id, claim.attempt, notice)
        if notice.kind not in REPLACE_KINDS:
            outcome = f"no replacement requested for a {notice.kind} notice"
        else:
            try:
                outcome = self.hooks.noticed()  # the replacement boots while the gang saves
            except UserError as err:  # AsgError included: the notice is handled either way
                outcome = f"replacement not requested: {err}"
        self.report(NodeState.STOPPING, notice=notice.kind, replacement=outcome)

    def _request_gang_stop(self, job_id: str, attempt: int, notice: Notice) -> None:
        try:
            request_gang_stop(self.queue, job_id, attempt, notice, instance_id=self.identity.instance_id)
        except Exception as err:  # noqa: BLE001 - the in-band flag still spreads through the ranks' collective
            log.warning("requesting the gang's stop for %s attempt %d failed: %s", job_id, attempt, err)

    # -- the loop -----------------------------------------------------------------------------

    def run(self) -> AgentSummary:
        idle_since = time.monotonic()
        self.report(NodeState.IDLE, address=self.identity.address, instance_type=self.identity.instance_type)
        try:
            while self.stop_notice is None:
                if self.options.max_attempts is not None and len(self.ran) >= self.options.max_attempts:
                    break
                now = time.monotonic()
                self._backoff = {k: until for k, until in self._backoff.items() if until > now}
                # Lost members' attempts are failed over inside claim_slot (their offers come too).
                claim = gang.claim_slot(
                    self.queue,
                    self.identity.worker,
                    self.identity.address,
                    lease_seconds=self.options.slot_lease,
                    skip=self._backoff.keys(),
                    skip_delay=self.options.poll_interval,
                    accepts=self.accepts,
                )
                if claim is None:
                    if self._idle(time.monotonic() - idle_since):
                        break
                    continue
                if self._take(claim):
                    idle_since = time.monotonic()
            self._leave_after_stop()
        finally:
            self.current = None
            self.report(NodeState.STOPPED)
            if self.stop_notice is not None:
                self.publish_backlog(force=True)  # the requeued attempt's counts and fallback forecast
        stopped = self.stop_notice.kind if self.stop_notice else None
        return AgentSummary(self.identity.worker, tuple(self.ran), stopped, EXIT_STOPPED if stopped else 0)

    def accepts(self, job: Job, at: float) -> bool:
        """May this agent claim a slot of ``job`` now: a job its group takes (its own, or a fallback
        once due), and not a gang whose live members are another group's nodes. A gang past its
        fallback wait could otherwise mix groups: different instance types, placement groups and
        perhaps zones in one torchrun, whose collectives then run at the slowest link (or not at all
        over EFA, which does not cross placement). The members it would join either form their gang
        or give their slots back after the gang timeout; then the fallback group may take it whole."""
        groups = self.options.groups
        if not groups.takes(job.spec, queued_for=gang.queued_for(job, at)):
            return False
        if groups.own is None or job.spec.nodes == 1 or job.spec.fallback_group is None:
            return True
        members = gang.view(self.queue.slot_claims(job.id, job.attempt), job.spec.nodes, at).live
        if not members:
            return True
        group_of = {n.id: n.group for n in self.queue.nodes()}
        return all(group_of.get(m.worker, groups.own) == groups.own for m in members)

    def check_group(self) -> None:
        """A wound-down group stops this node like a notice: while running, the gang saves and
        requeues; while idle, the node takes no more work (a requeued attempt must not land on a node
        the block is about to lose). Either way the node then leaves the group (``_leave_after_stop``).
        Not while a gang forms: its slot goes back within ``gang_timeout``."""
        if self.stop_notice is not None:
            return
        notice = self.noncritical.call(
            "checking the group for a wind-down (DescribeAutoScalingGroups)", self.hooks.group_ending, default=None
        )
        if notice is not None:
            log.warning("%s: stopping the attempt now, while it can still be saved", notice.payload.get("reason"))
            self._on_stop(notice)

    def _leave_after_stop(self) -> None:
        """What the group needs from a stopped node that no one else will do.

        * wound down: the saved node leaves the group now rather than run on, protected and idle,
          until EC2 reclaims the capacity block;
        * terminated by the group while holding no work: CONTINUE at once, or the instance waits out
          the hook's heartbeat timeout (a stop during an attempt is completed after its commit)."""
        notice = self.stop_notice
        if notice is None or notice.kind != "asg-terminate" or notice.action == CAPACITY_BLOCK_ACTION:
            return  # a capacity block's end: EC2, not the group, ends the instance; nothing to complete
        if notice.action == WIND_DOWN:
            outcome = self.noncritical.call("leaving the wound-down group", self.hooks.leave, default="failed")
            self.report(NodeState.STOPPING, left=outcome)
        elif self._idle_at_stop:
            self.noncritical.call("completing this idle node's lifecycle action", self.hooks.committed, default=False)

    def _idle(self, idle_for: float) -> bool:
        """One idle round; True when the agent should exit."""
        self.report(NodeState.IDLE)
        self._set_busy(False)
        # busy nodes: agents holding a slot that reported within a slot lease (a killed agent's record stays)
        fleet = fleet_state(self.queue, node_lease=self.options.slot_lease, groups=self.options.groups)
        unclaimed = sum(g.unclaimed for g in fleet.waiting)
        self.publish_backlog()
        if time.monotonic() >= self._group_check_at:
            self._group_check_at = time.monotonic() + self.options.group_check_interval
            self.check_group()
            if self.stop_notice is not None:
                return True
        if self.noncritical.call(
            "the idle scale-in check",
            lambda: self.hooks.scale_in(idle_for=idle_for, unclaimed_slots=unclaimed),
            default=False,
        ):
            self.report(NodeState.STOPPING, reason="idle: scaled in")
            return True
        if self.options.idle_exit is not None and idle_for >= self.options.idle_exit:
            return True
        self.notices.get(timeout=self.options.poll_interval)  # wakes early for a stop notice
        return False

    def publish_backlog(self, *, force: bool = False) -> None:
        """Every group's (unclaimed, busy) counts and the fallback forecast for the scale-out alarms,
        at most once a period (the alarm reads one datapoint a minute) unless ``force``d."""
        with self._publish_lock:
            now = time.monotonic()
            if not force and now < self._publish_at:
                return
            self._publish_at = now + PERIOD_SECONDS
        self.noncritical.call("publishing the backlog metric (CloudWatch PutMetricData)", self._publish, default=None)

    def _publish(self) -> None:
        groups, lease = self.options.groups, self.options.slot_lease
        if groups.own is None or not groups.names:  # off a cluster: this agent's view is the whole fleet
            fleet = fleet_state(self.queue, node_lease=lease, groups=groups)
            self.hooks.publish_backlog(
                unclaimed_slots=sum(g.unclaimed for g in fleet.waiting), busy_nodes=fleet.busy_nodes
            )
            return
        backlog = group_backlog(self.queue, node_lease=lease, groups=groups)
        unclaimed, busy = backlog.counts[groups.own]
        self.hooks.publish_backlog(
            unclaimed_slots=unclaimed,
            busy_nodes=busy,
            other_groups={name: c for name, c in backlog.counts.items() if name != groups.own},
            fallback_due=backlog.fallback_due,
        )

    def _take(self, claim: SlotClaim) -> bool:
        """Wait for the gang of ``claim`` and run its attempt; False when it never ran here."""
        self.current = claim
        self._set_busy(True)
        try:
            with _SlotKeeper(self, claim):
                self.report(NodeState.WAITING)
                members = self._wait_for_gang(claim)
                if members is None:
                    return False
                job = gang.start_gang(self.queue, claim, lease_seconds=self.config.lease_seconds)
                if job is None:
                    return False  # the attempt ended or was taken over while forming; claim again
                self.report(NodeState.RUNNING)
                result = self._run(job, claim, members)
            self.ran.append(
                RanAttempt(job.id, claim.attempt, claim.slot, job.spec.nodes, result.end.state.value, result.exit_code)
            )
            if self.stop_notice is not None and result.end.committed_step is not None:
                self.hooks.committed()  # CONTINUE only now: the checkpoint is durable
            return True
        finally:
            self.current = None
            if self.stop_notice is None:
                self._set_busy(False)

    def _set_busy(self, busy: bool) -> None:
        """Scale-in protection. A failure is survivable either way: unprotected, a busy node that the
        group picks for scale-in gets the drain hook's notice and saves; still protected, an idle
        node stays a while longer. Only "not a member" stops the agent: a detached node takes no work."""
        self.noncritical.call(
            f"{'setting' if busy else 'lifting'} scale-in protection",
            lambda: self.hooks.busy(busy),
            default=None,
            critical=(InstanceNotInGroup,),
        )

    def _wait_for_gang(self, claim: SlotClaim) -> list[SlotClaim] | None:
        job = self.queue.get(claim.job_id)
        deadline = time.monotonic() + self.options.gang_timeout
        while True:
            members = gang.members(self.queue, job, claim.attempt)
            if members is not None and any(m.worker == claim.worker for m in members):
                return members
            current = self.queue.get(claim.job_id)
            if current.state is not JobState.QUEUED or current.attempt != claim.attempt:
                if current.state is JobState.RUNNING and current.worker == gang.gang_worker(
                    claim.job_id, claim.attempt
                ):
                    # Started by the others while we looked: its stored members, leases aside (a
                    # late one is the lost-member sweep's business, not a reason not to join).
                    return gang.members(self.queue, job, claim.attempt, now=0.0)
                return None
            if self.stop_notice is not None or time.monotonic() >= deadline:
                if gang.release(self.queue, claim):
                    self._backoff[(claim.job_id, claim.attempt)] = time.monotonic() + self.options.gang_timeout
                    self.current = None
                    self.report(NodeState.IDLE, released=f"{claim.job_id} slot {claim.slot}")
                    return None
                continue  # the gang started meanwhile: join it
            self.notices.get(timeout=min(0.2, self.options.poll_interval))

    def _run(self, job: Job, claim: SlotClaim, members: list[SlotClaim]) -> AttemptResult:
        if job.spec.nodes > 1:
            rendezvous = next(m.address for m in members if m.slot == 0)
            argv = gang_argv(
                job.spec.command,
                nnodes=job.spec.nodes,
                node_rank=claim.slot,
                rendezvous_host=rendezvous,
                port=self.options.rendezvous_port,
                run_id=f"{job.id}-{job.attempt}",
                nproc_per_node=max(1, job.spec.gpus_per_node),
            )
            job = job.model_copy(update={"spec": job.spec.model_copy(update={"command": argv})})
        if self.stop_notice is not None:
            # Noticed while the gang formed, and the gang started anyway: it must still save. Our
            # supervisor gets the notice first thing (below); the peers through the table.
            self._request_gang_stop(job.id, job.attempt, self.stop_notice)

        def about_this_node(notice: Notice) -> None:
            # Recorded by another agent's events-queue handler about this very instance: it is this
            # node's own notice (no more work, replacement asked for), even if IMDS has not said so yet.
            if self.identity.instance_id is not None and notice.payload.get("instance-id") == self.identity.instance_id:
                self._on_stop(notice)

        # Every member also watches the attempt's stop request in the job table, so a notice seen
        # anywhere (or by the events-queue handler, for a node whose agent is dead) flags its ranks.
        notices = TableNotices(
            self.notices, self.queue, job.id, job.attempt, on_table_notice=about_this_node, first=self.stop_notice
        )

        def on_event(kind: str, payload: dict[str, Any]) -> None:
            self.metrics.timeline(kind, payload)  # notice -> commit
            if self._on_event is not None:
                self._on_event(kind, payload)

        self.metrics.attempt_started(job.id, job.attempt, control_dir_for(job.id, job.attempt, self.options.run_root))
        result: AttemptResult | None = None
        tags = self.job_tags
        if tags is not None:
            self.noncritical.call(f"tagging this node with {JOB_TAG}", lambda: tags.tag(job.id), default=None)
        try:
            result = run_attempt(
                self.queue,
                job,
                worker=gang.gang_worker(job.id, job.attempt),
                notices=notices,
                config=self.config,
                local_checkpoint_dir=self.options.local_checkpoint_dir,
                on_event=on_event,
                run_root=self.options.run_root,
                node={**self.identity.placement(), "worker": self.identity.worker},  # priced per node
            )
            return result
        finally:
            self.metrics.attempt_ended(result)
            if tags is not None:
                self.noncritical.call(f"removing {JOB_TAG} from this node", tags.untag, default=None)
