"""At a notice the supervisor says whether the emergency save will fit, from the previous save's
measured duration kept with the job; `job show` says so afterwards when it would not."""

from __future__ import annotations

import json
import logging
import math
import sys
import textwrap
import threading
from pathlib import Path

import pytest

from gpucloud.cli import main
from gpucloud.cost.timeline import build_timeline
from gpucloud.jobs.runner import supervise_job
from gpucloud.jobs.supervisor import (
    SAVE_RECORD_EVERY_S,
    SaveMeasure,
    StopPlan,
    SupervisorConfig,
    last_save_from_events,
    save_fit,
    should_record_save,
)
from gpucloud.lifecycle.model import Event, JobSpec
from gpucloud.queue.sqlite import SqliteQueue
from helpers.notices import Inbox, spot_notice
from helpers.waiting import wait_for

FAST = SupervisorConfig(ack_timeout=5.0, stop_margin=1.0, exit_grace=2.0, kill_after=0.5, tick=0.02)

# A cooperative command that reports one measured save (argv: bytes, seconds, and the attempts that
# report it), then waits for the stop flag, acks and commits.
MEASURED = """
    import os, sys, time
    from gpucloud import control
    ctl = os.environ["GPUCLOUD_CONTROL_DIR"]
    control.write(ctl, control.RESUMED, {"step": 0})
    progress = {"step": 3}
    if os.environ["GPUCLOUD_ATTEMPT"] in sys.argv[3].split(","):
        progress["last_save"] = {"step": 2, "bytes": int(sys.argv[1]), "seconds": float(sys.argv[2])}
    control.write(ctl, control.PROGRESS, progress)
    while not control.exists(ctl, control.PREEMPT):
        time.sleep(0.01)
    control.write(ctl, control.ACK, {"step": 3})
    control.write(ctl, control.COMMITTED, {"step": 3})
    sys.exit(75)
"""


@pytest.fixture
def q(tmp_path):
    queue = SqliteQueue(tmp_path / "q.db")
    yield queue
    queue.close()


def command(tmp_path: Path, size: int, seconds: float, attempts: str = "1,2,3") -> list[str]:
    path = tmp_path / "measured.py"
    path.write_text(textwrap.dedent(MEASURED))
    return [sys.executable, str(path), str(size), str(seconds), attempts]


def attempt_with_notice(q, job_id: str, lead: float, after: str = "saved") -> None:
    inbox = Inbox()
    thread = threading.Thread(target=supervise_job, args=(q, job_id), kwargs={"notices": inbox, "config": FAST})
    thread.start()
    # the notice comes once the supervisor has recorded the command's save (or, with none, its resume)
    wait_for(lambda: _seen(q, job_id, after), what=f"the attempt's {after!r} event")
    inbox.put(spot_notice(lead=lead))
    thread.join(timeout=60)
    assert not thread.is_alive()


def _seen(q, job_id: str, kind: str) -> bool:
    attempt = q.get(job_id).attempt
    return any(e.kind == kind and e.attempt == attempt for e in q.events(job_id))


def fits_of(q, job_id: str) -> list[dict]:
    return [e.data for e in q.events(job_id) if e.kind == "save-fit"]


def test_a_save_that_took_longer_than_the_time_left_is_logged_and_shown_by_job_show(q, tmp_path, caplog, capsys):
    job = q.submit(JobSpec(command=command(tmp_path, 208 * 10**9, 357.0)))
    with caplog.at_level(logging.INFO, logger="gpucloud.jobs"):
        attempt_with_notice(q, job.id, lead=30.0)
    saved = [e.data for e in q.events(job.id) if e.kind == "saved"]
    assert saved == [{"step": 2, "bytes": 208 * 10**9, "seconds": 357.0}]  # kept with the job
    [fit] = fits_of(q, job.id)
    assert fit["fits"] is False and fit["needed_s"] == 357.0 and fit["left_s"] < 30
    assert any("will NOT fit" in r.getMessage() and "357.0 s" in r.getMessage() for r in caplog.records)

    assert _run(["job", "show", job.id, "--queue", f"sqlite:///{tmp_path / 'q.db'}"]) == 0
    out = capsys.readouterr().out
    assert "warning: attempt 1: emergency save would NOT fit: the last save (step 2, 208.00 GB) took 357.0 s" in out
    assert _run(["job", "show", job.id, "--queue", f"sqlite:///{tmp_path / 'q.db'}", "--output", "json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["interruptions"][0]["save_fits"] is False and len(report["warnings"]) == 1


def test_the_previous_attempts_save_judges_the_next_notice(q, tmp_path, caplog):
    job = q.submit(JobSpec(command=command(tmp_path, 10**9, 0.5, attempts="1")))
    attempt_with_notice(q, job.id, lead=30.0)
    assert fits_of(q, job.id)[0]["fits"] is True
    assert q.get(job.id).attempt == 2
    # attempt 2 measures nothing before its notice: the figure kept with the job is used
    with caplog.at_level(logging.INFO, logger="gpucloud.jobs"):
        attempt_with_notice(q, job.id, lead=30.0, after="resume")
    second = fits_of(q, job.id)[1]
    assert second["fits"] is True and second["measured_step"] == 2 and second["needed_s"] == 0.5
    assert any("emergency save fits" in r.getMessage() for r in caplog.records)


def _run(argv: list[str]) -> int:
    try:
        main(argv)
    except SystemExit as done:
        return int(done.code or 0)
    return 0


# ---------------------------------------------------------------------------------- pure parts
def plan(commit_by: float) -> StopPlan:
    return StopPlan(flagged_at=0.0, deadline=commit_by + 5, ack_by=1.0, commit_by=commit_by)


def test_save_fit_compares_the_measured_duration_with_the_time_left() -> None:
    measure = SaveMeasure(step=7, bytes=10**9, seconds=40.0)
    assert save_fit(measure, plan(115.0), now=10.0).fits is True
    late = save_fit(measure, plan(115.0), now=80.0)
    assert late.fits is False and late.left_seconds == 35.0
    assert "will NOT fit" in late.describe() and "40.0 s" in late.describe()
    unknown = save_fit(None, plan(115.0), now=0.0)
    assert unknown.fits is None and "no earlier save" in unknown.describe()


@pytest.mark.parametrize(
    "payload",
    [
        None,
        "x",
        {"step": 1, "bytes": 10},
        {"step": True, "bytes": 10, "seconds": 1.0},
        {"step": 1, "bytes": -1, "seconds": 1.0},
        {"step": 1, "bytes": 10, "seconds": math.nan},
        {"step": 1, "bytes": 10, "seconds": -2.0},
        {"step": 1, "bytes": "10", "seconds": 1.0},
    ],
)
def test_malformed_save_payloads_are_ignored(payload) -> None:
    assert SaveMeasure.from_payload(payload) is None


def test_the_latest_saved_event_is_the_jobs_previous_save() -> None:
    events = [
        Event(job_id="j", attempt=1, kind="saved", at=5.0, data={"step": 4, "bytes": 2, "seconds": 3.0}),
        Event(job_id="j", attempt=1, kind="saved", at=1.0, data={"step": 2, "bytes": 1, "seconds": 1.0}),
        Event(job_id="j", attempt=2, kind="notice", at=9.0, data={}),
    ]
    assert last_save_from_events(events) == SaveMeasure(step=4, bytes=2, seconds=3.0)
    assert last_save_from_events([]) is None


def test_only_a_significant_change_is_news() -> None:
    base = SaveMeasure(step=1, bytes=1000, seconds=10.0)
    assert not SaveMeasure(step=9, bytes=1100, seconds=11.0).differs_from(base)
    assert SaveMeasure(step=9, bytes=1000, seconds=13.0).differs_from(base)
    assert SaveMeasure(step=9, bytes=2000, seconds=10.0).differs_from(base)


def test_a_new_save_is_recorded_first_then_only_when_it_changed_and_not_too_often() -> None:
    first = SaveMeasure(step=2, bytes=1000, seconds=10.0)
    same = SaveMeasure(step=4, bytes=1000, seconds=10.5)
    grown = SaveMeasure(step=6, bytes=5000, seconds=50.0)
    assert should_record_save(first, None, None, now=0.0)
    assert not should_record_save(same, first, 0.0, now=10_000.0)  # no news
    assert not should_record_save(grown, first, 0.0, now=60.0)  # news, but a record was just made
    assert should_record_save(grown, first, 0.0, now=SAVE_RECORD_EVERY_S)


def test_report_without_a_save_fit_event_has_no_warning(q) -> None:
    job = q.submit(JobSpec(command=["true"]))
    report = build_timeline(q.get(job.id), q.attempts(job.id), q.events(job.id))
    assert report.warnings == []
