"""``gpucloud drill``: interrupt one spot node of a small job and judge whether the job kept the promise."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import click

from gpucloud.commands.options import chosen_stack, stack_options
from gpucloud.errors import UserError
from gpucloud.output import output_option, print_json, print_table

LOCAL_TIMEOUT_S = 600.0
CLUSTER_TIMEOUT_S = 1800.0  # a p4d node takes ~10 minutes to boot (stacks/Pulumi.p4d-spot.yaml)
# --local without --stack: the shipped stack with the drill on; offline, only its spot group's
# instance type is used (the emulated nodes say it). A cluster drill always names its stack.
LOCAL_DEFAULT_STACK = "p4d-spot"

EPILOG = """\b
Examples:
  gpucloud drill --local                                   # offline: the local fleet (stack p4d-spot), ~1 minute
  gpucloud drill --stack p4d-spot --local -o json | jq .verdict
  gpucloud drill --stack p4d-spot                          # on the deployed cluster (AWS FIS)
\b
What it proves, for one spot interruption of one node of a 2-node gang job (docs/drill.md):
  commit-within-lead  notice -> checkpoint committed before the notice's deadline
  one-step            every node acked the stop at one step, and that step was committed
  one-requeue         the job was requeued exactly once
  resumed-at-commit   the next attempt restored exactly the committed step
  steps-lost          at most one step recomputed
  job-finished        the job then ran to its end
\b
--local: three `gpucloud agent` processes on this machine share a SQLite queue, each with its own
IMDS emulator as its node; one gang member's emulator announces the interruption (what FIS makes
IMDS say on a cluster) and a standby agent takes its place. Needs a source checkout (it trains
examples/train_spot.py under torchrun, gloo, one rank per node). Without --local the drill runs on
the stack's cluster: the stack must set gpucloud:drill: true and be deployed, and AWS credentials
must be configured; it is never run offline by itself, so a CI job cannot pass it by accident.
\b
Progress goes to stderr; the verdict (table or JSON) to stdout.
Exit codes: 0 pass; 1 fail, or the drill could not run to its end (a one-line error says why);
2 bad input.
"""


@click.command("drill", epilog=EPILOG)
@stack_options()
@click.option(
    "--local", is_flag=True, help="Run offline on the local fleet (agents + IMDS emulators) instead of the cluster."
)
@click.option(
    "--steps", type=click.IntRange(min=2), default=40, show_default=True, help="Training steps of the drill job."
)
@click.option(
    "--notice-at-step",
    type=click.IntRange(min=1),
    default=2,
    show_default=True,
    help="Interrupt once the job's recorded progress shows this step (the queue stores progress with each lease "
    "renewal: early in the attempt, then every 15 s, so the notice may come some steps later).",
)
@click.option(
    "--step-seconds",
    type=click.FloatRange(min=0.0),
    default=0.5,
    show_default=True,
    help="Extra time per step, so the notice lands while the job still trains.",
)
@click.option(
    "--timeout",
    type=click.FloatRange(min=1.0),
    metavar="SECONDS",
    help=f"Give up (exit 1) when the drill has not ended after this long (default: {LOCAL_TIMEOUT_S:g} with --local, "
    f"{CLUSTER_TIMEOUT_S:g} on a cluster, where the group may first have to launch the gang's nodes).",
)
@click.option(
    "--workdir",
    type=click.Path(file_okay=False, path_type=Path),
    help="--local: where to put the queue, checkpoints and agent logs (default: a temporary directory).",
)
@click.option("--keep", is_flag=True, help="--local: keep the work directory afterwards.")
@output_option()
def drill(stack, stack_file, local, steps, notice_at_step, step_seconds, timeout, workdir, keep, output) -> int:
    """Interrupt one spot node of a small job and report pass or fail on gpucloud's promise: the
    notice is followed by a checkpoint every rank agrees on, committed within the notice's lead,
    one requeue, and a resume at that step with at most one step lost.

    On a cluster an AWS FIS experiment (the stack's template, `gpucloud:drill: true`) sends the
    interruption to one node of the drill's own job; with --local, IMDS emulators stand in for FIS.
    The same verdict code judges both.
    """
    from gpucloud.drill.run import check_steps
    from gpucloud.drill.verdict import verdict_of
    from gpucloud.spec import load_stack_file
    from gpucloud.spec.rules import drillable_groups

    if local and stack is None and stack_file is None:
        stack = LOCAL_DEFAULT_STACK
    name, path = chosen_stack(stack, stack_file)
    spec = load_stack_file(path)
    drillable = drillable_groups(spec)
    if not drillable:
        groups = ", ".join(f"{g.name} ({g.capacity.type})" for g in spec.node_groups)
        raise UserError(
            f"stack {name} has no spot node group to interrupt, with maxNodes above its onDemandBase (its groups: {groups})"
        )
    check_steps(steps, notice_at_step)  # before anything starts, on a cluster too
    if not local and (workdir is not None or keep):
        raise UserError("--workdir and --keep are for the offline drill: add --local")

    def say(line: str) -> None:
        click.echo(f"gpucloud drill: {line}", err=True)

    started = time.monotonic()
    if local:
        from gpucloud.offline.local_fleet import LocalDrillOptions, local_drill

        options = LocalDrillOptions(
            steps=steps,
            notice_at_step=notice_at_step,
            step_seconds=step_seconds,
            timeout=timeout or LOCAL_TIMEOUT_S,
            instance_type=next(g.instance_type for g in spec.node_groups if g.name == drillable[0]),
            workdir=workdir,
            keep=keep,
        )
        with local_drill(options, say=say) as run:
            result = verdict_of(run)
    else:
        result = _on_cluster(
            name,
            spec,
            group=drillable[0],
            steps=steps,
            notice_at_step=notice_at_step,
            step_seconds=step_seconds,
            timeout=timeout or CLUSTER_TIMEOUT_S,
            say=say,
        )
    wall = time.monotonic() - started
    if output == "json":
        print_json({**result.model_dump(), "stack": name, "wall_s": round(wall, 1)})
    else:
        _render(result, name, wall)
    return 0 if result.verdict == "pass" else 1


def _on_cluster(
    name: str, spec: Any, *, group: str, steps: int, notice_at_step: int, step_seconds: float, timeout: float, say
):
    """The drill on the stack's deployed cluster: ``drill/cluster.py`` submits the job, has AWS FIS
    interrupt one of its spot nodes and follows it; the DrillRun it returns is judged here."""
    if not spec.drill:
        raise UserError(
            f"stack {name} has no drill template: set `gpucloud:drill: true`, run `pulumi up`, then drill again "
            "(or add --local for the offline drill)"
        )
    import boto3

    if boto3.Session().get_credentials() is None:
        raise UserError("no AWS credentials found for the drill on the cluster; configure them, or add --local")
    from gpucloud.drill.cluster import DrillJob, run_on_cluster
    from gpucloud.drill.verdict import verdict_of
    from gpucloud.infra.automation import open_stack

    outputs = open_stack(name).outputs()
    # group: the spot group, not the stack's first group (JobSpec.group None), which may be on-demand
    job = DrillJob(steps=steps, notice_at_step=notice_at_step, step_seconds=step_seconds, group=group)
    run = run_on_cluster(stack=name, outputs=outputs, region=spec.region, job=job, progress=say, timeout_s=timeout)
    try:
        return verdict_of(run)
    finally:
        run.queue.close()


def _render(result, stack: str, wall: float) -> None:
    print_table(
        f"gpucloud drill {stack}: {result.verdict.upper()} ({result.injector} interrupted {result.target}, "
        f"job {result.job_id}, {wall:.0f} s)",
        ["check", "result", "measured"],
        [[c.name, "pass" if c.passed else "FAIL", c.detail] for c in result.checks],
    )
