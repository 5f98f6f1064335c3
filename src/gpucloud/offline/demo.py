"""``gpucloud demo``: the whole spot story offline, on real torchrun ranks, in under a minute.

Node A (an IMDS emulator, a fresh local tier) runs attempt 1 of a 2-rank gloo job under the
supervisor; when the job passes ``notice_at_step`` the emulator announces a spot interruption, the
ranks agree on a step, save it, commit it to the durable tier, and the job is requeued. Node B (a
new emulator, an empty local tier) claims attempt 2, restores from the durable tier and finishes.
Meanwhile the same seed trains uninterrupted as a reference; the final weights must be bitwise
identical.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import re
import shutil
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any

from pydantic import BaseModel

from gpucloud.cost.timeline import JobTimeline, build_timeline
from gpucloud.drill.run import EXAMPLE, check_steps
from gpucloud.errors import UserError
from gpucloud.jobs.runner import supervise_job
from gpucloud.jobs.supervisor import SupervisorConfig
from gpucloud.lifecycle.model import JobSpec
from gpucloud.offline.imds_emulator import ImdsEmulator
from gpucloud.queue.protocol import JobQueue
from gpucloud.queue.sqlite import SqliteQueue
from gpucloud.signals.hub import SignalHub

NPROC = 2


@dataclasses.dataclass(frozen=True)
class DemoOptions:
    steps: int = 40
    notice_at_step: int = 15
    step_seconds: float = 0.1
    seed: int = 0
    poll_interval: float = 0.25
    workdir: Path | None = None
    keep: bool = False
    device: str = "cpu"

    def validate(self) -> None:
        check_steps(self.steps, self.notice_at_step)
        ranks_for(self.device)

    @property
    def nproc(self) -> int:
        return ranks_for(self.device)


def ranks_for(device: str) -> int:
    """Ranks per run: 2 on the CPU (gloo); on CUDA one per GPU, at most 2 (NCCL allows one rank per GPU)."""
    if device == "cpu":
        return NPROC
    if device != "cuda":
        raise UserError(f"--device must be cpu or cuda, got {device!r}")
    import torch

    if not torch.cuda.is_available():
        raise UserError(
            f"--device cuda: no CUDA device is visible to this Python (torch {torch.__version__}); "
            "run on a GPU host with a CUDA build of torch, or use --device cpu"
        )
    return min(NPROC, torch.cuda.device_count())


class DemoReport(BaseModel):
    job_id: str
    reference_job_id: str
    steps: int
    notice_at_step: int
    device: str  # cpu (gloo ranks) or cuda (NCCL, a GPU per rank)
    stopped_at_step: int | None
    resumed_at_step: int | None
    resumed_from_tier: str | None
    steps_lost: int | None
    announce_to_notice_s: float | None  # emulator announced -> the poller saw it (≤ poll interval)
    announce_to_ack_s: float | None  # emulator announced -> every rank agreed (≤ poll interval + a step)
    notice_to_flag_s: float | None
    notice_to_ack_s: float | None  # every rank agreed on the stop step
    notice_to_commit_s: float | None
    commit_before_deadline_s: float | None
    requeue_to_resume_s: float | None
    bitwise_identical: bool
    attempts: int
    wall_s: float
    workdir: str | None  # kept with --keep
    job: JobTimeline


Progress = Callable[[str, dict[str, Any]], None]


def training_command(
    *,
    steps: int,
    seed: int,
    step_seconds: float,
    out: Path,
    every_steps: int | None = None,
    log_steps: bool = False,
    nproc: int = NPROC,
    device: str = "cpu",
) -> list[str]:
    """Real torchrun (``python -m torch.distributed.run``), ``nproc`` ranks (default 2), single node (an
    agent extends it to the gang's nodes): gloo on the CPU, NCCL with one GPU per rank on ``cuda``."""
    if not EXAMPLE.exists():
        raise UserError(
            f"the demo needs the example training script {EXAMPLE}; run gpucloud demo from a source checkout"
        )
    argv = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc-per-node={nproc}",
        str(EXAMPLE),
        "--steps",
        str(steps),
        "--seed",
        str(seed),
        "--step-seconds",
        str(step_seconds),
        "--out",
        str(out),
    ]
    if every_steps:
        argv += ["--every-steps", str(every_steps)]
    if log_steps:
        argv.append("--log-steps")
    if device != "cpu":
        argv += ["--device", device]
    return argv


def weights_identical(a: Path, b: Path) -> bool:
    """Bitwise comparison of two saved state dicts (byte views: -0.0 != 0.0, NaN == same NaN)."""
    import torch

    left = torch.load(a, map_location="cpu", weights_only=True)
    right = torch.load(b, map_location="cpu", weights_only=True)
    if left.keys() != right.keys():
        return False
    for key in left:
        x, y = left[key], right[key]
        if x.dtype != y.dtype or x.shape != y.shape:
            return False
        if not torch.equal(x.contiguous().view(torch.uint8), y.contiguous().view(torch.uint8)):
            return False
    return True


def run_demo(options: DemoOptions, *, progress: Progress | None = None) -> DemoReport:
    options.validate()
    began = time.time()
    workdir = Path(options.workdir) if options.workdir else Path(tempfile.mkdtemp(prefix="gpucloud-demo-"))
    if options.workdir and workdir.exists() and any(workdir.iterdir()):
        raise UserError(f"--workdir {workdir} is not empty; give a new or empty directory")
    workdir.mkdir(parents=True, exist_ok=True)
    say = progress or (lambda kind, data: None)
    config = SupervisorConfig(ack_timeout=30.0, stop_margin=5.0)
    queue = SqliteQueue(workdir / "queue.db")
    succeeded = False
    try:
        suffix = uuid.uuid4().hex[:6]
        durable = workdir / "durable"
        job = queue.submit(_spec(options, durable, workdir / "interrupted.pt", name="demo"), job_id=f"demo-{suffix}")
        ref = queue.submit(
            _spec(options, durable, workdir / "reference.pt", name="demo-reference"), job_id=f"demo-ref-{suffix}"
        )
        for line in opening_lines(job.id, ref.id, options.steps, nproc=options.nproc, device=options.device):
            say("phase", {"text": line})

        reference_error: list[BaseException] = []
        reference = threading.Thread(
            target=_run_reference,
            args=(queue.path, ref.id, workdir, config, reference_error),
            daemon=True,
        )
        reference.start()

        # Node A: attempt 1, interrupted by a spot notice from its emulator.
        with ImdsEmulator() as emulator_a, imds_hub(emulator_a.endpoint, options.poll_interval) as hub_a:
            injector = SpotInjector(emulator_a, options.notice_at_step, say=say)
            first = _attempt(queue, job.id, hub_a, config, workdir / "node-a", on_step=injector, say=say)
        if first.exit_code != 75:
            raise UserError(
                f"attempt 1 ended with exit code {first.exit_code}, expected 75 (requeued); logs in {workdir / 'logs'}"
            )

        # Node B: attempt 2 on a "new node": fresh emulator, empty local tier, restore from durable.
        with ImdsEmulator() as emulator_b, imds_hub(emulator_b.endpoint, options.poll_interval) as hub_b:
            second = _attempt(
                queue,
                job.id,
                hub_b,
                config,
                workdir / "node-b",
                on_step=lambda step: say("progress", {"step": step}),
                say=say,
            )
        if second.exit_code != 0:
            raise UserError(f"attempt 2 ended with exit code {second.exit_code}; logs in {workdir / 'logs'}")

        reference.join()
        if reference_error:
            raise reference_error[0]
        identical = weights_identical(workdir / "interrupted.pt", workdir / "reference.pt")
        events = queue.events(job.id)
        job_report = build_timeline(queue.get(job.id), queue.attempts(job.id), events)
        succeeded = True
    finally:
        queue.close()
        if succeeded and not options.keep:  # on a failure the logs named in the error stay
            shutil.rmtree(workdir, ignore_errors=True)
    stop = job_report.interruptions[0] if job_report.interruptions else None
    resumed = next((e for e in events if e.kind == "resume" and e.attempt == 2), None)
    notice_at = next((e.at for e in events if e.kind == "notice" and e.attempt == 1), None)
    ack_at = next((e.at for e in events if e.kind == "ack" and e.attempt == 1), None)
    t0 = injector.announced_at
    return DemoReport(
        job_id=job.id,
        reference_job_id=ref.id,
        steps=options.steps,
        notice_at_step=options.notice_at_step,
        device=options.device,
        stopped_at_step=stop.last_step if stop else None,
        resumed_at_step=stop.resumed_step if stop else None,
        resumed_from_tier=resumed.data.get("source_tier") if resumed else None,
        steps_lost=job_report.steps_lost,
        announce_to_notice_s=round(notice_at - t0, 3) if t0 is not None and notice_at is not None else None,
        announce_to_ack_s=round(ack_at - t0, 3) if t0 is not None and ack_at is not None else None,
        notice_to_flag_s=stop.notice_to_flag_s if stop else None,
        notice_to_ack_s=stop.notice_to_ack_s if stop else None,
        notice_to_commit_s=stop.notice_to_commit_s if stop else None,
        commit_before_deadline_s=stop.commit_before_deadline_s if stop else None,
        requeue_to_resume_s=stop.requeue_to_resume_s if stop else None,
        bitwise_identical=identical,
        attempts=len(job_report.attempts),
        wall_s=round(time.time() - began, 2),
        workdir=str(workdir) if options.keep else None,
        job=job_report,
    )


def opening_lines(job_id: str, reference_id: str, steps: int, *, nproc: int = NPROC, device: str = "cpu") -> list[str]:
    """What the demo says first, one short line each: a terminal of 80 columns must not wrap them."""
    backend = "gloo" if device == "cpu" else "NCCL"
    return [
        f"job {job_id}: {nproc} ranks under torchrun ({backend}), {steps} steps",
        f"reference {reference_id}: the same seed, never interrupted, runs alongside",
    ]


def _spec(options: DemoOptions, durable: Path, out: Path, *, name: str) -> JobSpec:
    command = training_command(
        steps=options.steps,
        seed=options.seed,
        step_seconds=options.step_seconds,
        out=out,
        log_steps=True,
        nproc=options.nproc,
        device=options.device,
    )
    return JobSpec(command=command, name=name, checkpoint_uri=str(durable), max_attempts=1)


@contextlib.contextmanager
def imds_hub(endpoint: str, interval: float) -> Iterator[SignalHub]:
    """A started SignalHub watching one emulator (one "node")."""
    hub = SignalHub()
    hub.add_imds(endpoint, interval=interval)
    hub.start()
    try:
        yield hub
    finally:
        hub.stop()


def _attempt(
    queue: JobQueue,
    job_id: str,
    hub: SignalHub,
    config: SupervisorConfig,
    node: Path,
    *,
    on_step: Callable[[int], None],
    say: Progress,
):
    logs = node.parent / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    with open(logs / f"{job_id}-{node.name}.log", "w") as log:
        return supervise_job(
            queue,
            job_id,
            worker=f"{node.name}",
            notices=hub,
            config=config,
            local_checkpoint_dir=str(node / "nvme"),
            sink=StepTap(log, on_step),
            on_event=say,
            run_root=node / "run",
            log_root=logs,  # the attempts' logs too: nothing of the demo outlives it without --keep
        )


def _run_reference(db: Path, job_id: str, workdir: Path, config: SupervisorConfig, errors: list[BaseException]) -> None:
    queue = SqliteQueue(db)  # its own connection: this runs on another thread
    try:
        idle = SignalHub()  # no sources: the reference run is never interrupted
        node = workdir / "node-ref"
        logs = workdir / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        with open(logs / f"{job_id}.log", "w") as sink:
            result = supervise_job(
                queue,
                job_id,
                worker="node-ref",
                notices=idle,
                config=config,
                local_checkpoint_dir=str(node / "nvme"),
                sink=sink,
                run_root=node / "run",
                log_root=logs,
            )
        if result.exit_code != 0:
            raise UserError(f"the reference run failed with exit code {result.exit_code}; logs in {logs}")
    except BaseException as err:  # noqa: BLE001 - handed to the main thread
        errors.append(err)
    finally:
        queue.close()


class StepTap(io.TextIOBase):
    """A sink for the command's output: writes through to ``log`` and reports every ``step N`` line
    the example prints with ``--log-steps`` (exact to the step, unlike the rate-limited progress file)."""

    _STEP = re.compile(r"^step (\d+)\b")

    def __init__(self, log: IO[str], on_step: Callable[[int], None]) -> None:
        super().__init__()
        self.log = log
        self.on_step = on_step
        self.first_step: int | None = None
        self.first_step_at: float | None = None
        self.last_step: int | None = None
        self.last_step_at: float | None = None

    def writable(self) -> bool:
        return True

    def write(self, text: str) -> int:
        self.log.write(text)
        for line in text.splitlines():
            match = self._STEP.match(line)
            if match:
                self.last_step, self.last_step_at = int(match.group(1)), time.time()
                if self.first_step is None:
                    self.first_step, self.first_step_at = self.last_step, self.last_step_at
                self.on_step(self.last_step)
        return len(text)

    def flush(self) -> None:
        self.log.flush()

    @property
    def seconds_per_step(self) -> float | None:
        if self.first_step is None or self.last_step is None or self.last_step <= self.first_step:
            return None
        if self.first_step_at is None or self.last_step_at is None:
            return None
        return (self.last_step_at - self.first_step_at) / (self.last_step - self.first_step)


class SpotInjector:
    """Announces a spot interruption on ``emulator`` once the job reports ``at_step``."""

    def __init__(
        self, emulator: ImdsEmulator, at_step: int, *, lead_seconds: float = 120.0, say: Progress | None = None
    ) -> None:
        self.emulator = emulator
        self.at_step = at_step
        self.lead_seconds = lead_seconds
        self.say = say or (lambda kind, data: None)
        self.announced_at: float | None = None
        self.announced_step: int | None = None

    def __call__(self, step: int) -> None:
        self.say("progress", {"step": step})
        if self.announced_at is None and step >= self.at_step:
            self.announced_at, self.announced_step = time.time(), step
            self.emulator.spot_interruption("terminate", lead_seconds=self.lead_seconds, at=self.announced_at)
            self.say(
                "phase",
                {
                    "text": f"emulator: spot interruption announced after step {step} "
                    f"(terminate in {self.lead_seconds:.0f} s)"
                },
            )
