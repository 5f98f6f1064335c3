"""The ``gpucloud`` command line.

Thin by design: this module only knows the command names and where each lives. Commands are
imported lazily (``gpucloud --help`` must not import pulumi, boto3 or torch), and every
``UserError`` becomes a one-line message with a non-zero exit code instead of a traceback.
"""

from __future__ import annotations

import importlib
import sys

import click

from gpucloud import __version__
from gpucloud.errors import UserError

# command name -> ("module", "attribute", "one-line help shown by `gpucloud --help`")
COMMANDS: dict[str, tuple[str, str, str]] = {
    "plan": ("gpucloud.commands.plan", "plan", "Preview a stack offline: resources, EFA layout, hourly cost."),
    "estimate": (
        "gpucloud.commands.estimate",
        "estimate",
        "Goodput and cost per useful GPU-hour: periodic checkpoints vs the notice-driven save.",
    ),
    "report": (
        "gpucloud.commands.report",
        "report",
        "Training-efficiency report: cost, utilisation, interruptions and waste per job and node group.",
    ),
    "catalog": ("gpucloud.commands.catalog", "catalog", "Show or refresh the GPU instance catalog."),
    "sweep": (
        "gpucloud.commands.sweep",
        "sweep",
        "Find (and with --delete, delete) resources gpucloud stacks left in a region.",
    ),
    "teardown": (
        "gpucloud.commands.teardown",
        "teardown",
        "Drain a stack's jobs, destroy it (Pulumi Automation API) and name what is left; for CI.",
    ),
    "spot-train": (
        "gpucloud.commands.spot_train",
        "spot_train",
        "Run a training command that survives spot interruptions.",
    ),
    "submit": ("gpucloud.commands.submit", "submit", "Queue a training job."),
    "jobs": ("gpucloud.commands.jobs", "jobs", "List jobs in the queue."),
    "job": ("gpucloud.commands.job", "job", "One job: show (timeline, steps lost), logs, cancel, resume."),
    "worker": ("gpucloud.commands.worker", "worker", "Take queued jobs and run them under spot-train."),
    "agent": (
        "gpucloud.commands.agent",
        "agent",
        "Run the node agent: claim gang slots, run jobs, keep the ASG informed.",
    ),
    "nodes": ("gpucloud.commands.nodes", "nodes", "List node agents: state, instance type, spot/on-demand, job."),
    "demo": ("gpucloud.commands.demo", "demo", "Offline end-to-end demo: spot notice, checkpoint, requeue, resume."),
    "drill": (
        "gpucloud.commands.drill",
        "drill",
        "Interrupt a spot node of a small job (AWS FIS, or --local) and judge: pass or fail.",
    ),
    "imds-emulator": (
        "gpucloud.commands.imds_emulator",
        "imds_emulator",
        "Serve an EC2 metadata emulator that can inject spot notices.",
    ),
    "image": ("gpucloud.commands.image", "image", "Check the pinned GPU image version matrix."),
    "doctor": ("gpucloud.commands.doctor", "doctor", "Check this node: GPUs, EFA, drivers, mounts, IMDS, agent."),
    "monitoring": (
        "gpucloud.commands.monitoring",
        "monitoring",
        "Render the stack's monitoring files: Prometheus, alerts, Alertmanager, dashboards.",
    ),
}


class LazyGroup(click.Group):
    """A click group whose subcommands are imported only when they are run (or their help shown)."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(name for name, (mod, _, _) in COMMANDS.items() if _module_exists(mod))

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        entry = COMMANDS.get(cmd_name)
        if entry is None or not _module_exists(entry[0]):
            return None
        module = importlib.import_module(entry[0])
        return getattr(module, entry[1])

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        rows = [(name, COMMANDS[name][2]) for name in self.list_commands(ctx)]
        if rows:
            with formatter.section("Commands"):
                formatter.write_dl(rows)


def _module_exists(module: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(module) is not None


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(__version__, prog_name="gpucloud")
def cli() -> None:
    """gpucloud: GPU training clusters on AWS as code, and training that survives spot interruptions.

    \b
    Platform teams:  gpucloud plan --stack p5-capacity-block     (offline preview, no credentials)
    Researchers:     gpucloud spot-train -- torchrun ... train.py
                     gpucloud demo                              (offline end-to-end demo)
    """


def main(argv: list[str] | None = None) -> None:
    try:
        rv = cli.main(args=argv, prog_name="gpucloud", standalone_mode=False)
        if isinstance(rv, int) and not isinstance(rv, bool):
            sys.exit(rv)  # ctx.exit(n) in standalone_mode=False comes back as a return value
    except UserError as err:
        click.echo(f"gpucloud: error: {err}", err=True)
        sys.exit(err.exit_code)
    except click.exceptions.Abort:
        click.echo("gpucloud: aborted", err=True)
        sys.exit(130)
    except click.exceptions.NoArgsIsHelpError as err:  # `gpucloud job` alone: the help, as click shows it
        err.show()
        sys.exit(err.exit_code)
    except click.ClickException as err:  # a usage error (bad flag, value or command) reads like a UserError
        click.echo(f"gpucloud: error: {click_error_line(err)}", err=True)
        sys.exit(err.exit_code)
    except click.exceptions.Exit as err:
        sys.exit(err.exit_code)


def click_error_line(err: click.ClickException) -> str:
    """Click's message on one line, with where to read more (click prints a usage block instead)."""
    message = " ".join(err.format_message().split()).rstrip(".")
    ctx = getattr(err, "ctx", None)
    return f"{message} (see `{ctx.command_path} --help`)" if ctx is not None else message


if __name__ == "__main__":  # pragma: no cover
    main()
