"""One monitored node on this machine, for the end-to-end test and ``benchmarks/bench_scrape.py``:

* the fixture dcgm-exporter serving a recorded p5.48xlarge (or p4d.24xlarge) scrape, filtered by the
  counters file the image ships (``gpucloud.monitoring.dcgm_fields``);
* the real node_exporter reading a fixture sysfs with the instance type's EFA devices;
* a real ``gpucloud agent`` on its own IMDS emulator (the node: an EC2 instance id, a spot instance),
  serving ``/metrics`` (the EFA counters from the same fixture sysfs), running a real ``spot-train`` attempt (torchrun, 1 rank, gloo) of the example
  training script held at a step boundary (``tests/agent/gated_train.py``) until the test opens the
  gate;
* a real Prometheus scraping the three every second, with the rules ``gpucloud monitoring render``
  writes for the stack, through the offline configuration (``static_prometheus_config``) whose
  targets carry the node's ``instance_id`` and ``node_group`` the way EC2 discovery's relabelling does.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

from gpucloud.lifecycle.model import JobSpec
from gpucloud.offline.imds_emulator import ImdsEmulator
from gpucloud.queue.sqlite import SqliteQueue
from helpers.waiting import wait_for

from .dcgm_fixture import NODES, FixtureExporter, recording, served_text
from .efa_sysfs import EFA_DEVICES, write_efa_sysfs
from .tools import NodeExporter, Prometheus, free_port

CLI = [sys.executable, "-m", "gpucloud"]
GATED_TRAIN = Path(__file__).resolve().parent.parent / "agent" / "gated_train.py"
STACKS = {"p5.48xlarge": "p5-capacity-block", "p4d.24xlarge": "p4d-spot"}
INSTANCE_ID = "i-0a1b2c3d4e5f67890"
JOB_ID = "monitored"
STEPS = 40
GATE_AFTER_STEP = 6  # the rank waits at step 7's boundary until the gate opens
SCRAPE_INTERVAL = "1s"


@dataclasses.dataclass
class AgentProcess:
    proc: subprocess.Popen
    lines: list[dict]  # the agent's JSON status lines, as they come
    stderr: list[str]

    def metrics_port(self) -> int | None:
        return next((line["port"] for line in self.lines if line.get("event") == "metrics"), None)

    def output(self) -> str:
        return "\n".join(json.dumps(line) for line in self.lines) + "\n" + "".join(self.stderr)[-3000:]


def start_agent(env: dict[str, str], work: Path, emulator: ImdsEmulator, *, sysfs: Path, linger: float) -> AgentProcess:
    """The node's agent; it reads the EFA counters from the fixture ``sysfs`` and, after the notice,
    keeps /metrics up ``linger`` seconds (or until SIGTERM)."""
    argv = [
        *CLI,
        "agent",
        "--imds-endpoint",
        emulator.endpoint,
        "--poll-interval",
        "0.2",
        "--address",
        "127.0.0.1",
        "--rendezvous-port",
        str(free_port()),
        "--run-dir",
        str(work / "agent-run"),
        "--slot-lease",
        "6",
        "--idle-exit",
        "60",
        "--metrics-port",
        "0",
        "--metrics-address",
        "127.0.0.1",
        "--metrics-linger",
        f"{linger:g}",
        "--sysfs-root",
        str(sysfs),
        "--output",
        "json",
    ]
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    agent = AgentProcess(proc, [], [])

    def pump_stdout() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            with contextlib.suppress(ValueError):
                agent.lines.append(json.loads(line))

    def pump_stderr() -> None:
        assert proc.stderr is not None
        agent.stderr.extend(proc.stderr)

    for pump in (pump_stdout, pump_stderr):
        threading.Thread(target=pump, daemon=True).start()
    return agent


def submit_gated_job(home: Path, work: Path) -> None:
    queue = SqliteQueue(home / "queue.db")
    try:
        command = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc-per-node=1",
            str(GATED_TRAIN),
            "--steps",
            str(STEPS),
            "--seed",
            "7",
            "--step-seconds",
            "0.05",
            "--every-steps",
            "3",  # periodic saves before the notice: gpucloud_checkpoint_save_seconds{kind="periodic"}
            "--out",
            str(work / "weights.pt"),
        ]
        queue.submit(JobSpec(command=command, checkpoint_uri=str(work / "durable")), job_id=JOB_ID)
    finally:
        queue.close()


def render_monitoring(instance_type: str) -> tuple[dict[str, str], str]:
    """What ``gpucloud monitoring render --stack <the instance type's shipped stack>`` writes, and the
    stack's first node group (the group the node serves)."""
    from gpucloud.monitoring import render
    from gpucloud.monitoring.names import placeholder_topic_arn
    from gpucloud.spec.loading import load_stack_file, stack_file_for

    stack = STACKS[instance_type]
    spec = load_stack_file(stack_file_for(stack))
    files = render(spec, stack, sns_topic_arn=placeholder_topic_arn(spec.region, stack))
    return files, spec.node_groups[0].name


@dataclasses.dataclass
class MonitoredNode:
    prometheus: Prometheus
    agent: AgentProcess
    emulator: ImdsEmulator
    gate: Path
    dcgm: FixtureExporter
    node_exporter: NodeExporter
    files: dict[str, str]  # the rendered monitoring files
    node_group: str
    instance_id: str = INSTANCE_ID

    def open_gate(self) -> None:
        self.gate.touch()

    def agent_address(self) -> str:
        port = self.agent.metrics_port()
        assert port is not None
        return f"127.0.0.1:{port}"


def write_prometheus_files(directory: Path, files: dict[str, str], targets: list, *, with_rules: bool = True) -> Path:
    """prometheus.yml (offline: these targets, 1 s scrapes) and the rendered rules beside it."""
    from gpucloud.monitoring.prometheus_config import static_prometheus_config

    directory.mkdir(parents=True, exist_ok=True)
    if with_rules:
        for path, text in files.items():
            if path.startswith("rules/"):
                (directory / path).parent.mkdir(parents=True, exist_ok=True)
                (directory / path).write_text(text)
    config = directory / "prometheus.yml"
    config.write_text(
        static_prometheus_config(targets, cluster="e2e", rule_files=with_rules, scrape_interval=SCRAPE_INTERVAL)
    )
    return config


@contextlib.contextmanager
def monitored_node(
    work: Path, env: dict[str, str], *, instance_type: str = "p5.48xlarge", linger: float = 600.0
) -> Iterator[MonitoredNode]:
    """Everything above, running; the attempt is held at the gate until ``open_gate``. Stops all on exit.
    After a notice the agent keeps /metrics up ``linger`` seconds (bounded by the notice's deadline)."""
    from gpucloud.monitoring.dcgm_fields import counters_csv
    from gpucloud.monitoring.names import AGENT_JOB, DCGM_JOB, NODE_JOB
    from gpucloud.monitoring.prometheus_config import StaticTarget

    home = Path(env["GPUCLOUD_HOME"])
    gate = work / "gate"
    files, node_group = render_monitoring(instance_type)
    # As node.env sets them on a cluster node: the agent serves (and labels its series with) its group.
    env = {
        **env,
        "GPUCLOUD_NODE_GROUP": node_group,
        "GPUCLOUD_NODE_GROUPS": node_group,
        "GPUCLOUD_TEST_GATE": str(gate),
        "GPUCLOUD_TEST_GATE_AFTER": str(GATE_AFTER_STEP),
    }
    sysfs = work / "sys"
    write_efa_sysfs(sysfs, EFA_DEVICES[instance_type])
    submit_gated_job(home, work)
    with contextlib.ExitStack() as stack:
        emulator = stack.enter_context(
            ImdsEmulator(instance_id=INSTANCE_ID, instance_type=instance_type, instance_life_cycle="spot")
        )
        agent = start_agent(env, work, emulator, sysfs=sysfs, linger=linger)
        stack.callback(_stop, agent.proc, gate)
        dcgm = stack.enter_context(FixtureExporter(served_text(recording(NODES[instance_type]), counters_csv())))
        node_exporter = stack.enter_context(NodeExporter(sysfs, work / "node_exporter.log"))
        port = wait_for(agent.metrics_port, 90, "the agent's metrics line", every=0.1)
        targets = [
            StaticTarget(job=job, address=address, instance_id=INSTANCE_ID, node_group=node_group)
            for job, address in (
                (DCGM_JOB, dcgm.address),
                (NODE_JOB, node_exporter.address),
                (AGENT_JOB, f"127.0.0.1:{port}"),
            )
        ]
        config = write_prometheus_files(work / "prometheus", files, targets)
        prometheus = stack.enter_context(Prometheus(config, work / "tsdb", work / "prometheus.log"))
        yield MonitoredNode(prometheus, agent, emulator, gate, dcgm, node_exporter, files, node_group=node_group)


def _stop(proc: subprocess.Popen, gate: Path) -> None:
    """The agent still running (a failed test): SIGTERM, as on a node, after opening the gate so the
    held rank reaches the step boundary where it learns of the stop; SIGKILL if it hangs."""
    gate.touch()
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=30)
