"""The agent's /metrics while it runs real attempts: an agent in this process with a hand-fed notice,
and an agent process on its own IMDS emulator, scraped over HTTP while its attempt trains."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from gpucloud.agent.asg_hooks import OfflineHooks
from gpucloud.agent.identity import NodeIdentity
from gpucloud.agent.loop import Agent, AgentOptions, AgentSummary
from gpucloud.jobs.supervisor import SupervisorConfig
from gpucloud.lifecycle.model import JobSpec, JobState
from gpucloud.offline.imds_emulator import ImdsEmulator
from gpucloud.queue.sqlite import SqliteQueue
from gpucloud.signals.events import Notice, event_id_for
from helpers.notices import Inbox
from helpers.waiting import wait_for

from .conftest import CLI
from .gated_train import held_marker
from .test_metrics import scrape, value

GATED = Path(__file__).with_name("gated_train.py")  # examples/train_spot.py, held at a step until a gate opens
CONFIG = SupervisorConfig(lease_seconds=10.0, ack_timeout=5.0, stop_margin=1.0, kill_after=2.0)


def gated_job(tmp_path: Path, gate: Path, *, steps: int) -> JobSpec:
    return JobSpec(
        command=[sys.executable, str(GATED), "--steps", str(steps), "--every-steps", "2"],
        checkpoint_uri=str(tmp_path / "ck"),
        env={"GPUCLOUD_TEST_GATE": str(gate), "GPUCLOUD_TEST_GATE_AFTER": "4"},
    )


def spot_notice() -> Notice:
    body = {"action": "terminate", "time": time.time() + 60}
    return Notice(
        kind="spot-interruption",
        source="test",
        deadline=time.time() + 60,
        received_at=time.time(),
        event_id=event_id_for("spot-interruption", body),
        action="terminate",
        payload=body,
    )


def test_a_noticed_attempt_is_on_metrics_while_it_runs_then_gone_with_its_notice_commit_and_requeue_counted(tmp_path):
    queue = SqliteQueue(tmp_path / "queue.db")
    gate = tmp_path / "gate"
    job = queue.submit(gated_job(tmp_path, gate, steps=40))
    inbox = Inbox()
    agent = Agent(
        SqliteQueue(tmp_path / "queue.db"),
        NodeIdentity(worker="node-a", address="127.0.0.1", instance_type="c5.large", lifecycle="spot"),
        inbox,
        OfflineHooks(),
        CONFIG,
        AgentOptions(slot_lease=4.0, poll_interval=0.1, idle_exit=30.0, run_root=tmp_path / "run"),
    )
    summaries: list[AgentSummary] = []
    runner = threading.Thread(target=lambda: summaries.append(agent.run()))
    runner.start()
    try:
        wait_for(held_marker(gate).exists, 90, "the attempt to finish step 4 and wait at the gate")

        def with_a_step() -> dict | None:
            families = scrape(agent.metrics)
            return families if value(families, "gpucloud_training_step", job_id=job.id) else None

        running = wait_for(with_a_step, 30, "the attempt's step on /metrics")
        assert value(running, "gpucloud_attempt_running", job_id=job.id, attempt="1", instance_id="node-a") == 1
        assert value(running, "gpucloud_agent_state", state="running") == 1
        assert 1 <= value(running, "gpucloud_training_step", job_id=job.id) <= 4
        inbox.put(spot_notice())
    finally:
        gate.touch()
        runner.join(timeout=120)
    assert summaries and summaries[0].stopped_by == "spot-interruption"
    assert queue.get(job.id).state is JobState.QUEUED and queue.get(job.id).attempt == 2

    after = scrape(agent.metrics)
    assert after["gpucloud_attempt_running"].samples == [] and after["gpucloud_training_step"].samples == []
    assert value(after, "gpucloud_agent_state", state="stopped") == 1
    assert value(after, "gpucloud_notices_total", kind="spot-interruption") == 1
    assert value(after, "gpucloud_notices_total", kind="rebalance") == 0
    assert value(after, "gpucloud_notice_to_commit_seconds_count") == 1
    assert value(after, "gpucloud_requeues_total") == 1
    assert value(after, "gpucloud_checkpoint_save_seconds_count", kind="emergency") == 1
    assert value(after, "gpucloud_checkpoint_save_seconds_count", kind="periodic") >= 2  # steps 2 and 4
    # The ranks stopped at the step they committed: attempt 2 restores it and recomputes nothing.
    (first,) = [a for a in queue.attempts(job.id) if a.number == 1]
    assert first.last_step == first.committed_step is not None and first.committed_step >= 5
    assert value(after, "gpucloud_steps_lost_total") == 0
    assert value(after, "gpucloud_step_seconds_count") >= 5


def agent_argv(imds: ImdsEmulator, tmp_path: Path, *, idle_exit: float, extra: tuple[str, ...] = ()) -> list[str]:
    """An agent on ``imds`` with /metrics on a free loopback port and JSON lines out; ``extra``: more flags."""
    return [
        *CLI,
        "agent",
        "--imds-endpoint",
        imds.endpoint,
        "--poll-interval",
        "0.2",
        "--address",
        "127.0.0.1",
        "--run-dir",
        str(tmp_path / "run"),
        "--idle-exit",
        f"{idle_exit:g}",
        "--metrics-port",
        "0",
        "--metrics-address",
        "127.0.0.1",
        *extra,
        "--output",
        "json",
    ]


def test_an_agent_process_serves_metrics_over_http_while_its_attempt_trains(tmp_path, env, gpucloud_home):
    queue = SqliteQueue(gpucloud_home / "queue.db")
    gate = tmp_path / "gate"
    job = queue.submit(gated_job(tmp_path, gate, steps=8))
    with ImdsEmulator(instance_id="i-0000000000000a001", instance_type="g5.xlarge", instance_life_cycle="spot") as imds:
        argv = agent_argv(imds, tmp_path, idle_exit=1)
        proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            assert proc.stdout is not None
            first = json.loads(proc.stdout.readline())
            assert first["event"] == "metrics" and first["url"] == f"http://127.0.0.1:{first['port']}/metrics"

            def scraped() -> dict | None:
                with urllib.request.urlopen(first["url"], timeout=10) as response:
                    families = {f.name: f for f in text_string_to_metric_families(response.read().decode())}
                return families if value(families, "gpucloud_training_step", job_id=job.id) else None

            families = wait_for(scraped, 90, "the attempt's step on the agent's /metrics")
            assert value(families, "gpucloud_attempt_running", job_id=job.id, attempt="1") == 1
            info = families["gpucloud_node_info"].samples[0].labels
            assert (info["instance_id"], info["instance_type"], info["lifecycle"]) == (
                "i-0000000000000a001",
                "g5.xlarge",
                "spot",
            )
        finally:
            gate.touch()
            out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    assert queue.get(job.id).state is JobState.FINISHED
    assert json.loads(out.splitlines()[-1])["event"] == "summary"


def start_noticed_agent(env, tmp_path: Path, imds: ImdsEmulator, *linger: str) -> tuple[subprocess.Popen, list[dict]]:
    """An agent process on ``imds`` with /metrics on a free port; its JSON lines, as they come."""
    argv = agent_argv(imds, tmp_path, idle_exit=300, extra=linger)
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    lines: list[dict] = []

    def pump() -> None:
        assert proc.stdout is not None
        lines.extend(json.loads(line) for line in proc.stdout)

    threading.Thread(target=pump, daemon=True).start()
    return proc, lines


def event(lines: list[dict], name: str) -> dict | None:
    return next((line for line in lines if line.get("event") == name), None)


def test_after_a_notice_the_agent_saves_requeues_and_reports_first_then_keeps_metrics_up_until_sigterm(
    tmp_path, env, gpucloud_home
):
    queue = SqliteQueue(gpucloud_home / "queue.db")
    gate = tmp_path / "gate"
    job = queue.submit(gated_job(tmp_path, gate, steps=40))
    with ImdsEmulator(instance_id="i-0000000000000a002", instance_type="g5.xlarge", instance_life_cycle="spot") as imds:
        proc, lines = start_noticed_agent(env, tmp_path, imds, "--metrics-linger", "600")
        try:
            url = wait_for(lambda: (event(lines, "metrics") or {}).get("url"), 60, "the metrics line")
            wait_for(held_marker(gate).exists, 90, "the attempt to finish step 4 and wait at the gate")
            imds.spot_interruption("terminate", lead_seconds=90)
            gate.touch()
            summary = wait_for(lambda: event(lines, "summary"), 120, "the agent's summary")
            # What matters happened before the linger: the commit, the requeue, the exit code.
            assert (summary["stopped_by"], summary["exit_code"]) == ("spot-interruption", 75)
            assert queue.get(job.id).state is JobState.QUEUED and queue.get(job.id).attempt == 2
            linger = wait_for(lambda: event(lines, "metrics-linger"), 30, "the linger line")
            assert 0 < linger["seconds"] <= 90  # bounded by the notice's deadline, not the 600 asked for
            # A scrape after the attempt ended still sees the notice, its commit and the emergency save.
            with urllib.request.urlopen(url, timeout=10) as response:
                families = {f.name: f for f in text_string_to_metric_families(response.read().decode())}
            assert value(families, "gpucloud_notices_total", kind="spot-interruption") == 1
            assert value(families, "gpucloud_notice_to_commit_seconds_count") == 1
            assert value(families, "gpucloud_checkpoint_save_seconds_count", kind="emergency") == 1
            assert value(families, "gpucloud_agent_state", state="stopped") == 1
            assert proc.poll() is None
            proc.send_signal(signal.SIGTERM)  # systemd stopping the service ends the linger
            assert proc.wait(timeout=60) == 75
        finally:
            gate.touch()
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=30)


def test_metrics_linger_0_exits_at_the_notice_without_lingering(tmp_path, env):
    with ImdsEmulator(instance_id="i-0000000000000a003", instance_type="g5.xlarge", instance_life_cycle="spot") as imds:
        proc, lines = start_noticed_agent(env, tmp_path, imds, "--metrics-linger", "0")
        try:
            url = wait_for(lambda: (event(lines, "metrics") or {}).get("url"), 60, "the metrics line")
            wait_for(lambda: event(lines, "status"), 30, "the agent idle")
            imds.spot_interruption("terminate", lead_seconds=90)
            assert proc.wait(timeout=60) == 75
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=30)
    wait_for(lambda: event(lines, "summary"), 10, "the summary line read")
    assert event(lines, "metrics-linger") is None
    with pytest.raises(OSError):
        urllib.request.urlopen(url, timeout=5)


def test_the_linger_follows_a_stop_notice_only_and_ends_by_its_deadline():
    from gpucloud.agent.metrics import DEFAULT_LINGER_SECONDS, linger_seconds
    from gpucloud.commands.agent import agent

    spot = spot_notice()
    now = spot.received_at
    assert linger_seconds(30, spot, now) == 30
    assert linger_seconds(600, spot, now) == spot.deadline - now
    assert linger_seconds(30, spot, spot.deadline + 1) == 0  # past the deadline: the node may be gone
    assert linger_seconds(0, spot, now) == 0
    assert linger_seconds(30, None, now) == 0  # idle exit, --exit-after-attempts
    sigterm = Notice("sigterm", "signal", now + 30, now, "sigterm-x", "SIGTERM")
    assert linger_seconds(30, sigterm, now) == 0  # the operator wants the process gone
    (option,) = [p for p in agent.params if p.name == "metrics_linger"]
    assert option.default == DEFAULT_LINGER_SECONDS == 30  # two scrapes at the monitor's 15 s interval
