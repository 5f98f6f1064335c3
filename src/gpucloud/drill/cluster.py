"""The drill on a deployed cluster: AWS FIS interrupts one spot node of the drill's own job.

Entry point (``commands/drill.py`` calls it; ``drill/verdict.py`` judges what it returns)::

    run_on_cluster(
        *,
        stack: str,                       # the stack's name (messages, the experiment's tags)
        outputs: Mapping[str, Any],       # infra.automation.open_stack(stack).outputs()
        region: str,                      # the stack's region (spec.region)
        job: DrillJob,                    # what to run: the shipped example, or the user's command
        progress: Callable[[str], None],  # one line per step of the drill (the CLI prints to stderr)
        clients: ClientFactory | None = None,  # service name -> boto3 client; None: boto3 in ``region``
        timeout_s: float = 1800.0,        # the whole drill; past it: DrillAborted (exit 1)
        poll_interval_s: float = 5.0,     # between reads of the queue and GetExperiment
    ) -> DrillRun                         # injector "fis"; its queue is open: the caller closes it

The steps, each reported through ``progress``:

1. Read the stack's outputs: the job plane (``jobTableName``, ``jobQueueUrl``), the checkpoint
   bucket, and ``drill`` (the FIS template, its stop alarm); the template's spot action gives the
   notice's lead. A stop alarm in ALARM refuses the drill (``drill/fis.py``).
2. Submit a 2-node gang job on the stack's AWS queue: ``examples/train_spot.py`` shipped as a
   ``submit --workdir`` snapshot to ``s3://<checkpointBucket>/code/`` (``jobs/code/store.py``),
   or the user's command.
3. Wait until its attempt runs and its recorded progress shows ``notice_at_step``; the gang's
   instance ids come from the queue's slot claims and the agents' node records (``queue/gang.py``,
   ``NodeRecord.instance_id``); the target is the lowest slot on a spot instance.
4. Tag that instance with ``contract.TARGET_TAG`` (the template selects by it), start the
   experiment and follow it with GetExperiment; the tag is removed in every case afterwards, and an
   experiment still running when the drill gives up is stopped.
5. Follow the job until it ends (finished, failed, cancelled) and return the ``DrillRun``.

A drill that cannot run to its end raises ``DrillAborted`` (exit 1) and cancels its job, so nothing
of it keeps the cluster's nodes busy.
"""

from __future__ import annotations

import dataclasses
import shutil
import tempfile
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from gpucloud.cluster.drill_contract import STACK_OUTPUT
from gpucloud.cluster.tags import STACK_TAG
from gpucloud.drill import fis as fis_calls
from gpucloud.drill.run import EXAMPLE, DrillAborted, DrillRun, check_steps
from gpucloud.errors import UserError, error_line
from gpucloud.lifecycle.model import CodeRef, Job, JobSpec, JobState, spec_from_flags
from gpucloud.queue.aws.uri import AwsQueueAddress, parse_aws_uri
from gpucloud.queue.gang import GangQueue

ClientFactory = Callable[[str], Any]  # "fis" | "ec2" | "cloudwatch" -> a boto3 client
Say = Callable[[str], None]

JOB_NAME = "gpucloud-drill"
DRILL_JOB_TAG = "gpucloud:drill-job"  # on the experiment: which job it interrupted
SPOT = "spot"


@dataclasses.dataclass(frozen=True)
class DrillJob:
    """The drill's job: a 2-node gang on the stack's spot group.

    Default: ``examples/train_spot.py`` shipped as a ``submit --workdir`` snapshot to the stack's
    checkpoint bucket. ``command`` (with ``workdir`` to ship, or None to run in the node's directory)
    runs the user's own training instead; it must checkpoint through ``gpucloud.checkpoint``."""

    steps: int = 40
    notice_at_step: int = 2
    step_seconds: float = 0.5
    group: str | None = None  # the spot node group whose agents run it (None: the stack's first group)
    command: tuple[str, ...] | None = None
    workdir: Path | None = None
    nodes: int = 2

    def validate(self) -> None:
        if self.nodes < 2:
            raise UserError(f"the drill's job needs at least 2 nodes (a gang), got {self.nodes}")
        check_steps(self.steps, self.notice_at_step)
        if self.command is not None and not self.command:
            raise UserError("the drill's command is empty; give a training command or none for the example")
        if self.workdir is not None and not self.workdir.is_dir():
            raise UserError(f"the drill's workdir {self.workdir} is not a directory")


@dataclasses.dataclass(frozen=True)
class ClusterDrill:
    """What the stack's outputs say the drill needs."""

    queue_uri: str
    bucket: str | None
    template_id: str
    stop_alarm: str | None


def read_outputs(stack: str, outputs: Mapping[str, Any], region: str) -> ClusterDrill:
    """The drill's part of the stack outputs, or one line naming what is missing."""
    drill = outputs.get(STACK_OUTPUT)
    if not isinstance(drill, Mapping) or not drill.get("experimentTemplateId"):
        raise UserError(
            f"stack {stack} has no {STACK_OUTPUT!r} output (no FIS experiment template): set `gpucloud:drill: true` "
            "in its stack file, run `pulumi up`, then drill again (or add --local for the offline drill)"
        )
    missing = [name for name in ("jobTableName", "jobQueueUrl") if not outputs.get(name)]
    if missing:
        raise UserError(f"stack {stack} has no {' or '.join(missing)} output; run `pulumi up` on it first")
    address = AwsQueueAddress(region=region, table=str(outputs["jobTableName"]), queue_url=str(outputs["jobQueueUrl"]))
    return ClusterDrill(
        queue_uri=parse_aws_uri(address.uri).uri,
        bucket=str(outputs["checkpointBucket"]) if outputs.get("checkpointBucket") else None,
        template_id=str(drill["experimentTemplateId"]),
        stop_alarm=str(drill["stopAlarmName"]) if drill.get("stopAlarmName") else None,
    )


def boto3_clients(region: str) -> ClientFactory:
    def make(service: str) -> Any:
        import boto3
        from botocore.config import Config

        return boto3.client(service, region_name=region, config=Config(retries={"mode": "standard"}))

    return make


def example_command(job: DrillJob) -> list[str]:
    """``examples/train_spot.py`` as the snapshot's top-level file, one rank per node (the agent
    adds the gang's nodes: ``agent/torchrun.py``), gloo: it runs on any node."""
    return [
        "torchrun",
        "--nproc-per-node=1",
        "train_spot.py",
        "--steps",
        str(job.steps),
        "--step-seconds",
        f"{job.step_seconds:g}",
    ]


def ship(directory: Path, *, bucket: str | None, queue_uri: str) -> CodeRef:
    """``submit --workdir``'s snapshot of ``directory``, stored where the cluster's nodes read it."""
    from gpucloud.jobs.code.snapshot import build
    from gpucloud.jobs.code.store import store

    with tempfile.TemporaryDirectory(prefix="gpucloud-drill-snapshot-") as scratch:
        snapshot = build(directory, Path(scratch))
        stored = store(snapshot, checkpoint_uri=f"s3://{bucket}/" if bucket else None, queue_uri=queue_uri)
    return CodeRef(uri=stored.uri, sha256=snapshot.sha256, size_bytes=snapshot.size_bytes, files=snapshot.files)


def drill_spec(job: DrillJob, *, bucket: str | None, queue_uri: str) -> JobSpec:
    """The drill job; ships its code first (the example, or the user's ``workdir``)."""
    if job.command is not None:
        command = list(job.command)
        code = ship(job.workdir, bucket=bucket, queue_uri=queue_uri) if job.workdir is not None else None
    else:
        if not EXAMPLE.exists():
            raise UserError(f"the drill ships the example {EXAMPLE}; run gpucloud drill from a source checkout")
        with tempfile.TemporaryDirectory(prefix="gpucloud-drill-code-") as tree:
            shutil.copyfile(EXAMPLE, Path(tree) / EXAMPLE.name)
            code = ship(Path(tree), bucket=bucket, queue_uri=queue_uri)
        command = example_command(job)
    # No checkpoint URI: each node resolves the cluster's bucket itself (queue/connect.py).
    return spec_from_flags(
        command=command,
        name=JOB_NAME,
        nodes=job.nodes,
        group=job.group,
        code=None if code is None else code.model_dump(),
        max_attempts=1,  # a crash is no interruption: it fails the job, and the drill, at once
    )


@dataclasses.dataclass(frozen=True)
class Member:
    slot: int
    worker: str
    instance_id: str | None
    lifecycle: str | None


def gang_members(queue: GangQueue, job: Job) -> list[Member]:
    """The running attempt's members by slot, with what their agents reported about their nodes."""
    nodes = {n.id: n for n in queue.nodes()}
    claims = sorted(queue.slot_claims(job.id, job.attempt), key=lambda c: c.slot)
    return [
        Member(
            slot=c.slot,
            worker=c.worker,
            instance_id=nodes[c.worker].instance_id if c.worker in nodes else None,
            lifecycle=nodes[c.worker].lifecycle if c.worker in nodes else None,
        )
        for c in claims
    ]


def choose_target(members: list[Member], nodes: int) -> Member | None:
    """The lowest slot on a spot instance (rank 0 first: it hosts the gang's rendezvous, the
    hardest member to lose); None while some member has not reported its instance yet."""
    if len(members) < nodes or any(m.instance_id is None for m in members):
        return None
    spot = [m for m in members if m.lifecycle == SPOT]
    if not spot:
        kinds = ", ".join(f"{m.instance_id} ({m.lifecycle or 'unknown'})" for m in members)
        raise DrillAborted(
            f"the drill job's gang runs on no spot instance ({kinds}); FIS interrupts spot instances only: "
            "give the drill the stack's spot group"
        )
    return spot[0]


class _Follower:
    """One deadline for every wait, and a progress line whenever the job's state, attempt or step moves."""

    def __init__(self, queue: GangQueue, job_id: str, say: Say, timeout_s: float, poll_interval_s: float) -> None:
        self.queue, self.job_id, self.say = queue, job_id, say
        self.timeout_s, self.poll_interval_s = timeout_s, poll_interval_s
        self.deadline = time.monotonic() + timeout_s
        self._seen: tuple[Any, ...] | None = None

    def job(self) -> Job:
        job = self.queue.get(self.job_id)
        seen = (job.state, job.attempt, job.last_step)
        if seen != self._seen:
            self._seen = seen
            step = "" if job.last_step is None else f", step {job.last_step}"
            self.say(f"job {job.id}: {job.state.value}, attempt {job.attempt}{step}")
        return job

    def until(self, done: Callable[[Job], bool], what: str) -> Job:
        while True:
            job = self.job()
            if done(job):
                return job
            if time.monotonic() >= self.deadline:
                raise self.timed_out(what, job)
            time.sleep(self.poll_interval_s)

    def timed_out(self, what: str, job: Job) -> DrillAborted:
        return DrillAborted(
            f"drill timed out after {self.timeout_s:g}s waiting for {what} (job {job.id} is {job.state.value}, "
            f"attempt {job.attempt}; raise --timeout)"
        )


def run_on_cluster(
    *,
    stack: str,
    outputs: Mapping[str, Any],
    region: str,
    job: DrillJob,
    progress: Say,
    clients: ClientFactory | None = None,
    timeout_s: float = 1800.0,
    poll_interval_s: float = 5.0,
) -> DrillRun:
    """Run the drill on the stack's cluster (see the module's docstring)."""
    from gpucloud.queue.connect import open_queue

    job.validate()
    cluster = read_outputs(stack, outputs, region)
    make = clients or boto3_clients(region)
    fis, ec2 = make("fis"), make("ec2")
    template = fis_calls.get_template(fis, cluster.template_id)
    lead = fis_calls.template_lead_seconds(template)
    if cluster.stop_alarm is not None:
        fis_calls.check_stop_alarm(make("cloudwatch"), cluster.stop_alarm)
    queue: GangQueue = open_queue(cluster.queue_uri)
    job_id: str | None = None
    try:
        spec = drill_spec(job, bucket=cluster.bucket, queue_uri=cluster.queue_uri)
        job_id = queue.submit(spec).id
        group = f" of group {job.group}" if job.group else ""
        progress(
            f"submitted {job.nodes}-node job {job_id} to {cluster.queue_uri}; waiting for its gang{group} "
            f"(the group scales up from the queue's backlog) and step {job.notice_at_step}"
        )
        follow = _Follower(queue, job_id, progress, timeout_s, poll_interval_s)
        target = _wait_for_target(follow, job)
        progress(f"target: slot {target.slot}, instance {target.instance_id} ({target.worker})")
        assert target.instance_id is not None  # choose_target returns members with an instance id
        experiment, started = _interrupt(
            fis, ec2, cluster.template_id, target.instance_id, follow, stack=stack, say=progress
        )
        final = follow.until(lambda j: j.state.terminal, "the job to end after the interruption")
        progress(f"job {job_id} {final.state.value} after {final.attempt} attempt(s)")
    except BaseException:
        if job_id is not None:
            _cancel(queue, job_id, progress)
        queue.close()
        raise
    return DrillRun(
        queue=queue,
        job_id=job_id,
        target=target.instance_id,
        injected_at=fis_calls.injected_at(experiment, fallback=started),
        lead_seconds=lead,
        injector="fis",
        experiment=fis_calls.summary(experiment, cluster.template_id),
    )


def _wait_for_target(follow: _Follower, job: DrillJob) -> Member:
    """Wait for the running attempt to pass ``notice_at_step`` with every member's instance known."""
    chosen: list[Member] = []

    def ready(current: Job) -> bool:
        if current.state.terminal:
            raise DrillAborted(
                f"job {current.id} {current.state.value} before it reached step {job.notice_at_step}, so nothing "
                f"was interrupted ({current.reason or 'no reason recorded'})"
            )
        if current.state is not JobState.RUNNING or (current.last_step or 0) < job.notice_at_step:
            return False
        target = choose_target(gang_members(follow.queue, current), current.spec.nodes)
        if target is not None:
            chosen.append(target)
        return target is not None

    follow.until(ready, f"the drill job to run and pass step {job.notice_at_step}")
    return chosen[-1]


def _interrupt(
    fis: Any, ec2: Any, template_id: str, instance_id: str, follow: _Follower, *, stack: str, say: Say
) -> tuple[dict[str, Any], float]:
    """Tag the target, run the experiment to its end, untag: (the completed experiment, when it started).
    The tag is removed whatever happens; when removing it fails on the way out of another error,
    that error is the one raised, and the line says how to remove the tag by hand."""
    fis_calls.tag_target(ec2, instance_id)
    try:
        result = _experiment(fis, template_id, instance_id, follow, stack=stack, say=say)
    except BaseException:
        _untag(ec2, instance_id, say, strict=False)
        raise
    _untag(ec2, instance_id, say, strict=True)
    return result


def _experiment(
    fis: Any, template_id: str, instance_id: str, follow: _Follower, *, stack: str, say: Say
) -> tuple[dict[str, Any], float]:
    started = time.time()
    experiment = fis_calls.start_experiment(
        fis,
        template_id,
        client_token=f"gpucloud-drill-{follow.job_id}",
        tags={STACK_TAG: stack, DRILL_JOB_TAG: follow.job_id},
    )
    say(f"FIS experiment {experiment['id']} started (template {template_id}): interrupting {instance_id}")
    last = experiment
    statuses: list[str] = []

    def on_poll(reply: dict[str, Any]) -> None:
        nonlocal last
        last = reply
        status = fis_calls.status_of(reply)
        if not statuses or statuses[-1] != status:
            statuses.append(status)
            say(f"experiment {reply['id']}: {status}")
        follow.job()

    try:
        final = fis_calls.follow_experiment(
            fis, experiment["id"], poll_interval_s=follow.poll_interval_s, deadline=follow.deadline, on_poll=on_poll
        )
    except BaseException as err:
        if fis_calls.status_of(last) not in fis_calls.FINAL:  # gave up on it: it must not go on alone

            def stop() -> None:
                fis_calls.stop_experiment(fis, experiment["id"])
                say(f"stopped experiment {experiment['id']}")

            _best_effort(stop, say)
        if isinstance(err, TimeoutError):
            raise follow.timed_out(f"experiment {experiment['id']} to end", follow.queue.get(follow.job_id)) from None
        raise
    return final, started


def _untag(ec2: Any, instance_id: str, say: Say, *, strict: bool) -> None:
    try:
        fis_calls.untag_target(ec2, instance_id)
    except UserError as err:
        line = (
            f"{err}; remove the tag by hand: aws ec2 delete-tags --resources {instance_id} "
            f"--tags Key={fis_calls.TARGET_TAG},Value={fis_calls.TARGET_VALUE}"
        )
        if strict:
            raise UserError(line, exit_code=1) from None
        say(line)
        return
    say(f"removed {fis_calls.TARGET_TAG} from {instance_id}")


def _cancel(queue: GangQueue, job_id: str, say: Say) -> None:
    """The aborted drill's job must not keep nodes busy: cancel it (its ranks save a step first)."""

    def cancel() -> None:
        if not queue.get(job_id).state.terminal:
            queue.cancel(job_id)
            say(f"cancelled the drill job {job_id}")

    _best_effort(cancel, say)


def _best_effort(call: Callable[[], None], say: Say) -> None:
    """Clean-up on the way out of a failure: its own failure is said, never raised over the first."""
    try:
        call()
    except Exception as err:  # noqa: BLE001  (the drill's own error is the one to raise)
        say(f"clean-up failed: {error_line(err)}")
