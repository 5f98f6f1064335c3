"""`gpucloud jobs` prices every job it lists from reads that do not grow with the number of jobs:
on a cluster each read is a DynamoDB request, and a list of a thousand jobs must not be thousands
of them. The reads are counted on the real backends (SQLite statements, DynamoDB calls on moto)."""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest

from cli_run import run_cli as run
from gpucloud.lifecycle.model import JobSpec, JobState
from gpucloud.queue import connect
from gpucloud.queue.protocol import JobQueue
from gpucloud.queue.sqlite import SqliteQueue
from helpers.job_histories import record_history, spot_then_on_demand
from jobqueue.aws_fixtures import aws_job_plane  # noqa: F401  (fixture: the job plane on the session moto server)


@pytest.fixture(params=["sqlite", "aws"])
def queue_uri(request: pytest.FixtureRequest, tmp_path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'q.db'}"
    return str(request.getfixturevalue("aws_job_plane")["uri"])


def count_reads(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every read the command's queue makes once open: each SELECT on the SQLite file, each
    DynamoDB request (a page of a paginated call is a request)."""
    reads: list[str] = []
    real_open = connect.open_queue

    def open_counted(uri: str | None = None) -> JobQueue:
        queue = real_open(uri)
        if isinstance(queue, SqliteQueue):
            queue._db.set_trace_callback(lambda sql: reads.append(sql) if sql.lstrip().startswith("SELECT") else None)
        else:
            queue._ddb.meta.events.register("before-call.dynamodb", lambda model, **_: reads.append(model.name))
        return queue

    monkeypatch.setattr(connect, "open_queue", open_counted)
    return reads


def reads_to_list(capsys, reads: list[str], uri: str, *args: str) -> tuple[int, list[dict]]:
    reads.clear()
    code, out, err = run(capsys, "jobs", "--queue", uri, "--output", "json", *args)
    assert code == 0, err
    return len(reads), json.loads(out)


def _interrupted_job(queue: JobQueue) -> str:
    return record_history(queue, spot_then_on_demand())


def add_jobs(uri: str, n: int, record: Callable[[JobQueue], str] = _interrupted_job) -> None:
    queue = connect.open_queue(uri)  # counted too: the count is cleared before each listing
    try:
        for _ in range(n):
            record(queue)
    finally:
        queue.close()


@pytest.mark.parametrize("state_args", [(), ("--state", "finished", "--state", "running")])
def test_jobs_prices_every_listed_job_without_reading_the_queue_per_job_twice(
    capsys, monkeypatch, queue_uri, state_args
):
    """Reads do not grow with the jobs listed, except on DynamoDB with --state: there one Query per
    listed job reads its attempts and events together (a Scan would read the table's whole history)."""
    reads = count_reads(monkeypatch)
    add_jobs(queue_uri, 2)
    few, listed = reads_to_list(capsys, reads, queue_uri, *state_args)
    assert len(listed) == 2 and all(row["cost_usd"] is not None for row in listed)
    add_jobs(queue_uri, 4)
    many, listed = reads_to_list(capsys, reads, queue_uri, *state_args)
    assert len(listed) == 6 and all(row["cost_usd"] is not None for row in listed)
    per_job = 1 if state_args and queue_uri.startswith("aws://") else 0
    assert many - few == 4 * per_job, f"{few} reads for 2 jobs, {many} for 6"


@pytest.mark.parametrize("states", [None, [JobState.FINISHED], [JobState.QUEUED, JobState.RUNNING]])
def test_histories_are_what_list_jobs_attempts_and_events_read_one_job_at_a_time(queue_uri, states):
    queue = connect.open_queue(queue_uri)
    try:
        record_history(queue, spot_then_on_demand())
        queue.submit(JobSpec(command=["queued"]))
        running = queue.submit(JobSpec(command=["running"]))
        queue.claim("w", lease_seconds=60, job_id=running.id)
        queue.record(running.id, 1, "started", at=1.0, data={"node": {"worker": "w"}})
        one_at_a_time = [(j, queue.attempts(j.id), queue.events(j.id)) for j in queue.list_jobs(states)]
        assert one_at_a_time and queue.histories(states) == one_at_a_time
    finally:
        queue.close()


def test_jobs_on_a_cluster_makes_only_calls_the_node_role_allows(capsys, aws_job_plane):
    """The Scan that reads the listing is granted to the nodes (``infra/iam.py``): run under the
    node role's document alone, as on a node, nothing `gpucloud jobs` calls is denied."""
    import boto3

    from gpucloud.infra.iam import JobPlaneArns, node_policy_document
    from iam_simulation import denied, record_calls
    from jobqueue.aws_fixtures import REGION

    sqs, ddb = boto3.client("sqs", region_name=REGION), boto3.client("dynamodb", region_name=REGION)
    arn = {
        url: sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
        for url in (aws_job_plane["queue_url"], aws_job_plane["dlq_url"])
    }
    table_arn = ddb.describe_table(TableName=aws_job_plane["table"])["Table"]["TableArn"]
    jobs = JobPlaneArns(
        job_queue=arn[aws_job_plane["queue_url"]],
        job_dead_letter_queue=arn[aws_job_plane["dlq_url"]],
        events_queue=f"arn:aws:sqs:{REGION}:123456789012:events",
        table=table_arn,
    )
    add_jobs(aws_job_plane["uri"], 1)
    with record_calls() as calls:
        code, _, err = run(capsys, "jobs", "--queue", aws_job_plane["uri"])
    assert code == 0, err
    assert "dynamodb:Scan" in {c.action for c in calls}
    assert denied([node_policy_document("arn:aws:s3:::ckpt", jobs, None)], calls) == []
