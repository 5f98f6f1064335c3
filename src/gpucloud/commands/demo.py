"""``gpucloud demo``: offline end-to-end demo of a spot interruption, on real torchrun ranks."""

from __future__ import annotations

from pathlib import Path

import click

from gpucloud.output import output_option, print_json, print_table


@click.command(
    "demo",
    epilog="""\b
Examples:
  gpucloud demo
  gpucloud demo --steps 80 --notice-at-step 50 --keep --workdir /tmp/spot-demo
  gpucloud demo --output json | jq '.steps_lost, .bitwise_identical'
  gpucloud demo --device cuda                  # on a GPU host: NCCL, a GPU per rank
""",
)
@click.option("--steps", type=click.IntRange(min=2), default=40, show_default=True, help="Training steps in total.")
@click.option(
    "--notice-at-step",
    type=click.IntRange(min=1),
    default=15,
    show_default=True,
    help="Announce the spot interruption once the job reports this step.",
)
@click.option(
    "--step-seconds",
    type=click.FloatRange(min=0.0),
    default=0.1,
    show_default=True,
    help="Extra time per step, standing in for a larger model.",
)
@click.option(
    "--seed", type=int, default=0, show_default=True, help="Seed of both the interrupted and the reference run."
)
@click.option(
    "--poll-interval",
    type=click.FloatRange(min=0.05),
    default=0.25,
    show_default=True,
    help="Seconds between IMDS polls.",
)
@click.option(
    "--workdir",
    type=click.Path(file_okay=False, path_type=Path),
    help="Where to put the queue, tiers and logs (default: a temporary directory).",
)
@click.option("--keep", is_flag=True, help="Keep the work directory (checkpoints, control files, logs) afterwards.")
@click.option(
    "--device",
    type=click.Choice(["cpu", "cuda"]),
    default="cpu",
    show_default=True,
    help="Train on the CPU (2 ranks, gloo) or on GPUs (one rank per GPU, at most 2, NCCL).",
)
@output_option()
def demo(steps, notice_at_step, step_seconds, seed, poll_interval, workdir, keep, device, output) -> int:
    """Run the whole spot story offline: 2 ranks under real torchrun (gloo) train under the spot
    supervisor; an IMDS emulator announces a spot interruption mid-run; every rank saves the same
    step, the checkpoint is committed to the durable tier, the job is requeued, and attempt 2 on a
    "new node" (fresh emulator, empty local tier) restores it and finishes. The final weights are
    compared bitwise with an uninterrupted run of the same seed.

    Exits 0 when the weights are bitwise identical and at most one step was lost, 1 otherwise.
    """
    from gpucloud.offline.demo import DemoOptions, run_demo

    options = DemoOptions(
        steps=steps,
        notice_at_step=notice_at_step,
        step_seconds=step_seconds,
        seed=seed,
        poll_interval=poll_interval,
        workdir=workdir,
        keep=keep,
        device=device,
    )
    options.validate()  # before any progress is drawn: a refusal is one line
    if output == "json":
        report = run_demo(options)
        print_json(report.model_dump())
    else:
        report = _run_with_progress(options)
        _render(report)
    ok = report.bitwise_identical and report.steps_lost is not None and report.steps_lost <= 1
    return 0 if ok else 1


def _run_with_progress(options):
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from gpucloud.jobs.node import describe_event
    from gpucloud.offline.demo import run_demo

    console = Console(stderr=True)
    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
        transient=False,
    ) as bar:
        task = bar.add_task("job steps", total=options.steps)

        def on_event(kind: str, data: dict) -> None:
            if kind == "progress":
                bar.update(task, completed=data["step"])
                return
            if kind == "phase":
                bar.console.print(f"[bold]{data['text']}[/bold]")
                return
            if kind in ("resume", "ack", "commit", "finish") and isinstance(data.get("step"), int):
                bar.update(task, completed=data["step"])
            line = describe_event(kind, data)
            if line:
                bar.console.print(line)

        report = run_demo(options, progress=on_event)
        bar.update(task, completed=options.steps)
    return report


def _render(report) -> None:
    from rich.console import Console

    print_table(
        "gpucloud demo: spot notice → checkpoint → requeue → resume",
        ["measure", "value"],
        [
            ["steps lost", report.steps_lost],
            [
                "stopped at step / resumed at step",
                f"{report.stopped_at_step} / {report.resumed_at_step} (from the {report.resumed_from_tier} tier)",
            ],
            ["emulator announced → supervisor saw it (poll)", _s(report.announce_to_notice_s)],
            ["emulator announced → all ranks agreed (ack)", _s(report.announce_to_ack_s)],
            ["notice → flag written", _s(report.notice_to_flag_s)],
            ["notice → all ranks agreed (ack)", _s(report.notice_to_ack_s)],
            ["notice → checkpoint committed", _s(report.notice_to_commit_s)],
            ["committed before the deadline by", _s(report.commit_before_deadline_s)],
            ["requeue → resumed on the new node", _s(report.requeue_to_resume_s)],
            ["final weights bitwise identical to the uninterrupted run", "yes" if report.bitwise_identical else "NO"],
            ["attempts / wall time", f"{report.attempts} / {report.wall_s:.1f} s"],
        ],
    )
    if report.workdir:
        Console().print(f"work directory kept: {report.workdir}  (queue: sqlite:///{report.workdir}/queue.db)")


def _s(value) -> str:
    return "n/a" if value is None else f"{value:.3f} s"
