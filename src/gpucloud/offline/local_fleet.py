"""The drill offline: the local fleet, with IMDS emulators standing in for AWS FIS.

Three ``gpucloud agent`` processes on this machine, each with its own IMDS emulator as its "node"
(``offline/imds_emulator.py``) and its own run directory, share one SQLite queue in a work
directory. A 2-node gang job (``examples/train_spot.py`` under real torchrun, gloo, one rank per
node) is taken by agents a and b; the standby agent joins the fleet idle. Once the job's recorded
progress shows step K, node a's emulator announces a spot interruption, exactly what FIS's
``aws:ec2:send-spot-instance-interruptions`` makes IMDS say on a cluster; the gang saves one step,
the job is requeued, and b plus the standby run attempt 2. What the queue then holds is judged by
``drill/verdict.py``, the same code that judges a drill on a cluster.

``run_noticed_gang`` is also the fleet simulation of ``tests/agent/test_fleet_simulation.py`` and
``benchmarks/bench_fleet.py``: they pass their own "reached" condition (a gate that holds training
until the notice is out) instead of the queue's progress.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from gpucloud.drill.run import DrillAborted, DrillRun, check_steps
from gpucloud.errors import UserError
from gpucloud.lifecycle.model import JobSpec, JobState
from gpucloud.offline.imds_emulator import ImdsEmulator
from gpucloud.queue.gang import GangQueue
from gpucloud.queue.sqlite import SqliteQueue

NODES = ("a", "b", "standby")  # a and b form the gang; a is noticed; the standby joins attempt 2
TARGET = "a"
# The real CLI in a process of its own per node (its UserError handling and exit codes included).
CLI = [sys.executable, "-m", "gpucloud"]
AGENT_POLL_S = 0.2  # each agent's --poll-interval (IMDS and queue)
# After the job ended, how long an agent may take to exit by itself (b exits after --idle-exit 8 s).
AGENT_EXIT_GRACE_S = 30.0

# The settings that tie a process to one queue, node or IMDS: the drill's agents must use the drill's
# queue and emulators, never the caller's (a developer's shell may point at a real cluster's queue).
NODE_ENV = (
    "GPUCLOUD_QUEUE",
    "AWS_EC2_METADATA_SERVICE_ENDPOINT",
    "GPUCLOUD_REGION",
    "GPUCLOUD_JOB_TABLE",
    "GPUCLOUD_JOB_QUEUE_URL",
    "GPUCLOUD_EVENTS_QUEUE_URL",
    "GPUCLOUD_CHECKPOINT_BUCKET",
    "GPUCLOUD_FSX_MOUNT_PATH",
    "GPUCLOUD_SHARED_PATHS",
    "GPUCLOUD_SCRATCH_PATH",
    "GPUCLOUD_NODE_GROUP",
    "GPUCLOUD_NODE_GROUPS",
)

Say = Callable[[str], None]


@dataclasses.dataclass(frozen=True)
class LocalDrillOptions:
    steps: int = 60
    notice_at_step: int = 3
    step_seconds: float = 0.5  # extra time per step: the notice must land while attempt 1 still trains
    lead_seconds: float = 120.0  # a spot interruption's two minutes
    timeout: float = 600.0  # the whole drill
    instance_type: str = "p4d.24xlarge"  # what the emulators say the nodes are (the stack's spot group)
    workdir: Path | None = None
    keep: bool = False

    def validate(self) -> None:

        check_steps(self.steps, self.notice_at_step)
        if not self.timeout > 0:
            raise UserError(f"--timeout must be more than 0 seconds, got {self.timeout:g}")


@dataclasses.dataclass(frozen=True)
class NoticedGang:
    """What one run of the fleet left behind (the agents have all exited)."""

    noticed_at: float  # time.time() when node a's emulator announced the interruption
    gang: dict[int, str]  # attempt 1: slot -> worker id
    outputs: dict[str, tuple[str, str]]  # agent name -> (stdout, stderr)
    codes: dict[str, int]  # agent name -> exit code


def free_port() -> int:
    """A port the kernel chose (the gang's rendezvous port)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start_agent(
    env: dict[str, str],
    work: Path,
    name: str,
    emulator: ImdsEmulator,
    port: int,
    *,
    slot_lease: float = 6,
    idle_exit: float = 8,
    extra: tuple[str, ...] = (),
    logs: Path | None = None,
) -> subprocess.Popen:
    """One node's agent as a process, on its own IMDS emulator; ``extra``: more agent flags. Its stdout
    and stderr go to pipes, or with ``logs`` to ``logs/NAME.out`` and ``logs/NAME.err`` (a long run
    must not fill a pipe nobody reads yet)."""
    argv = [
        *CLI,
        "agent",
        "--imds-endpoint",
        emulator.endpoint,
        "--poll-interval",
        f"{AGENT_POLL_S:g}",
        "--address",
        "127.0.0.1",
        "--rendezvous-port",
        str(port),
        "--run-dir",
        str(work / name / "run"),
        "--slot-lease",
        f"{slot_lease:g}",
        "--idle-exit",
        f"{idle_exit:g}",
        *extra,
        "--output",
        "json",
    ]
    if logs is None:
        return subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    logs.mkdir(parents=True, exist_ok=True)
    with open(logs / f"{name}.out", "w") as out, open(logs / f"{name}.err", "w") as err:
        return subprocess.Popen(argv, env=env, stdout=out, stderr=err, text=True)


def _read(path: Path) -> str:
    return path.read_text() if path.exists() else ""


class _Clock:
    """The drill's one deadline, shared by every wait."""

    def __init__(self, timeout: float) -> None:
        self.timeout = timeout
        self.deadline = time.monotonic() + timeout

    def left(self) -> float:
        return max(0.0, self.deadline - time.monotonic())

    def wait_for(
        self, predicate: Callable[[], object], what: str, *, still_ok: Callable[[], None] = lambda: None
    ) -> None:
        """Poll ``predicate`` until it holds; ``still_ok()`` raises when waiting longer is pointless."""
        while True:
            still_ok()
            if predicate():
                return
            if time.monotonic() >= self.deadline:
                raise DrillAborted(f"drill timed out after {self.timeout:g}s waiting for {what} (raise --timeout)")
            time.sleep(0.05)  # polling the queue, which the agents write


def progressed_past(queue: GangQueue, job_id: str, step: int) -> Callable[[], bool]:
    """Whether the running job's recorded progress (stored with its lease renewals) shows ``step``;
    a job that ended first aborts the drill: there is nothing left to interrupt."""

    def check() -> bool:
        job = queue.get(job_id)
        if job.state.terminal:
            raise DrillAborted(
                f"job {job_id} {job.state.value} before it reached step {step}, so no notice was sent "
                f"(last step {job.last_step}); give it more --steps or a lower --notice-at-step"
            )
        return job.state is JobState.RUNNING and job.last_step is not None and job.last_step >= step

    return check


def run_noticed_gang(
    queue: GangQueue,
    job_id: str,
    env: dict[str, str],
    work: Path,
    *,
    notice_after_step: int,
    notice_lead: float = 120.0,
    exit_timeout: float = 180.0,
    reached: Callable[[], object] | None = None,
    after_notice: Callable[[], None] | None = None,
    instance_type: str = "g5.xlarge",
    say: Say = lambda line: None,
) -> NoticedGang:
    """Agents a and b, each with its own IMDS emulator as its node, take the 2-node gang ``job_id``;
    the standby agent joins the fleet idle; once ``reached()`` (default: the job's progress shows
    ``notice_after_step``), a's emulator announces a spot interruption (``after_notice()`` runs
    right after); then it follows the job to its end and gives each agent ``AGENT_EXIT_GRACE_S`` to
    exit by itself (a exits 75 at the notice, b when idle, the standby after attempt 2) before it is
    stopped. Every wait shares ``exit_timeout``: past it, or when every agent is gone first,
    ``DrillAborted`` says what was being waited for."""
    clock = _Clock(exit_timeout)
    port = free_port()
    env = {**env, "GPUCLOUD_METRICS_LINGER": "0"}  # the noticed agent exits at once
    emulators = {
        name: ImdsEmulator(
            instance_id=f"i-00000000000000{n:03d}", instance_type=instance_type, instance_life_cycle="spot"
        ).__enter__()
        for n, name in enumerate(NODES)
    }
    procs: dict[str, subprocess.Popen] = {}
    logs = work / "agent-logs"

    def alive(names: tuple[str, ...]) -> None:
        for name in names:
            proc = procs[name]
            if proc.poll() is not None:
                err = _read(logs / f"{name}.err").strip().splitlines()
                raise DrillAborted(f"agent {name} exited {proc.returncode} early: {err[-1] if err else 'no output'}")

    def some_alive(job_id: str) -> None:
        if procs and all(proc.poll() is not None for proc in procs.values()):
            state = queue.get(job_id).state.value
            raise DrillAborted(f"every agent exited ({_codes(procs)}) while job {job_id} is {state}")

    try:
        for name in ("a", "b"):
            procs[name] = start_agent(env, work, name, emulators[name], port, logs=logs)
        say(f"agents a and b started; job {job_id} waits for its 2-node gang")
        clock.wait_for(
            lambda: queue.get(job_id).state is JobState.RUNNING, "the gang to start", still_ok=lambda: alive(("a", "b"))
        )
        gang = {c.slot: c.worker for c in queue.slot_claims(job_id, 1)}
        # The standby joins while the gang trains: idle (nothing to claim) until attempt 2, after which it exits.
        procs["standby"] = start_agent(
            env,
            work,
            "standby",
            emulators["standby"],
            port,
            idle_exit=exit_timeout,
            extra=("--exit-after-attempts", "1"),
            logs=logs,
        )
        say(f"attempt 1 running on a and b; the standby agent joins; waiting for step {notice_after_step}")
        clock.wait_for(
            lambda: len(queue.nodes()) == len(NODES),
            "the standby agent to report itself",
            still_ok=lambda: alive(NODES),
        )
        reached = reached or progressed_past(queue, job_id, notice_after_step)
        clock.wait_for(reached, f"attempt 1 to pass step {notice_after_step}", still_ok=lambda: alive(NODES))
        noticed_at = time.time()
        emulators[TARGET].spot_interruption("terminate", lead_seconds=notice_lead)
        say(f"spot interruption announced on node {TARGET}'s IMDS ({notice_lead:g}s lead); following the job")
        if after_notice is not None:
            after_notice()
        clock.wait_for(lambda: queue.get(job_id).state.terminal, "the job to end", still_ok=lambda: some_alive(job_id))
        for name, proc in procs.items():  # each exits by itself: a at the notice, b idle, the standby after attempt 2
            try:
                proc.wait(timeout=min(clock.left(), AGENT_EXIT_GRACE_S))
            except subprocess.TimeoutExpired:
                say(f"agent {name} still runs {AGENT_EXIT_GRACE_S:g}s after the job ended; stopping it")
                stop(proc)
    finally:
        for proc in procs.values():
            stop(proc)
        for emulator in emulators.values():
            emulator.__exit__(None, None, None)
    outputs = {name: (_read(logs / f"{name}.out"), _read(logs / f"{name}.err")) for name in procs}
    return NoticedGang(
        noticed_at=noticed_at, gang=gang, outputs=outputs, codes={name: proc.returncode for name, proc in procs.items()}
    )


def stop(proc: subprocess.Popen, grace: float = 10.0) -> None:
    """SIGTERM (an idle agent exits at once; a busy one saves and requeues first), SIGKILL after ``grace``."""
    if proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def _codes(procs: dict[str, subprocess.Popen]) -> str:
    return ", ".join(f"{name} {proc.returncode}" for name, proc in procs.items())


def agent_env(home: Path, queue_uri: str, base: dict[str, str] | None = None) -> dict[str, str]:
    """The agents' environment: the caller's, without anything that ties it to another queue or node."""
    base = dict(os.environ if base is None else base)
    return {k: v for k, v in base.items() if k not in NODE_ENV} | {
        "GPUCLOUD_HOME": str(home),
        "GPUCLOUD_QUEUE": queue_uri,
    }


@contextlib.contextmanager
def local_drill(options: LocalDrillOptions, *, say: Say = lambda line: None) -> Iterator[DrillRun]:
    """Run the drill on the local fleet; yields its DrillRun (the queue stays open inside the block).
    The work directory is removed afterwards unless ``options.keep``."""
    from gpucloud.offline.demo import EXAMPLE, training_command

    options.validate()
    if not EXAMPLE.exists():
        raise UserError(
            f"the offline drill runs the example {EXAMPLE}; run gpucloud drill --local from a source checkout"
        )
    workdir = options.workdir or Path(tempfile.mkdtemp(prefix="gpucloud-drill-"))
    if options.workdir and workdir.exists() and any(workdir.iterdir()):
        raise UserError(f"--workdir {workdir} is not empty; give a new or empty directory")
    workdir.mkdir(parents=True, exist_ok=True)
    queue = SqliteQueue(workdir / "queue.db")
    ran = False
    try:
        job = queue.submit(
            JobSpec(
                command=training_command(
                    steps=options.steps, seed=0, step_seconds=options.step_seconds, out=workdir / "weights.pt", nproc=1
                ),
                checkpoint_uri=str(workdir / "durable"),
                nodes=2,
            ),
        )
        say(
            f"offline drill: a 2-node gang of {options.steps} steps on 3 local agents ({options.instance_type} "
            f"emulated); work directory {workdir}"
        )
        env = agent_env(workdir / "home", f"sqlite:///{workdir / 'queue.db'}")
        try:
            gang = run_noticed_gang(
                queue,
                job.id,
                env,
                workdir,
                notice_after_step=options.notice_at_step,
                notice_lead=options.lead_seconds,
                exit_timeout=options.timeout,
                instance_type=options.instance_type,
                say=say,
            )
        except DrillAborted as err:  # the work directory stays for the logs: say where
            raise DrillAborted(f"{err}; queue and logs kept in {workdir}") from None
        ran = True
        final = queue.get(job.id)
        say(f"job {job.id} {final.state.value} after {final.attempt} attempt(s); agents exited {gang.codes}")
        yield DrillRun(
            queue=queue,
            job_id=job.id,
            target=TARGET,
            injected_at=gang.noticed_at,
            lead_seconds=options.lead_seconds,
            injector="imds-emulator",
            experiment=None,
        )
    finally:
        queue.close()
        if ran and not options.keep:
            shutil.rmtree(workdir, ignore_errors=True)
        elif ran:
            say(f"work directory kept: {workdir} (queue: sqlite:///{workdir / 'queue.db'})")
