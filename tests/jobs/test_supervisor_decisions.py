"""The supervisor's pure decisions: deadlines, escalation, and how an attempt ended."""

from __future__ import annotations

import pytest

from gpucloud.jobs.supervisor import (
    Phase,
    SupervisorConfig,
    ack_deadline,
    classify_exit,
    decide_stop,
    phase_of,
    plan_stop,
    spot_train_exit_code,
    tighten,
)
from gpucloud.lifecycle.model import AttemptState
from gpucloud.signals.events import Notice

CFG = SupervisorConfig(ack_timeout=30.0, stop_margin=5.0, exit_grace=10.0, kill_after=10.0)


def notice(deadline: float | None, now: float = 1000.0, event_id: str = "n1") -> Notice:
    return Notice(kind="spot-interruption", source="test", deadline=deadline, received_at=now, event_id=event_id)


def test_ack_deadline_is_the_ack_timeout_when_the_notice_leaves_time():
    assert ack_deadline(deadline=1120.0, now=1000.0, ack_timeout=30.0, margin=5.0) == 1030.0


def test_ack_deadline_never_passes_the_commit_deadline():
    # A short notice (e.g. SIGTERM with --grace 10): waiting 30 s for an ack would overrun it.
    assert ack_deadline(deadline=1010.0, now=1000.0, ack_timeout=30.0, margin=5.0) == 1005.0


def test_plan_stop_uses_the_notice_deadline_never_an_assumed_120_s():
    plan = plan_stop(notice(deadline=1040.0), now=1000.0, config=CFG)
    assert (plan.deadline, plan.ack_by, plan.commit_by) == (1040.0, 1030.0, 1035.0)


def test_a_later_sooner_notice_tightens_the_plan_and_a_later_one_does_not_relax_it():
    plan = plan_stop(notice(deadline=1120.0), now=1000.0, config=CFG)
    sooner = tighten(plan, notice(deadline=1012.0, event_id="sigterm"), now=1002.0, config=CFG)
    assert (sooner.deadline, sooner.commit_by, sooner.ack_by) == (1012.0, 1007.0, 1007.0)
    assert tighten(sooner, notice(deadline=2000.0, event_id="late"), now=1003.0, config=CFG) == sooner


def decide(**kw):
    base = dict(
        plan=plan_stop(notice(1120.0), 1000.0, CFG),
        now=1001.0,
        acked=False,
        committed_at=None,
        terminated_at=None,
        killed=False,
        config=CFG,
    )
    base.update(kw)
    return decide_stop(**base)


def test_without_a_notice_the_supervisor_never_interferes():
    assert decide(plan=None, now=10**9).action == "wait"


def test_no_ack_within_the_ack_timeout_terminates_at_once():
    assert decide(now=1029.9).action == "wait"
    d = decide(now=1030.0)
    assert d.action == "terminate" and "ack" in d.reason


def test_an_ack_waits_for_the_commit_until_the_deadline_margin():
    assert decide(acked=True, now=1100.0).action == "wait"  # past the ack timeout: acked, so keep waiting
    assert decide(acked=True, now=1115.0).action == "terminate"


def test_after_the_commit_the_ranks_get_a_grace_to_exit_by_themselves():
    assert decide(acked=True, committed_at=1010.0, now=1019.0).action == "wait"
    assert decide(acked=True, committed_at=1010.0, now=1020.0).action == "terminate"


def test_sigterm_escalates_to_sigkill_after_kill_after():
    assert decide(terminated_at=1030.0, now=1039.0).action == "wait"
    assert decide(terminated_at=1030.0, now=1040.0).action == "kill"
    assert decide(terminated_at=1030.0, now=1040.0, killed=True).action == "wait"


def test_sigkill_lands_before_the_deadline_even_when_kill_after_is_longer():
    plan = plan_stop(notice(deadline=1012.0), now=1000.0, config=CFG)
    assert decide(plan=plan, terminated_at=1007.0, now=1010.5).action == "wait"
    assert decide(plan=plan, terminated_at=1007.0, now=1011.0).action == "kill"  # deadline - 1 s


def test_phases():
    plan = plan_stop(notice(1120.0), 1000.0, CFG)
    assert phase_of(plan=None, acked=False, committed=False, terminated=False, killed=False) is Phase.RUNNING
    assert phase_of(plan=plan, acked=False, committed=False, terminated=False, killed=False) is Phase.FLAGGED
    assert phase_of(plan=plan, acked=True, committed=False, terminated=False, killed=False) is Phase.ACKED
    assert phase_of(plan=plan, acked=True, committed=True, terminated=False, killed=False) is Phase.COMMITTED
    assert phase_of(plan=plan, acked=True, committed=True, terminated=True, killed=False) is Phase.TERMINATING
    assert phase_of(plan=plan, acked=True, committed=True, terminated=True, killed=True) is Phase.KILLED


@pytest.mark.parametrize(
    "exit_code, stop, finished, committed, expected",
    [
        (1, True, False, True, AttemptState.REQUEUED),  # torchrun exits 1 when its workers exit 75
        (75, True, False, True, AttemptState.REQUEUED),
        (-15, True, False, False, AttemptState.REQUEUED),  # ignored the API, stopped by SIGTERM
        (0, True, True, False, AttemptState.FINISHED),  # finished before the stop
        (0, False, True, False, AttemptState.FINISHED),
        (0, False, False, False, AttemptState.FINISHED),  # a script that ignores the API and exits 0
        (75, False, False, False, AttemptState.REQUEUED),  # the script asked for a requeue itself
        (3, False, False, False, AttemptState.CRASHED),
        (-9, False, False, False, AttemptState.CRASHED),
        (1, False, True, False, AttemptState.CRASHED),  # crashed after the loop (e.g. writing results)
    ],
)
def test_classify_exit_trusts_control_files_over_exit_codes(exit_code, stop, finished, committed, expected):
    assert (
        classify_exit(exit_code=exit_code, stop_requested=stop, finished=finished, committed=committed).state
        is expected
    )


def test_a_crash_reason_names_the_exit_code_or_signal():
    assert "code 3" in classify_exit(exit_code=3, stop_requested=False, finished=False, committed=False).reason
    assert "SIGKILL" in classify_exit(exit_code=-9, stop_requested=False, finished=False, committed=False).reason


@pytest.mark.parametrize(
    "state, command_exit, expected",
    [
        (AttemptState.FINISHED, 0, 0),
        (AttemptState.REQUEUED, 1, 75),
        (AttemptState.LOST, -15, 75),
        (AttemptState.FAILED, 3, 3),
        (AttemptState.FAILED, -9, 137),
        (AttemptState.FAILED, 0, 1),
        (AttemptState.FAILED, None, 1),
    ],
)
def test_exit_code_contract(state, command_exit, expected):
    assert spot_train_exit_code(state, command_exit) == expected


@pytest.mark.parametrize("field", ["ack_timeout", "kill_after", "tick", "lease_seconds"])
def test_config_rejects_non_positive_durations(field):
    with pytest.raises(ValueError, match=field):
        SupervisorConfig(**{field: 0})
