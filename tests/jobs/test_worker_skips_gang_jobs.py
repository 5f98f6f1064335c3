"""`gpucloud worker` runs single-node jobs only: a gang job (nodes > 1) stays queued for the agents."""

from __future__ import annotations

import json
import sys

from gpucloud.jobs.runner import claim_single_node_job
from gpucloud.lifecycle.model import JobSpec, JobState
from gpucloud.queue.sqlite import SqliteQueue
from jobqueue.aws_fixtures import aws_job_plane  # noqa: F401  (fixture: the job plane on the session moto server)

from .test_cli import run


def test_worker_leaves_a_gang_job_queued_and_runs_the_single_node_job_behind_it(capsys, gpucloud_home):
    queue = SqliteQueue(gpucloud_home / "queue.db")
    try:
        queue.submit(JobSpec(command=[sys.executable, "-c", "pass"], nodes=2), job_id="gang")
        queue.submit(JobSpec(command=[sys.executable, "-c", "pass"]), job_id="single")
    finally:
        queue.close()
    code, out, err = run(capsys, "worker", "--no-imds", "--once", "--output", "json")
    assert code == 0 and json.loads(out)["jobs"] == [{"job_id": "single", "state": "finished", "exit_code": 0}]
    assert "skips job gang: it needs a gang of 2 nodes" in err and "gpucloud agent" in err

    code, out, _ = run(capsys, "worker", "--no-imds", "--once", "--output", "json")
    assert code == 0 and json.loads(out)["jobs"] == []
    queue = SqliteQueue(gpucloud_home / "queue.db")
    try:
        gang = queue.get("gang")
        assert (gang.state, gang.attempt, gang.worker) == (JobState.QUEUED, 1, None)
    finally:
        queue.close()


def test_a_gang_job_whose_lease_ran_out_is_not_taken_over_by_a_worker(tmp_path):
    queue = SqliteQueue(tmp_path / "q.db")
    try:
        queue.submit(JobSpec(command=[sys.executable, "-c", "pass"], nodes=2), job_id="gang")
        assert queue.claim("gang-of-agents", lease_seconds=-1, job_id="gang") is not None  # lease already over
        skipped = []
        assert claim_single_node_job(queue, "w", lease_seconds=30, on_skip=skipped.append) is None
        assert [j.id for j in skipped] == ["gang"]
        assert queue.get("gang").worker == "gang-of-agents"
    finally:
        queue.close()


def test_on_the_aws_backend_a_worker_also_leaves_the_gang_to_the_agents(aws_job_plane, capsys):
    uri = aws_job_plane["uri"]
    run(capsys, "submit", "--queue", uri, "--job-id", "gang-aws", "--nodes", "2", "--", sys.executable, "-c", "pass")
    run(capsys, "submit", "--queue", uri, "--job-id", "single-aws", "--", sys.executable, "-c", "pass")
    code, out, err = run(capsys, "worker", "--queue", uri, "--no-imds", "--once", "--output", "json")
    assert code == 0 and json.loads(out)["jobs"] == [{"job_id": "single-aws", "state": "finished", "exit_code": 0}]
    assert "skips job gang-aws" in err
    code, out, _ = run(capsys, "jobs", "--queue", uri, "--state", "queued", "--output", "json")
    assert [(j["job_id"], j["attempt"]) for j in json.loads(out)] == [("gang-aws", 1)]


def test_a_worker_is_refused_where_jobs_belong_to_node_groups(capsys, gpucloud_home, monkeypatch):
    """A worker would run a job of any group (or before its fallback is due) on this machine."""
    import time

    from cli_run import one_line_error
    from gpucloud.lifecycle.model import NodeRecord, NodeState

    queue = SqliteQueue(gpucloud_home / "queue.db")
    try:
        queue.submit(JobSpec(command=[sys.executable, "-c", "pass"], group="h100"), job_id="h100-job")
        monkeypatch.setenv("GPUCLOUD_NODE_GROUP", "a100")
        code, _, err = run(capsys, "worker", "--no-imds", "--once")
        assert code == 2 and "node group 'a100'" in one_line_error(err)
        monkeypatch.delenv("GPUCLOUD_NODE_GROUP")
        queue.register_node(
            NodeRecord(id="n1", address="10.0.0.1", state=NodeState.IDLE, group="h100", updated_at=time.time())
        )
        code, _, err = run(capsys, "worker", "--no-imds", "--once")
        assert code == 2 and "agents serve node groups (h100)" in one_line_error(err)
        assert queue.get("h100-job").state is JobState.QUEUED  # nothing ran
    finally:
        queue.close()
