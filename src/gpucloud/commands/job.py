"""``gpucloud job``: the group of commands on one job; each subcommand lives in its own module."""

from __future__ import annotations

import click

from gpucloud.commands.job_control import cancel, resume
from gpucloud.commands.job_logs import logs
from gpucloud.commands.job_show import show


@click.group("job")
def job() -> None:
    """Inspect or control one job: show, logs, cancel, resume."""


for _command in (cancel, show, logs, resume):
    job.add_command(_command)
