"""The self-hosted monitor (``monitoring.mode: self-hosted``): one small private instance running
Prometheus (EC2 service discovery by the cluster tag), Alertmanager (to the stack's SNS topic) and
Grafana, reached only through SSM port forwarding.

- no public IP, in the first node subnet (private); its security group lets nothing in; the node
  security group lets the monitor's group reach the exporters' ports (``security.allow_scrapes``);
- the TSDB on its own encrypted gp3 volume sized from ``retentionDays`` and the cluster's series
  (``monitoring_plan.data_volume_gib``), so replacing the instance keeps the history;
- the monitoring files `gpucloud monitoring render` writes are staged in the stack's bucket (user
  data holds 16 KiB, dashboards are larger) and copied at boot by ``scripts/monitor-bootstrap.sh``;
  their digest is in the user data, so changed files replace the instance (the volume stays: the
  old instance and its attachment are deleted before the new one is created, see below);
- IAM: DescribeInstances for discovery (cannot be resource-scoped), Publish on the topic only,
  read of the staged files only, and SSM's managed instance core.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import pulumi
import pulumi_aws as aws

from gpucloud.cluster.monitoring_plan import ROOT_VOLUME_GIB, data_volume_gib, retention_size_gib
from gpucloud.cluster.tags import Tagging
from gpucloud.infra.iam import SSM_CORE_POLICY
from gpucloud.infra.monitoring_iam import monitor_policy_document
from gpucloud.infra.security import allow_scrapes
from gpucloud.infra.userdata import user_data_output
from gpucloud.spec.model import S3Object

MONITOR_SCRIPT = Path(__file__).resolve().parents[3] / "scripts" / "monitor-bootstrap.sh"
MONITOR_ENV_FILE = "/etc/gpucloud/monitor.env"
# Canonical's public SSM parameter for the current Ubuntu 24.04 LTS server AMI (SSM agent included):
# https://documentation.ubuntu.com/aws/aws-how-to/instances/find-ubuntu-images/
UBUNTU_AMI_PARAMETER = "/aws/service/canonical/ubuntu/server/24.04/stable/current/amd64/hvm/ebs-gp3/ami-id"
DATA_DEVICE = "/dev/sdf"
FILES_PREFIX = "gpucloud-monitor/"
# The monitor's own software (never on the nodes, so not in images/versions.yaml). Prometheus is
# the image's pin (the nodes' agent-mode Prometheus, managed mode): one version for both.
ALERTMANAGER_VERSION = "0.28.1"
GRAFANA_VERSION = "12.1.1"

RenderFiles = Callable[[str], Mapping[str, str]]  # topic ARN -> {relative path: text}
REPORTS_PREFIX = "reports/"


@dataclasses.dataclass(frozen=True)
class DailyReport:
    """The daily training-efficiency report (``gpucloud report``; docs/cost.md, "The daily report").

    A stack setting the monitor's bootstrap acts on, not a ``report --schedule`` flag that installs a
    timer wherever it runs: the monitor is replaced whenever its files change (a timer installed by
    hand would vanish with it), only the stack can grant the role what the report reads and writes,
    and only the stack knows the bucket, the topic and the queue."""

    queue_uri: pulumi.Input[str]  # aws://REGION?table=...&queue=... (the report reads the job table)
    table_arn: pulumi.Input[str]
    package: str  # the gpucloud to install: the stack's agent wheelhouse (s3://...) or a pip requirement
    queue_arn: pulumi.Input[str]  # the job queue: opening it reads its redrive policy
    dead_letter_queue_arn: pulumi.Input[str]  # the job queue's dead-letter queue: opening it looks up its URL


def report_policy_document(
    bucket_arn: str,
    table_arn: str,
    queue_arn: str,
    dead_letter_queue_arn: str,
    package: str | None = None,
    partition: str = "aws",
) -> dict[str, object]:
    """What the daily report needs beyond the monitor's own policy (sns:Publish on the topic is
    there): open the job queue (``AwsQueue`` reads the queue's redrive policy with
    GetQueueAttributes and the dead-letter queue's URL with GetQueueUrl, whose resource is the queue
    it names: https://docs.aws.amazon.com/service-authorization/latest/reference/list_amazonsqs.html),
    read the job table (the report's queries, ``queue/aws/backend.py``: GetItem and Query, on the
    table and its state index), put the page under ``reports/``, and read the package it installs
    when that is in S3 (the same grant the nodes get, ``iam.py``: the one wheel, or the wheelhouse
    folder's listing and objects). ``tests/cost/test_report_iam.py`` runs the report under these
    documents alone."""
    statements: list[dict[str, object]] = [
        {"Sid": "OpenJobQueue", "Effect": "Allow", "Action": ["sqs:GetQueueAttributes"], "Resource": [queue_arn]},
        {
            "Sid": "FindDeadLetterQueue",
            "Effect": "Allow",
            "Action": ["sqs:GetQueueUrl"],
            "Resource": [dead_letter_queue_arn],
        },
        {
            "Sid": "ReadJobTable",
            "Effect": "Allow",
            "Action": ["dynamodb:GetItem", "dynamodb:Query"],
            "Resource": [table_arn, f"{table_arn}/index/*"],
        },
        {
            "Sid": "WriteReports",
            "Effect": "Allow",
            "Action": ["s3:PutObject"],
            "Resource": [f"{bucket_arn}/{REPORTS_PREFIX}*"],
        },
    ]
    found = S3Object.parse(package)
    if found is not None:
        house = f"arn:{partition}:s3:::{found.bucket}"
        if found.is_folder:  # ListBucket limited by s3:prefix, as the nodes' (iam.py)
            statements.append(
                {
                    "Sid": "ReportPackageList",
                    "Effect": "Allow",
                    "Action": ["s3:ListBucket"],
                    "Resource": [house],
                    "Condition": {"StringLike": {"s3:prefix": [f"{found.key}*"]}},
                }
            )
        objects = f"{house}/{found.key}*" if found.is_folder else f"{house}/{found.key}"
        statements.append(
            {"Sid": "ReportPackage", "Effect": "Allow", "Action": ["s3:GetObject"], "Resource": [objects]}
        )
    return {"Version": "2012-10-17", "Statement": statements}


@dataclasses.dataclass
class SelfHostedMonitorArgs:
    tagging: Tagging
    region: str
    vpc_id: pulumi.Input[str]
    subnet_id: pulumi.Input[str]
    node_security_group_id: pulumi.Input[str]
    bucket_name: pulumi.Input[str]
    bucket_arn: pulumi.Input[str]
    instance_type: str
    retention_days: int
    series: int  # what the cluster exports at its largest (monitoring_plan.cluster_series)
    prometheus_version: str
    render_files: RenderFiles
    topic_name: str
    alert_emails: Sequence[str] = ()
    report: DailyReport | None = None  # None: no daily report


def _file(path: str) -> Callable[[Mapping[str, str]], str]:
    return lambda files: files[path]


def content_type(path: str) -> str:
    return "application/json" if path.endswith(".json") else "text/plain"


def files_digest(files: Mapping[str, str]) -> str:
    """One digest of every staged file (names and contents): in the user data, so a change
    replaces the instance and its boot copies the new files."""
    return hashlib.sha256(json.dumps(dict(sorted(files.items()))).encode()).hexdigest()[:16]


class SelfHostedMonitor(pulumi.ComponentResource):
    topic: aws.sns.Topic
    instance: aws.ec2.Instance
    data_volume: aws.ebs.Volume
    security_group: aws.ec2.SecurityGroup
    role: aws.iam.Role

    def __init__(self, name: str, args: SelfHostedMonitorArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("gpucloud:monitoring:SelfHostedMonitor", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        invoke = pulumi.InvokeOutputOptions(parent=self)
        t = args.tagging

        # SNS encrypts with the AWS-managed key: the monitor publishes with its role (SigV4) and
        # aws/sns's key policy lets this account's principals use it through SNS.
        self.topic = aws.sns.Topic(
            f"{name}-alerts",
            name=args.topic_name,
            kms_master_key_id="alias/aws/sns",
            tags=t.tags("alerts"),
            opts=child,
        )
        for i, email in enumerate(args.alert_emails):
            aws.sns.TopicSubscription(
                f"{name}-alerts-email-{i}", topic=self.topic.arn, protocol="email", endpoint=email, opts=child
            )

        # The file names come from a render for a placeholder ARN (known before the topic exists);
        # their contents from the render for the real one.
        names = sorted(args.render_files("arn:aws:sns:placeholder"))
        rendered = self.topic.arn.apply(lambda arn: dict(args.render_files(arn)))
        for path in names:
            aws.s3.BucketObjectv2(
                f"{name}-file-{path.replace('/', '-')}",
                bucket=args.bucket_name,
                key=f"{FILES_PREFIX}{path}",
                content=rendered.apply(_file(path)),
                content_type=content_type(path),
                tags=t.object_tags(),  # S3 takes 10 tags on an object: not the user's own
                opts=child,
            )

        self.security_group = aws.ec2.SecurityGroup(
            f"{name}-sg",
            vpc_id=args.vpc_id,
            description="gpucloud monitor: no ingress (SSM only); scrapes the nodes, reaches AWS APIs",
            revoke_rules_on_delete=True,
            tags=t.tags("monitor"),
            opts=child,
        )
        # Out: HTTPS to AWS APIs (EC2 discovery, SNS, S3, SSM) and the release downloads; HTTP to
        # Ubuntu's package mirrors. In: nothing.
        for port in (443, 80):
            aws.vpc.SecurityGroupEgressRule(
                f"{name}-out-{port}",
                security_group_id=self.security_group.id,
                ip_protocol="tcp",
                from_port=port,
                to_port=port,
                cidr_ipv4="0.0.0.0/0",
                description="AWS APIs and package downloads" if port == 443 else "Ubuntu package mirrors",
                tags=t.tags(f"monitor-out-{port}"),
                opts=child,
            )
        allow_scrapes(
            f"{name}-scrape",
            t,
            node_group_id=args.node_security_group_id,
            monitor_group_id=self.security_group.id,
            parent=self,
        )

        self.role = aws.iam.Role(
            f"{name}-role",
            description=f"gpucloud {t.cluster} monitor",
            assume_role_policy=json.dumps(
                {
                    "Version": "2012-10-17",
                    "Statement": [
                        {"Effect": "Allow", "Principal": {"Service": "ec2.amazonaws.com"}, "Action": "sts:AssumeRole"}
                    ],
                }
            ),
            tags=t.tags("monitor"),
            opts=child,
        )
        partition = aws.get_partition_output(opts=invoke).partition
        aws.iam.RolePolicyAttachment(
            f"{name}-ssm",
            role=self.role.name,
            policy_arn=pulumi.Output.concat("arn:", partition, ":iam::aws:", SSM_CORE_POLICY),
            opts=child,
        )
        policy = aws.iam.RolePolicy(
            f"{name}-access",
            role=self.role.name,
            policy=pulumi.Output.all(self.topic.arn, args.bucket_arn).apply(
                lambda v: json.dumps(monitor_policy_document(v[0], v[1], FILES_PREFIX))
            ),
            opts=child,
        )
        if args.report is not None:
            report = args.report
            policies = [
                policy,
                aws.iam.RolePolicy(
                    f"{name}-report",
                    role=self.role.name,
                    policy=pulumi.Output.all(
                        args.bucket_arn, report.table_arn, report.queue_arn, report.dead_letter_queue_arn, partition
                    ).apply(lambda v: json.dumps(report_policy_document(v[0], v[1], v[2], v[3], report.package, v[4]))),
                    opts=child,
                ),
            ]
        else:
            policies = [policy]
        profile = aws.iam.InstanceProfile(f"{name}-profile", role=self.role.name, tags=t.tags("monitor"), opts=child)

        zone = aws.ec2.get_subnet_output(id=args.subnet_id, opts=invoke).availability_zone
        volume_gib = data_volume_gib(args.series, args.retention_days)
        self.data_volume = aws.ebs.Volume(
            f"{name}-tsdb",
            availability_zone=zone,
            size=volume_gib,
            type="gp3",
            encrypted=True,
            tags=t.tags("monitor-tsdb"),
            opts=child,
        )
        image = aws.ssm.get_parameter_output(name=UBUNTU_AMI_PARAMETER, opts=invoke).insecure_value
        settings: dict[str, pulumi.Input[str]] = {
            "GPUCLOUD_CLUSTER": t.cluster,
            "GPUCLOUD_REGION": args.region,
            "GPUCLOUD_MONITOR_FILES": pulumi.Output.concat("s3://", args.bucket_name, "/", FILES_PREFIX),
            "GPUCLOUD_MONITOR_VOLUME_ID": self.data_volume.id,
            "GPUCLOUD_MONITOR_FILES_DIGEST": rendered.apply(files_digest),
            "GPUCLOUD_RETENTION_DAYS": str(args.retention_days),
            "GPUCLOUD_RETENTION_SIZE_GIB": str(retention_size_gib(volume_gib)),
            "GPUCLOUD_PROMETHEUS_VERSION": args.prometheus_version,
            "GPUCLOUD_ALERTMANAGER_VERSION": ALERTMANAGER_VERSION,
            "GPUCLOUD_GRAFANA_VERSION": GRAFANA_VERSION,
        }
        if args.report is not None:
            settings |= {
                "GPUCLOUD_REPORT_SCHEDULE": "daily",
                "GPUCLOUD_QUEUE": args.report.queue_uri,
                "GPUCLOUD_REPORTS": pulumi.Output.concat("s3://", args.bucket_name, "/", REPORTS_PREFIX),
                "GPUCLOUD_ALERT_TOPIC_ARN": self.topic.arn,
                "GPUCLOUD_REPORT_PACKAGE": args.report.package,
            }
        self.instance = aws.ec2.Instance(
            f"{name}-instance",
            ami=image,
            instance_type=args.instance_type,
            subnet_id=args.subnet_id,
            vpc_security_group_ids=[self.security_group.id],
            associate_public_ip_address=False,
            iam_instance_profile=profile.name,
            metadata_options=aws.ec2.InstanceMetadataOptionsArgs(
                http_tokens="required", http_put_response_hop_limit=1, http_endpoint="enabled"
            ),
            root_block_device=aws.ec2.InstanceRootBlockDeviceArgs(
                volume_type="gp3",
                volume_size=ROOT_VOLUME_GIB,
                encrypted=True,
                delete_on_termination=True,
                tags=t.tags("monitor-root"),  # not volume_tags: it would also retag the attached TSDB volume
            ),
            user_data_base64=user_data_output(settings, MONITOR_SCRIPT, MONITOR_ENV_FILE),
            user_data_replace_on_change=True,
            tags=t.tags("monitor"),
            # Replaced when its files change: the old instance and its volume attachment go first.
            # Pulumi's default creates the replacement first, and attaching the TSDB volume to it then
            # fails with VolumeInUse, since the volume is still attached to the old instance
            # (pulumi/pulumi-aws#2769, whose workaround this is). deleteBeforeReplace also deletes the
            # dependents being replaced first (the attachment: stopped, detached); the volume is not
            # one, so the TSDB stays. The AMI is the current Ubuntu's when the instance is created:
            # reading the SSM parameter at every run would replace the monitor, cutting its scrapes,
            # whenever Canonical publishes an image; unattended-upgrades patches it meanwhile.
            # https://www.pulumi.com/docs/iac/concepts/options/deletebeforereplace/
            # https://www.pulumi.com/docs/iac/concepts/options/ignorechanges/
            opts=pulumi.ResourceOptions(
                parent=self, depends_on=policies, delete_before_replace=True, ignore_changes=["ami"]
            ),
        )
        aws.ec2.VolumeAttachment(
            f"{name}-tsdb-attach",
            device_name=DATA_DEVICE,
            volume_id=self.data_volume.id,
            instance_id=self.instance.id,
            stop_instance_before_detaching=True,  # Prometheus stops cleanly before the detach
            opts=pulumi.ResourceOptions(parent=self, delete_before_replace=True),
        )
        self.register_outputs(
            {"instanceId": self.instance.id, "alertTopicArn": self.topic.arn, "dataVolumeId": self.data_volume.id}
        )
