"""The agent's exporter (docs/monitoring.md, "The agent's metrics"): names, types and labels as the
issue fixes them, fed by a real training session through the control directory, parsed back with
prometheus_client's own text parser."""

from __future__ import annotations

import socket
import subprocess

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from gpucloud import control
from gpucloud.agent.identity import NodeIdentity, NodeLabels
from gpucloud.agent.metrics import (
    CLUSTER_ADDRESS,
    OFFLINE_ADDRESS,
    MetricsServer,
    NodeMetrics,
    default_address,
    registry_for,
    serve,
)
from gpucloud.errors import UserError
from gpucloud.lifecycle.model import NodeState
from gpucloud.training_metrics import STEP_SECONDS_BUCKETS, Histogram, SessionMeter, Snapshot
from helpers.tiny_job import TinyJob

from .conftest import CLI

NODE = ["instance_id", "node_group"]
# name (as the parser reports it: counters without _total) -> (type, labels besides le)
EXPECTED = {
    "gpucloud_node_info": ("gauge", {*NODE, "instance_type", "lifecycle", "worker"}),
    "gpucloud_agent_state": ("gauge", {*NODE, "state"}),
    "gpucloud_attempt_running": ("gauge", {"job_id", "attempt", *NODE}),
    "gpucloud_training_step": ("gauge", {"job_id", *NODE}),
    "gpucloud_step_seconds": ("histogram", set(NODE)),
    "gpucloud_checkpoint_save_seconds": ("histogram", {*NODE, "kind"}),
    "gpucloud_checkpoint_bytes": ("gauge", set(NODE)),
    "gpucloud_checkpoint_stall_seconds": ("histogram", set(NODE)),
    "gpucloud_checkpoint_failures": ("counter", set(NODE)),
    "gpucloud_notices": ("counter", {*NODE, "kind"}),
    "gpucloud_notice_to_commit_seconds": ("histogram", set(NODE)),
    "gpucloud_steps_lost": ("counter", set(NODE)),
    "gpucloud_requeues": ("counter", set(NODE)),
}


def scrape(node: NodeMetrics) -> dict:
    text = generate_latest(registry_for(node)).decode()
    return {family.name: family for family in text_string_to_metric_families(text)}


def value(families: dict, sample_name: str, **labels: str) -> float | None:
    """The value of the one sample called ``sample_name`` whose labels include ``labels``."""
    samples = [s for family in families.values() for s in family.samples]
    found = [s.value for s in samples if s.name == sample_name and labels.items() <= s.labels.items()]
    assert len(found) <= 1, f"{sample_name}{labels} is not one sample: {found}"
    return found[0] if found else None


def node_metrics() -> NodeMetrics:
    return NodeMetrics(NodeLabels(instance_id="i-0123456789abcdef0", node_group="p5", instance_type="p5.48xlarge"))


def test_every_metric_is_exported_with_the_issues_name_type_and_labels_and_a_session_feeds_them(tmp_path):
    node = node_metrics()
    ctl = tmp_path / "ctl"
    node.attempt_started("job", 3, ctl)
    job = TinyJob(str(tmp_path / "ck"), control_dir=str(ctl), every_steps=2)
    job.run(5)  # 5 steps, saves of steps 2 and 4 (asynchronous: periodic)
    families = scrape(node)
    assert {name: (f.type, {k for s in f.samples for k in s.labels} - {"le"}) for name, f in families.items()} == (
        EXPECTED
    )
    assert value(families, "gpucloud_attempt_running", job_id="job", attempt="3", node_group="p5") == 1
    assert value(families, "gpucloud_training_step", job_id="job") == 5
    assert value(families, "gpucloud_step_seconds_count") == 5
    assert value(families, "gpucloud_step_seconds_bucket", le="+Inf") == 5
    assert value(families, "gpucloud_checkpoint_save_seconds_count", kind="periodic") == 2
    assert value(families, "gpucloud_checkpoint_save_seconds_count", kind="emergency") == 0
    assert value(families, "gpucloud_checkpoint_stall_seconds_count") == 2
    manifest_bytes = control.read(ctl, control.PROGRESS)["last_save"]["bytes"]
    assert value(families, "gpucloud_checkpoint_bytes") == manifest_bytes > 0
    assert value(families, "gpucloud_checkpoint_failures_total") == 0
    every = [s for f in families.values() for s in f.samples]
    assert all(s.labels["instance_id"] == "i-0123456789abcdef0" for s in every)

    node.attempt_ended(None)
    after = scrape(node)
    assert after["gpucloud_attempt_running"].samples == [] and after["gpucloud_training_step"].samples == []
    assert value(after, "gpucloud_step_seconds_count") == 5, "the node's histograms outlive the attempt"


def test_a_failed_save_counts_and_a_second_attempt_adds_to_the_node_totals(tmp_path):
    node = node_metrics()
    node.attempt_started("job", 1, tmp_path / "ctl1")
    job = TinyJob(str(tmp_path / "ck"), control_dir=str(tmp_path / "ctl1"), every_steps=2)
    # Something that is not a directory where step 4's staging directory must go: its save fails.
    (tmp_path / "ck" / "job").mkdir(parents=True)
    (tmp_path / "ck" / "job" / ".tmp-step-4-a0").write_text("in the way")
    job.session.restore()
    for step in range(5):
        job.train_step()
        job.session.step_done(step + 1)
        if step == 2:
            assert value(scrape(node), "gpucloud_step_seconds_count") >= 1  # a read mid-attempt
    job.session.finish()
    node.attempt_ended(None)
    node.attempt_started("job", 2, tmp_path / "ctl2")
    TinyJob(str(tmp_path / "ck"), control_dir=str(tmp_path / "ctl2"), every_steps=100).run(7)  # resumes at 2
    families = scrape(node)
    assert value(families, "gpucloud_checkpoint_failures_total") == 1
    assert value(families, "gpucloud_checkpoint_save_seconds_count", kind="periodic") == 1
    assert value(families, "gpucloud_step_seconds_count") == 5 + 5
    assert value(families, "gpucloud_training_step", job_id="job") == 7


def test_the_agent_state_is_one_hot():
    node = node_metrics()
    for state in NodeState:
        node.set_state(state)
        samples = scrape(node)["gpucloud_agent_state"].samples
        assert {s.labels["state"]: s.value for s in samples} == {
            each.value: (1.0 if each is state else 0.0) for each in NodeState
        }


def test_the_session_meter_spreads_skipped_steps_and_the_exporter_adds_only_what_is_new():
    meter = SessionMeter()
    meter.start(100.0, 0)
    meter.step(100.2, 1)
    meter.step(100.2, 1)  # the same boundary again: nothing
    meter.step(101.2, 5)  # four steps in 1 s: four of 0.25 s
    assert meter.snapshot.steps.counts[STEP_SECONDS_BUCKETS.index(0.25)] == 5
    assert meter.snapshot.steps.count == 5 and meter.snapshot.steps.sum == pytest.approx(1.2)

    first = Snapshot.from_json(meter.to_json())
    meter.step(102.2, 6)
    second = Snapshot.from_json(meter.to_json())
    assert first is not None and second is not None
    assert second.since(first).steps.count == 1
    restarted = Snapshot.from_json(SessionMeter().to_json())
    assert restarted is not None and restarted.since(second).steps.count == 0  # a reset: from zero
    other = {**meter.to_json(), "step_seconds": {**Histogram((1.0, 2.0)).to_json()}}
    parsed = Snapshot.from_json(other)
    assert parsed is not None and parsed.steps.count == 0, "other buckets cannot be added to ours"
    assert Snapshot.from_json({**meter.to_json(), "v": 99}) is None


def test_metrics_listen_on_every_interface_on_ec2_and_on_loopback_off_it():
    on_ec2 = NodeIdentity(worker="i-0abc:1", address="10.0.1.5", instance_id="i-0abc")
    offline = NodeIdentity(worker="laptop:1", address="127.0.0.1")
    assert (default_address(on_ec2), default_address(offline)) == (CLUSTER_ADDRESS, OFFLINE_ADDRESS)
    assert CLUSTER_ADDRESS == "0.0.0.0" and OFFLINE_ADDRESS == "127.0.0.1"
    assert NodeLabels.of(on_ec2, "p5").instance_id == "i-0abc"
    assert NodeLabels.of(offline, None) == NodeLabels(instance_id="laptop:1", node_group="", worker="laptop:1")


def test_a_busy_metrics_port_is_a_one_line_error_naming_the_way_out(tmp_path, env):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        with pytest.raises(UserError, match=rf"cannot serve /metrics on 127.0.0.1:{port}: .*--no-metrics"):
            MetricsServer(node_metrics(), address="127.0.0.1", port=port)
        argv = [*CLI, "agent", "--no-imds", "--idle-exit", "0", "--metrics-port", str(port)]
        proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.startswith(f"gpucloud: error: cannot serve /metrics on 127.0.0.1:{port}")
    assert proc.stderr.count("\n") == 1


def test_the_server_serves_the_registry_over_http_and_stops(tmp_path):
    import urllib.request

    server = MetricsServer(node_metrics(), address="127.0.0.1", port=0)
    try:
        with urllib.request.urlopen(server.url, timeout=10) as response:
            text = response.read().decode()
        assert "gpucloud_agent_state" in text and server.url == f"http://127.0.0.1:{server.port}/metrics"
    finally:
        server.close()
    with pytest.raises(OSError):
        urllib.request.urlopen(server.url, timeout=5)


def test_only_the_member_that_recorded_a_requeue_counts_it_with_the_steps_the_next_attempt_recomputes(tmp_path):
    from gpucloud.jobs.runner import AttemptResult
    from gpucloud.lifecycle.model import AttemptEnd, AttemptState, Job, JobSpec, JobState
    from gpucloud.queue.protocol import Transition

    job = Job(
        id="j-1", spec=JobSpec(command=["train"]), state=JobState.QUEUED, attempt=2, created_at=0.0, updated_at=0.0
    )
    end = AttemptEnd(state=AttemptState.CRASHED, exit_code=1, last_step=9, committed_step=None, resume_from=6)

    def ended(applied: bool, state: JobState = JobState.QUEUED) -> AttemptResult:
        after = job.model_copy(update={"state": state})
        return AttemptResult(1, end, Transition(after, applied), 1, None, [])

    node = node_metrics()
    for result in (ended(True), ended(False), ended(True, JobState.FAILED), None):
        node.attempt_started("j-1", 1, tmp_path / "ctl")
        node.attempt_ended(result)
    families = scrape(node)
    assert value(families, "gpucloud_requeues_total") == 1
    assert value(families, "gpucloud_steps_lost_total") == 9 - 6


def test_the_agents_default_port_is_the_one_the_monitor_scrapes_and_the_security_group_opens():
    from gpucloud.agent.metrics import DEFAULT_PORT
    from gpucloud.cluster.monitoring_plan import AGENT_METRICS_PORT
    from gpucloud.commands.agent import agent

    (option,) = [p for p in agent.params if p.name == "metrics_port"]
    assert f"Default {DEFAULT_PORT}" in (option.help or "")  # resolved in agent.metrics.serve (port None)
    assert DEFAULT_PORT == AGENT_METRICS_PORT


def test_a_busy_default_port_leaves_the_agent_running_without_metrics_and_an_asked_for_one_is_refused():
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        server, why = serve(node_metrics(), address="127.0.0.1", port=None, default_port=port)
        assert server is None and why is not None
        assert why.startswith(f"cannot serve /metrics on 127.0.0.1:{port}") and why.endswith("without /metrics")
        with pytest.raises(UserError, match=f"127.0.0.1:{port}"):
            serve(node_metrics(), address="127.0.0.1", port=port)
    server, why = serve(node_metrics(), address="127.0.0.1", port=0)
    assert server is not None and why is None
    server.close()


def test_a_failed_emergency_save_counts_as_a_failure_and_its_wait_as_a_stall(tmp_path):
    from gpucloud.checkpoint.session import CheckpointSaveError

    node = node_metrics()
    ctl = tmp_path / "ctl"
    node.attempt_started("job", 1, ctl)
    job = TinyJob(str(tmp_path / "ck"), control_dir=str(ctl))
    job.session.restore()
    (tmp_path / "ck" / "job").mkdir(parents=True)
    (tmp_path / "ck" / "job" / ".tmp-step-1-a0").write_text("in the way")  # step 1's staging cannot be made
    job.train_step()
    control.write(ctl, control.PREEMPT, {"kind": "spot-interruption"})
    with pytest.raises(CheckpointSaveError):
        job.session.step_done(1)
    families = scrape(node)
    assert value(families, "gpucloud_checkpoint_failures_total") == 1
    assert value(families, "gpucloud_checkpoint_stall_seconds_count") == 1
    assert value(families, "gpucloud_checkpoint_save_seconds_count", kind="emergency") == 0
