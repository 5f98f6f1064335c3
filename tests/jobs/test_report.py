"""The job report: steps lost, latencies and GPU-hours from a timeline."""

from __future__ import annotations

from gpucloud.cost.timeline import build_timeline
from gpucloud.lifecycle.model import Event, JobSpec, steps_lost
from helpers.job_histories import Span, interrupted_once


def ev(attempt: int, kind: str, at: float, /, **data) -> Event:
    return Event(job_id="j", attempt=attempt, kind=kind, at=at, data=data)


def interrupted_job(gpus: int = 8):
    """Two 2-node attempts: a spot notice at 3500 s, flag, ack and commit of step 100, requeue at 3600;
    attempt 2 starts at 3700, restores step 100 at 3760 and finishes step 200 at 7300."""
    return interrupted_once(
        "j",
        JobSpec(command=["x"], gpus_per_node=gpus, nodes=2),
        Span(started_at=0.0, ended_at=3600.0, resumed_step=0, last_step=100, committed_step=100),
        Span(started_at=3700.0, ended_at=7300.0, resumed_step=100, last_step=200),
        [
            ev(1, "started", 0.0),
            ev(1, "resume", 10.0, step=0),
            ev(1, "notice", 3500.0, kind="spot-interruption", deadline=3620.0),
            ev(1, "flag", 3500.1),
            ev(1, "ack", 3501.0, step=100),
            ev(1, "commit", 3510.0, step=100),
            ev(1, "requeue", 3600.0, reason="checkpointed on notice"),
            ev(2, "started", 3700.0),
            ev(2, "resume", 3760.0, step=100),
            ev(2, "finish", 7300.0, step=200),
        ],
    )


def test_latencies_and_steps_lost_of_a_noticed_interruption():
    report = build_timeline(*interrupted_job())
    (stop,) = report.interruptions
    assert stop.cause == "spot-interruption" and stop.steps_lost == 0 and report.steps_lost == 0
    assert (stop.notice_to_flag_s, stop.notice_to_ack_s, stop.notice_to_commit_s) == (0.1, 1.0, 10.0)
    assert stop.commit_before_deadline_s == 110.0
    assert stop.requeue_to_resume_s == 160.0 and stop.notice_to_resume_s == 260.0


def test_gpu_hours_count_every_gpu_of_every_node():
    report = build_timeline(*interrupted_job(gpus=8))
    # 3600 s + 3600 s of wall time on 2 nodes x 8 GPUs.
    assert report.gpu_hours_used == 32.0
    # Nothing recomputed; the only loss is attempt 2's start-up (60 s) on 16 GPUs.
    assert report.gpu_hours_lost == round(60 * 16 / 3600, 4)
    assert report.gpu_note is None


def test_cpu_jobs_say_why_gpu_hours_are_zero():
    report = build_timeline(*interrupted_job(gpus=0))
    assert report.gpu_hours_used == 0 and "0 GPUs per node" in report.gpu_note


def test_a_baseline_style_restart_loses_the_steps_since_the_checkpoint():
    job, attempts, events = interrupted_job()
    attempts[1] = attempts[1].model_copy(update={"resumed_step": 60})
    events[8] = ev(2, "resume", 3760.0, step=60)
    report = build_timeline(job, attempts, events)
    assert report.interruptions[0].steps_lost == 40
    # 40 of the 100 steps attempt 1 trained (3590 s of training) were redone, plus 60 s start-up.
    assert report.gpu_hours_lost == round((3590 * 0.4 + 60) * 16 / 3600, 4)


def test_steps_lost_of_a_fresh_restart_is_everything():
    assert steps_lost(37, None) == 37
    assert steps_lost(None, 5) is None


def test_a_resume_without_its_data_position_is_a_warning() -> None:
    """The session says on its resume event when the data loader's position did not come back: the
    steps are then not really kept, and job show must say so, not only 0 lost."""
    job, attempts, events = interrupted_job()
    events[8] = ev(2, "resume", 3760.0, step=100, data_position="not restored: no extra_state holds the data loader")
    [warning] = build_timeline(job, attempts, events).warnings
    assert warning.startswith("attempt 2: resumed at step 100, but the data position was not restored: no extra_state")
    events[8] = ev(2, "resume", 3760.0, step=100, data_position="restored")
    assert build_timeline(job, attempts, events).warnings == []
