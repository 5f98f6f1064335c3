"""The monitor's daily report, run under the monitor role's policy documents alone.

The report runs for real (``gpucloud report``, as the monitor's timer script runs it) against the
job plane on the moto server; every AWS call it makes is then checked against the documents the
stack gives the monitor role (``monitor_policy_document`` and ``report_policy_document``) by an
IAM policy simulation (``tests/iam_simulation.py``). A call outside the policy fails the test, as
AWS would deny it every day on the monitor.
"""

from __future__ import annotations

from pathlib import Path

import boto3

from cli_run import run_cli
from gpucloud.infra.monitoring_iam import monitor_policy_document
from gpucloud.infra.monitoring_selfhosted import FILES_PREFIX, REPORTS_PREFIX, report_policy_document
from gpucloud.lifecycle.model import JobSpec
from gpucloud.queue.connect import open_queue
from iam_simulation import Call, denied, record_calls
from jobqueue.aws_fixtures import REGION, create_job_plane

BUCKET = "p5-bucket"
BUCKET_ARN = f"arn:aws:s3:::{BUCKET}"
TOPIC_ARN = f"arn:aws:sns:{REGION}:123456789012:p5-alerts"
PACKAGE = "s3://p5-bucket/agent/"


def test_the_daily_report_makes_only_calls_the_monitor_role_allows(fresh_aws_account, tmp_path: Path, capsys):
    plane = create_job_plane(fresh_aws_account)
    uri = f"aws://{REGION}?table={plane['table']}&queue={plane['queue_url']}"
    sqs, ddb = boto3.client("sqs", region_name=REGION), boto3.client("dynamodb", region_name=REGION)
    boto3.client("s3", region_name=REGION).create_bucket(Bucket=BUCKET)
    arn = {
        url: sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
        for url in (plane["queue_url"], plane["dlq_url"])
    }
    table_arn = ddb.describe_table(TableName=plane["table"])["Table"]["TableArn"]
    seeded = open_queue(uri)
    seeded.submit(JobSpec(command=["train"], nodes=2))
    seeded.close()
    documents = [
        monitor_policy_document(TOPIC_ARN, BUCKET_ARN, FILES_PREFIX),
        report_policy_document(BUCKET_ARN, table_arn, arn[plane["queue_url"]], arn[plane["dlq_url"]], PACKAGE),
    ]

    common = ["report", "--queue", uri, "--since", "24h"]
    with record_calls() as calls:  # the timer script's two runs (scripts/monitor-bootstrap.sh)
        page = run_cli(capsys, *common, "--output", "html", "--out", f"s3://{BUCKET}/{REPORTS_PREFIX}day.html")
        summary = run_cli(capsys, *common, "--output", "table", "--out", str(tmp_path / "summary"))
    assert page[0] == 0 and summary[0] == 0, (page, summary)
    # ... then `aws sns publish` of the summary to the alert topic
    calls.append(Call("sns:Publish", TOPIC_ARN))

    assert {c.action for c in calls} >= {"sqs:GetQueueAttributes", "sqs:GetQueueUrl", "s3:PutObject"}
    assert denied(documents, calls) == []
    # ... and the report's grants are exactly what it calls (the package's are the bootstrap's install)
    granted = {a for s in documents[1]["Statement"] if not s["Sid"].startswith("ReportPackage") for a in s["Action"]}
    assert granted == {c.action for c in calls} - {"sns:Publish"}
