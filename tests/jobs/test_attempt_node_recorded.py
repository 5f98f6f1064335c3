"""Each attempt records the node it ran on: the started and exit events carry the
instance type, AZ, region and life cycle, so the job's dollars can be priced afterwards."""

from __future__ import annotations

import sys

from gpucloud.agent.identity import discover
from gpucloud.cost.job_cost import job_cost
from gpucloud.jobs.runner import supervise_job
from gpucloud.jobs.supervisor import SupervisorConfig
from gpucloud.lifecycle.model import JobSpec
from gpucloud.offline.imds_emulator import ImdsEmulator
from gpucloud.queue.sqlite import SqliteQueue
from helpers.notices import Inbox

FAST = SupervisorConfig(ack_timeout=0.5, stop_margin=1.0, exit_grace=2.0, kill_after=0.5, tick=0.02)


def test_identity_reads_the_az_and_region_from_imds():
    with ImdsEmulator(instance_type="p4d.24xlarge", availability_zone="us-west-2c", region="us-west-2") as emu:
        me = discover(emu.endpoint)
    assert (me.instance_type, me.lifecycle, me.availability_zone, me.region) == (
        "p4d.24xlarge",
        "spot",
        "us-west-2c",
        "us-west-2",
    )
    assert me.placement()["availability_zone"] == "us-west-2c"


def test_the_started_and_exit_events_carry_the_node_and_price_the_attempt(tmp_path):
    with ImdsEmulator(instance_type="p4d.24xlarge", availability_zone="us-east-1b") as emu:
        node = {**discover(emu.endpoint).placement(), "worker": "w"}
    q = SqliteQueue(tmp_path / "q.db")
    try:
        job = q.submit(JobSpec(command=[sys.executable, "-c", "pass"]))
        supervise_job(q, job.id, notices=Inbox(), config=FAST, worker="w", node=node)
        events = q.events(job.id)
        started = next(e for e in events if e.kind == "started")
        exited = next(e for e in events if e.kind == "exit")
        assert started.data["node"] == exited.data["node"] == node
        assert node["lifecycle"] == "spot" and node["region"] == "us-east-1"

        def flat(instance_type, region, lifecycle, az=None, at=None):
            return type("P", (), {"usd_per_hour": 3600.0, "source": f"{lifecycle}:{az}", "as_of": None})()

        cost = job_cost(q.get(job.id), q.attempts(job.id), events, flat, now=0)
        assert cost.cost_usd == exited.at - started.at  # $3600/h: one dollar a second of wall time
        assert cost.price_sources == ["spot:us-east-1b"]
    finally:
        q.close()


def test_spot_train_records_the_node_it_runs_on(tmp_path, capsys):
    from gpucloud.cli import main

    db = tmp_path / "q.db"
    with ImdsEmulator(instance_type="g6.xlarge", availability_zone="us-west-2b", region="us-west-2") as emu:
        try:
            main(
                [
                    "spot-train",
                    "--imds-endpoint",
                    emu.endpoint,
                    "--queue",
                    f"sqlite:///{db}",
                    "--",
                    sys.executable,
                    "-c",
                    "pass",
                ]
            )
        except SystemExit as done:
            assert done.code in (0, None)
    q = SqliteQueue(db)
    try:
        [job] = q.list_jobs()
        [started] = [e for e in q.events(job.id) if e.kind == "started"]
        node = started.data["node"]
        assert (node["instance_type"], node["availability_zone"], node["region"], node["lifecycle"]) == (
            "g6.xlarge",
            "us-west-2b",
            "us-west-2",
            "spot",
        )
    finally:
        q.close()


def test_off_ec2_no_node_is_recorded():
    import socket

    from gpucloud.commands.spot_train import node_placement

    assert node_placement(None) is None  # --no-imds
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # closed: nothing answers
    assert node_placement(f"http://127.0.0.1:{port}") is None
