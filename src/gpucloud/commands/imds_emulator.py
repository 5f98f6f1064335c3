"""``gpucloud imds-emulator``: serve an IMDSv2 emulator that can inject interruption notices."""

from __future__ import annotations

import contextlib
import errno
import signal
import sys
import threading
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import click

from gpucloud.errors import UserError
from gpucloud.output import output_option, print_json

if TYPE_CHECKING:  # the module itself is imported only when the command runs
    from gpucloud.offline.imds_emulator import ImdsEmulator


def _seconds(value: float | None, flag: str) -> float | None:
    if value is not None and value < 0:
        raise UserError(f"{flag} {value:g} is negative; give seconds >= 0 from the emulator's start")
    return value


@click.command("imds-emulator", context_settings={"max_content_width": 100})
@click.option(
    "--host",
    default="127.0.0.1",
    show_default=True,
    help="Address to listen on (keep 127.0.0.1 unless other hosts must reach it).",
)
@click.option(
    "--port",
    type=click.IntRange(0, 65535),
    default=1338,
    show_default=True,
    help="Port (1338 like AEMM; 0 picks a free one).",
)
@click.option(
    "--spot-notice-after",
    type=float,
    metavar="SECONDS",
    help="Serve a spot interruption notice this many seconds after start.",
)
@click.option(
    "--action",
    type=click.Choice(["terminate", "stop", "hibernate"]),
    default="terminate",
    show_default=True,
    help="The notice's action.",
)
@click.option(
    "--lead",
    type=float,
    default=120.0,
    show_default=True,
    metavar="SECONDS",
    help="Seconds from the notice to the interruption time it names (ignored for hibernate: no lead).",
)
@click.option("--hibernate", is_flag=True, help="Shorthand for --action hibernate.")
@click.option(
    "--rebalance-after",
    type=float,
    metavar="SECONDS",
    help="Serve a rebalance recommendation this many seconds after start (equal to --spot-notice-after: together with it).",
)
@click.option(
    "--lifecycle-terminated-after",
    type=float,
    metavar="SECONDS",
    help="Target lifecycle state InService from start, Terminated after this many seconds.",
)
@click.option(
    "--scheduled-event",
    "scheduled_event",
    type=click.Choice(
        ["instance-stop", "instance-retirement", "instance-reboot", "system-reboot", "system-maintenance"]
    ),
    help="Serve one active scheduled event with this code.",
)
@click.option(
    "--scheduled-in",
    type=float,
    default=3600.0,
    show_default=True,
    metavar="SECONDS",
    help="NotBefore of --scheduled-event, in seconds from start.",
)
@click.option(
    "--stale-termination-time",
    type=float,
    metavar="SECONDS_AGO",
    help="Serve a spot/termination-time this far in the past (a termination that failed).",
)
@click.option(
    "--token-max-ttl",
    type=click.IntRange(1, 21600),
    default=21600,
    show_default=True,
    help="Grant tokens at most this TTL (short values exercise token refresh).",
)
@click.option(
    "--allow-v1",
    is_flag=True,
    help="Answer tokenless GETs (HttpTokens=optional). Default: IMDSv2 only, as on v2.0 AMIs.",
)
@click.option(
    "--fail-tokens",
    type=click.IntRange(0),
    default=0,
    metavar="N",
    help="Fault: the first N metadata GETs answer 401 (token rejected).",
)
@click.option(
    "--fail-status",
    type=click.IntRange(400, 599),
    default=500,
    show_default=True,
    help="Fault: the HTTP status for --fail-count.",
)
@click.option(
    "--fail-count",
    type=click.IntRange(0),
    default=0,
    metavar="N",
    help="Fault: the first N metadata GETs answer --fail-status.",
)
@click.option(
    "--hang-token",
    type=float,
    metavar="SECONDS",
    help="Fault: token PUTs stall this long (the container hop-limit failure).",
)
@click.option(
    "--hang-count",
    type=click.IntRange(1),
    default=1000000,
    show_default=False,
    metavar="N",
    help="How many token PUTs --hang-token stalls [default: all].",
)
@click.option(
    "--malformed",
    type=click.IntRange(0),
    default=0,
    metavar="N",
    help="Fault: the first N metadata GETs answer a truncated JSON body.",
)
@output_option()
def imds_emulator(
    host: str,
    port: int,
    spot_notice_after: float | None,
    action: str,
    lead: float,
    hibernate: bool,
    rebalance_after: float | None,
    lifecycle_terminated_after: float | None,
    scheduled_event: str | None,
    scheduled_in: float,
    stale_termination_time: float | None,
    token_max_ttl: int,
    allow_v1: bool,
    fail_tokens: int,
    fail_status: int,
    fail_count: int,
    hang_token: float | None,
    hang_count: int,
    malformed: int,
    output: str,
) -> None:
    """Serve an EC2 instance metadata service (IMDSv2) emulator until Ctrl-C.

    It answers like IMDS (token PUT with TTL, 401 for a bad token, 404 for an item that is not
    there, [] for no scheduled events, text/plain) and injects interruption notices on a schedule,
    so `gpucloud spot-train` (or any IMDS client, botocore included) can be tested offline.

    \b
    Examples:
      gpucloud imds-emulator --spot-notice-after 30                 # notice 30 s in, for 120 s later
      gpucloud imds-emulator --spot-notice-after 10 --hibernate     # hibernate: no lead at all
      gpucloud imds-emulator --spot-notice-after 20 --rebalance-after 5
      gpucloud imds-emulator --lifecycle-terminated-after 15        # ASG scale-in
      gpucloud imds-emulator --hang-token 5                         # hop-limit failure

    \b
    Then, in another shell:
      export AWS_EC2_METADATA_SERVICE_ENDPOINT=http://127.0.0.1:1338
      gpucloud spot-train -- python train.py

    Another process can change the scenario while it runs, e.g.
    `curl -X POST -d '{"after": 5}' $AWS_EC2_METADATA_SERVICE_ENDPOINT/gpucloud/emulator/spot-interruption`
    (see docs/signals.md for the control API), or from Python with
    gpucloud.offline.emulator_control.EmulatorControl.
    """
    from gpucloud.offline.imds_emulator import ImdsEmulator

    for value, flag in (
        (spot_notice_after, "--spot-notice-after"),
        (rebalance_after, "--rebalance-after"),
        (lifecycle_terminated_after, "--lifecycle-terminated-after"),
        (stale_termination_time, "--stale-termination-time"),
        (hang_token, "--hang-token"),
        (lead, "--lead"),
    ):
        _seconds(value, flag)
    if hibernate:
        if action not in ("terminate", "hibernate"):
            raise UserError(f"--hibernate conflicts with --action {action}; give one of them")
        action = "hibernate"
    if spot_notice_after is None and (hibernate or action != "terminate"):
        raise UserError("--action/--hibernate only shape a notice; add --spot-notice-after SECONDS to serve one")

    emulator = ImdsEmulator(host, port, token_max_ttl=token_max_ttl, require_token=not allow_v1)
    try:
        endpoint = emulator.start()
    except OSError as err:
        if err.errno == errno.EADDRINUSE:
            raise UserError(
                f"port {port} on {host} is already in use; pick another with --port (0 picks a free one)"
            ) from None
        raise UserError(f"cannot listen on {host}:{port}: {err.strerror or err}") from None
    # From here on Ctrl-C and SIGTERM stop the emulator cleanly, even one that arrives while the
    # start lines are printed (a script may stop us the moment it has read them).
    with _stopped_by_signals(emulator) as stop:
        started = emulator.clock()
        schedule = _apply_schedule(
            emulator,
            started,
            spot_notice_after,
            action,
            lead,
            rebalance_after,
            lifecycle_terminated_after,
            scheduled_event,
            scheduled_in,
            stale_termination_time,
        )
        if fail_tokens:
            emulator.fail_tokens(fail_tokens)
        if fail_count:
            emulator.fail_with(fail_status, fail_count)
        if hang_token is not None:
            emulator.hang(hang_token, hang_count, target="token")
        if malformed:
            emulator.malformed(malformed)

        export = f"export AWS_EC2_METADATA_SERVICE_ENDPOINT={endpoint}"
        if output == "json":
            print_json(
                {
                    "endpoint": endpoint,
                    "export": export,
                    "started_at": started,
                    "schedule": schedule,
                    "control": f"{endpoint}/gpucloud/emulator/",
                }
            )
            sys.stdout.flush()  # a parent process reads this line while we keep running
        else:
            click.echo(f"IMDS emulator listening on {endpoint} (IMDSv2{'' if allow_v1 else ' only'}; Ctrl-C to stop)")
            click.echo(export)
            for line in schedule:
                click.echo(f"  at +{line['after']:g}s: {line['what']}")
        # Short waits: a signal the kernel hands to one of the server's threads only marks the
        # handler as pending, and the main thread runs it when it next wakes. A long wait here
        # slept through Ctrl-C (2 of 15 tries on a loaded machine).
        while not stop.wait(0.2):
            pass


def _apply_schedule(
    emulator: ImdsEmulator,
    started: float,
    spot_notice_after: float | None,
    action: str,
    lead: float,
    rebalance_after: float | None,
    lifecycle_terminated_after: float | None,
    scheduled_event: str | None,
    scheduled_in: float,
    stale_termination_time: float | None,
) -> list[dict[str, Any]]:
    """Put the flags' scenario into the emulator; one line per event, for the start message."""
    schedule: list[dict[str, Any]] = []
    if spot_notice_after is not None:
        emulator.spot_interruption(action, lead_seconds=lead, at=started + spot_notice_after)
        detail = "hibernate now" if action == "hibernate" else f"{action} {lead:g}s later"
        schedule.append({"after": spot_notice_after, "what": f"spot interruption notice ({detail})"})
    if rebalance_after is not None:
        emulator.rebalance(at=started + rebalance_after)
        schedule.append({"after": rebalance_after, "what": "rebalance recommendation"})
    if lifecycle_terminated_after is not None:
        emulator.set_lifecycle_state("InService", at=started)
        emulator.set_lifecycle_state("Terminated", at=started + lifecycle_terminated_after)
        schedule.append(
            {"after": lifecycle_terminated_after, "what": "target lifecycle state Terminated (InService before)"}
        )
    if scheduled_event is not None:
        emulator.add_scheduled_event(scheduled_event, started + scheduled_in, not_after=started + scheduled_in + 7200)
        schedule.append({"after": 0, "what": f"scheduled event {scheduled_event}, NotBefore in {scheduled_in:g}s"})
    if stale_termination_time is not None:
        emulator.stale_termination_time(stale_termination_time)
        schedule.append({"after": 0, "what": f"stale spot/termination-time {stale_termination_time:g}s in the past"})
    return sorted(schedule, key=lambda line: line["after"])


@contextlib.contextmanager
def _stopped_by_signals(emulator: ImdsEmulator) -> Iterator[threading.Event]:
    """An event that Ctrl-C (SIGINT) or SIGTERM sets; on leaving, the emulator is stopped."""
    stop = threading.Event()
    previous = {sig: signal.signal(sig, lambda signum, frame: stop.set()) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield stop
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        emulator.stop()
        click.echo("IMDS emulator stopped", err=True)
