"""The notice → drain planning of gpucloud.integrations.ray.drain, without a cluster (the drain itself
runs against real Ray in test_ray_spot.py): which notices drain, with which deadline, once per node."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest
from tests.signals import eventbridge_samples as samples

from gpucloud.integrations.ray.drain import DrainRequest, NoticeDrainer, drain_request, validate_node_id
from gpucloud.signals.eventbridge import parse_message
from gpucloud.signals.events import Notice

NODE = "ab" * 28


def _notice(kind: str, deadline: float | None, event: str = "e1", action: str | None = "terminate") -> Notice:
    return Notice(kind=kind, source="imds", deadline=deadline, received_at=1000.0, event_id=event, action=action)  # type: ignore[arg-type]


@pytest.mark.parametrize("kind", ["spot-interruption", "asg-terminate", "scheduled-maintenance", "sigterm"])
def test_a_stop_notice_drains_with_its_own_deadline_in_milliseconds(kind):
    request = drain_request(_notice(kind, 1120.25), NODE)
    assert request == DrainRequest(NODE, f"gpucloud: {kind} (terminate) from imds", 1_120_250)


def test_a_rebalance_drains_with_no_deadline_which_ray_spells_zero():
    assert drain_request(_notice("rebalance", None, action=None), NODE) == DrainRequest(
        NODE, "gpucloud: rebalance from imds", 0
    )


def test_a_deadline_already_past_is_passed_on_not_replaced_by_an_assumed_window():
    assert drain_request(_notice("spot-interruption", 0.0004), NODE).deadline_ms == 1  # type: ignore[union-attr]


class Recorder:
    def __init__(self, answer: tuple[bool, str] = (True, "")) -> None:
        self.calls: list[DrainRequest] = []
        self.answer = answer

    def __call__(self, request: DrainRequest) -> tuple[bool, str]:
        self.calls.append(request)
        return self.answer


def test_a_node_is_drained_once_and_again_only_for_a_more_urgent_notice():
    sent = Recorder()
    drainer = NoticeDrainer(NODE, sent, clock=lambda: 1000.0)
    assert drainer.handle(_notice("rebalance", None, "r", action=None)) is not None
    assert drainer.handle(_notice("spot-interruption", 1120.0, "s1")) is not None
    assert drainer.handle(_notice("scheduled-maintenance", 5000.0, "m")) is None  # later: nothing to add
    assert drainer.handle(_notice("sigterm", 1030.0, "t")) is not None  # sooner: Ray keeps the newest
    assert [c.deadline_ms for c in sent.calls] == [0, 1_120_000, 1_030_000]


def test_a_rejected_or_failed_drain_is_logged_and_the_next_notice_tries_again(caplog):
    sent = Recorder((False, "node is dead"))
    drainer = NoticeDrainer(NODE, sent)
    assert drainer.handle(_notice("spot-interruption", 1120.0)) is None
    assert "Ray rejected the drain" in caplog.text and "node is dead" in caplog.text
    sent.answer = (True, "")
    assert drainer.handle(_notice("spot-interruption", 1120.0, "again")) is not None


def test_an_eventbridge_spot_warning_published_to_the_node_drains_it_by_the_warning_time_plus_two_minutes():
    notice = parse_message(json.dumps(samples.spot_warning()), now=samples.EVENT_EPOCH)
    assert isinstance(notice, Notice)
    sent = Recorder()
    drainer = NoticeDrainer(NODE, sent)
    drainer.start()
    try:
        assert drainer.publish(notice)
        deadline = time.monotonic() + 30
        while not drainer.sent and time.monotonic() < deadline:
            time.sleep(0.01)  # waiting on a condition: the drainer's own thread takes it from the hub
    finally:
        drainer.stop()
    assert [c.deadline_ms for c in sent.calls] == [int(notice.deadline * 1000)]  # type: ignore[operator]


@pytest.mark.parametrize("bad", ["", "not-a-node", "ab" * 27, "zz" * 28])
def test_a_node_id_that_is_not_56_hex_digits_is_one_clear_line(bad):
    with pytest.raises(ValueError, match="is not 56 hex digits"):
        validate_node_id(bad)


def test_the_node_daemon_refuses_a_bad_node_id_with_exit_2_and_one_line():
    proc = subprocess.run(
        [sys.executable, "-m", "gpucloud.integrations.ray.drain", "--address", "127.0.0.1:6379", "--node-id", "n1"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        "error: Ray node id 'n1' is not 56 hex digits (ray.get_runtime_context().get_node_id(), or NodeID in "
        "`ray list nodes`)"
    ]


def test_the_driver_wrapper_passes_the_drivers_exit_on_while_the_cluster_answers(tmp_path):
    from gpucloud.integrations.ray.driver import supervise

    code = supervise([sys.executable, "-c", "raise SystemExit(3)"], "127.0.0.1:1", reachable=lambda _: True)
    assert code == 3  # a failure on a live cluster stays a failure: spot-train's --max-attempts bounds it


def test_the_driver_wrapper_turns_a_failure_on_a_vanished_cluster_into_a_requeue():
    from gpucloud.integrations.ray.driver import supervise

    answers = iter([True, False])
    code = supervise(
        [sys.executable, "-c", "raise SystemExit(1)"],
        "127.0.0.1:1",
        lost_after=5,
        reachable=lambda _: next(answers, False),
    )
    assert code == 75


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--address", "auto", "--", "python", "d.py"], "--address must be the cluster's GCS as HOST:PORT"),
        (["--address", "10.0.0.1:6379", "--lost-after", "0", "--", "python", "d.py"], "--lost-after must be > 0"),
        (["--address", "10.0.0.1:6379"], "no driver command"),
    ],
)
def test_the_driver_wrapper_refuses_bad_arguments_with_exit_2_and_one_line(args, says):
    proc = subprocess.run(
        [sys.executable, "-m", "gpucloud.integrations.ray.driver", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env={k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"},
    )
    assert proc.returncode == 2
    (line,) = proc.stderr.strip().splitlines()
    assert line.startswith("error: ") and says in line
