"""Spot-notice handling end to end, beside a periodic-only baseline, in one run.

    .venv/bin/python benchmarks/bench_spot_train.py [--positions 12 25 38] [--every-steps 10]
        [--step-seconds 0.1] [--lead-seconds 3] [--poll-interval 1.0]

For every notice position (a step), two jobs of the example (2 ranks, real torchrun, gloo, periodic
checkpoints every ``--every-steps`` steps in both):

* **notice-driven** (gpucloud): attempt 1 runs under the supervisor with an IMDS emulator; after the
  position's step the emulator announces a spot interruption ``--lead-seconds`` ahead; the ranks
  agree on a step, save, commit; the job is requeued; attempt 2 (fresh emulator, empty local tier)
  resumes and finishes. Measured: announce→notice seen, announce→all ranks flagged (the ack),
  notice→committed, requeue→resumed, steps lost.
* **periodic-only baseline** (what SkyPilot and dstack rely on): the same job, no notice handling;
  the node dies (SIGKILL) at the notice deadline; it restarts from the last periodic checkpoint.
  Steps lost = the last step it completed − that checkpoint.

Goals: announce→all ranks flagged ≤ poll interval + one step; steps lost ≤ 1.
Writes benchmarks/results/spot_train.json.
"""

from __future__ import annotations

import argparse
import logging
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path

from gpucloud.checkpoint.store import latest_committed
from gpucloud.cost.timeline import build_timeline
from gpucloud.jobs.process_group import ProcessGroup
from gpucloud.jobs.runner import attempt_environment, supervise_job
from gpucloud.jobs.supervisor import SupervisorConfig
from gpucloud.lifecycle.model import JobSpec
from gpucloud.offline.demo import SpotInjector, StepTap, imds_hub, training_command
from gpucloud.offline.imds_emulator import ImdsEmulator
from gpucloud.queue.sqlite import SqliteQueue
from report import config_of, finish  # benchmarks/report.py

RESULTS = Path(__file__).resolve().parent / "results" / "spot_train.json"
TAIL_STEPS = 45  # steps after the notice position: the baseline must still be training at the deadline


def notice_driven(queue: SqliteQueue, work: Path, position: int, args: argparse.Namespace) -> dict:
    job = queue.submit(_spec(work, position, args, "notice"), job_id=f"notice-{position}")
    config = SupervisorConfig(stop_margin=0.5, exit_grace=5.0)
    with ImdsEmulator() as emulator, imds_hub(emulator.endpoint, args.poll_interval) as hub:
        injector = SpotInjector(emulator, position, lead_seconds=args.lead_seconds)
        with open(work / f"{job.id}-1.log", "w") as log:
            tap = StepTap(log, injector)
            first = supervise_job(
                queue,
                job.id,
                worker="node-a",
                notices=hub,
                config=config,
                sink=tap,
                local_checkpoint_dir=str(work / job.id / "node-a"),
                run_root=work / "run-a",
            )
    if first.exit_code != 75:
        raise RuntimeError(f"{job.id}: attempt 1 exited {first.exit_code}, expected 75; see {work}")
    with (
        ImdsEmulator() as emulator,
        imds_hub(emulator.endpoint, args.poll_interval) as hub,
        open(work / f"{job.id}-2.log", "w") as log,
    ):
        second = supervise_job(
            queue,
            job.id,
            worker="node-b",
            notices=hub,
            config=config,
            sink=StepTap(log, lambda step: None),
            local_checkpoint_dir=str(work / job.id / "node-b"),
            run_root=work / "run-b",
        )
    if second.exit_code != 0:
        raise RuntimeError(f"{job.id}: attempt 2 exited {second.exit_code}; see {work}")
    events = queue.events(job.id)
    report = build_timeline(queue.get(job.id), queue.attempts(job.id), events)
    (stop,) = report.interruptions
    ack = next(e.at for e in events if e.kind == "ack")
    seen = next(e.at for e in events if e.kind == "notice")
    return {
        "position": position,
        "announced_after_step": injector.announced_step,
        "stopped_at_step": stop.last_step,
        "resumed_at_step": stop.resumed_step,
        "steps_lost": stop.steps_lost,
        "seconds_per_step": round(tap.seconds_per_step or 0.0, 4),
        "announce_to_notice_s": round(seen - injector.announced_at, 4),
        "announce_to_all_ranks_flagged_s": round(ack - injector.announced_at, 4),
        "notice_to_committed_s": stop.notice_to_commit_s,
        "commit_before_deadline_s": stop.commit_before_deadline_s,
        "requeue_to_resumed_s": stop.requeue_to_resume_s,
        "signals_needed": stop.stopped_with,
    }


def periodic_only(queue: SqliteQueue, work: Path, position: int, args: argparse.Namespace) -> dict:
    job = queue.submit(_spec(work, position, args, "baseline"), job_id=f"baseline-{position}")
    job = queue.claim("baseline", lease_seconds=3600, job_id=job.id)
    noticed: list[float] = []

    def on_step(step: int) -> None:
        if not noticed and step >= position:
            noticed.append(time.time())  # the notice arrives; the baseline ignores it

    control_dir = work / "run-baseline" / job.id
    env = attempt_environment(job, control_dir=control_dir, local_dir=str(work / job.id / "node-a"))
    with open(work / f"{job.id}.log", "w") as log:
        tap = StepTap(log, on_step)
        group = ProcessGroup(job.spec.command, env=env, sink=tap)
        while group.poll() is None:
            if noticed and time.time() >= noticed[0] + args.lead_seconds:
                group.send(signal.SIGKILL)  # the deadline: the instance is gone, no grace
                break
            time.sleep(0.01)  # waiting on a deadline, not on another thread
        exit_code = group.wait()
    if exit_code == 0:
        raise RuntimeError(f"{job.id} finished before the deadline; raise TAIL_STEPS or lower --lead-seconds")
    resumes_from = latest_committed(job.spec.checkpoint_uri, job.id) or 0
    return {
        "position": position,
        "killed_after_step": tap.last_step,
        "restarts_from_step": resumes_from,
        "steps_lost": (tap.last_step or 0) - resumes_from,
    }


def _spec(work: Path, position: int, args: argparse.Namespace, kind: str) -> JobSpec:
    command = training_command(
        steps=position + TAIL_STEPS,
        seed=position,
        step_seconds=args.step_seconds,
        out=work / f"{kind}-{position}.pt",
        every_steps=args.every_steps,
        log_steps=True,
    )
    return JobSpec(command=command, checkpoint_uri=str(work / "durable"), max_attempts=1)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--positions", type=int, nargs="+", default=[12, 25, 38], help="notice positions (steps)")
    parser.add_argument("--every-steps", type=int, default=10, help="periodic checkpoint interval of both paths")
    parser.add_argument("--step-seconds", type=float, default=0.1, help="extra time per step (a larger model)")
    parser.add_argument("--lead-seconds", type=float, default=3.0, help="notice → deadline")
    parser.add_argument("--poll-interval", type=float, default=1.0, help="IMDS poll interval (spot-train's default)")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.ERROR)

    rows_notice, rows_base = [], []
    with tempfile.TemporaryDirectory(prefix="bench-spot-train-") as tmp:
        work = Path(tmp)
        queue = SqliteQueue(work / "queue.db")
        for position in args.positions:
            print(f"position {position}: notice-driven ...", file=sys.stderr, flush=True)
            rows_notice.append(notice_driven(queue, work, position, args))
            print(f"position {position}: periodic-only baseline ...", file=sys.stderr, flush=True)
            rows_base.append(periodic_only(queue, work, position, args))
        queue.close()

    step_s = statistics.mean(r["seconds_per_step"] for r in rows_notice)
    flag_goal = args.poll_interval + step_s
    lost_notice = [r["steps_lost"] for r in rows_notice]
    lost_base = [r["steps_lost"] for r in rows_base]
    summary = {
        "seconds_per_step_mean": round(step_s, 4),
        "announce_to_all_ranks_flagged_s_max": max(r["announce_to_all_ranks_flagged_s"] for r in rows_notice),
        "announce_to_all_ranks_flagged_goal_s": round(flag_goal, 4),
        "notice_to_committed_s_max": max(r["notice_to_committed_s"] for r in rows_notice),
        "requeue_to_resumed_s_mean": round(statistics.mean(r["requeue_to_resumed_s"] for r in rows_notice), 3),
        "steps_lost_notice_max": max(lost_notice),
        "steps_lost_notice_mean": round(statistics.mean(lost_notice), 3),
        "steps_lost_baseline_mean": round(statistics.mean(lost_base), 3),
        "steps_lost_baseline_max": max(lost_base),
        "steps_lost_ratio_notice_vs_baseline": round(statistics.mean(lost_notice) / statistics.mean(lost_base), 4)
        if statistics.mean(lost_base)
        else None,
    }
    goals = {
        "all_ranks_flagged_within_poll_interval_plus_one_step": summary["announce_to_all_ranks_flagged_s_max"]
        <= flag_goal,
        "steps_lost_at_most_one": summary["steps_lost_notice_max"] <= 1,
    }
    report = {
        "benchmark": "spot_train",
        "config": config_of(args, ranks=2, backend="gloo"),
        "notice_driven": rows_notice,
        "periodic_only_baseline": rows_base,
        "summary": summary,
        "goals_met": goals,
    }
    return finish(args.out, report)


if __name__ == "__main__":
    sys.exit(main())
