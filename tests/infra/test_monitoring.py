"""Collection per stack under Pulumi mocks: each mode on the shipped P4d/P5 stacks creates exactly
its resources, with the arguments that keep it private, encrypted and least-privileged.

The monitoring files come from a small stand-in renderer here (the product renders them with
gpucloud.monitoring); what is checked is that every file is deployed as rendered for the stack's
real topic ARN and remote-write URL.
"""

from __future__ import annotations

import base64
import json
import shlex
from typing import Any

import pulumi
import pytest

from gpucloud.catalog import load_catalog
from gpucloud.cluster import monitoring_plan as mp
from gpucloud.infra.preview import mocked_runtime, recorded_resources
from gpucloud.infra.program import build_cluster
from gpucloud.policy.runner import run_policies
from gpucloud.queue.aws.uri import uri_from_env
from gpucloud.spec import load_stack_file, stack_file_for
from gpucloud.spec.model import ClusterSpec, Monitoring

STACKS = ("p4d-spot", "p5-capacity-block")
INSTANCE = "aws:ec2/instance:Instance"
VOLUME = "aws:ebs/volume:Volume"
SG = "aws:ec2/securityGroup:SecurityGroup"
INGRESS = "aws:vpc/securityGroupIngressRule:SecurityGroupIngressRule"
EGRESS = "aws:vpc/securityGroupEgressRule:SecurityGroupEgressRule"
ROLE_POLICY = "aws:iam/rolePolicy:RolePolicy"
TOPIC = "aws:sns/topic:Topic"
OBJECT = "aws:s3/bucketObjectv2:BucketObjectv2"
LT = "aws:ec2/launchTemplate:LaunchTemplate"
AMP = "aws:amp/workspace:Workspace"
MONITORING_TYPES = {
    INSTANCE,
    VOLUME,
    TOPIC,
    OBJECT,
    AMP,
    "aws:amp/ruleGroupNamespace:RuleGroupNamespace",
    "aws:amp/alertManagerDefinition:AlertManagerDefinition",
    "aws:grafana/workspace:Workspace",
    "aws:kms/key:Key",
    "aws:ec2/volumeAttachment:VolumeAttachment",
}


def stand_in_render(
    spec: ClusterSpec, stack_name: str, *, sns_topic_arn: str, amp_remote_write_url: str | None = None
) -> dict[str, str]:
    cluster = spec.name_for(stack_name)
    return {
        "prometheus.yml": f"# {cluster}\nremote_write_url: {amp_remote_write_url}\n",
        "rules/gpu.yml": f"groups: []  # {cluster} gpu\n",
        "rules/training.yml": "groups: []  # training\n",
        "alertmanager.yml": f"receivers:\n  - name: sns\n    sns_configs:\n      - topic_arn: {sns_topic_arn}\n",
        "dashboards/cluster.json": json.dumps({"title": f"{cluster} cluster"}),
    }


def spec_with(stack: str, **monitoring: Any) -> ClusterSpec:
    spec = load_stack_file(stack_file_for(stack))
    # without the shipped budget: its topic and key are counted in tests/infra/test_budget.py
    return spec.model_copy(update={"monitoring": Monitoring(**monitoring), "budget": None})


def record(spec: ClusterSpec, stack: str, render=stand_in_render):
    @pulumi.runtime.test
    def run() -> None:
        build_cluster(spec, stack, None, monitoring_render=render)

    with mocked_runtime(stack, spec.region, spec.availability_zone) as (_, monitor):
        run()
    return recorded_resources(monitor)


def of(resources, type_token):
    return [r for r in resources if r.type == type_token]


def in_component(resources, type_token, component):
    return [r for r in of(resources, type_token) if r.parent and f"{component}::" in r.parent]


def user_data(resource) -> str:
    key = "userDataBase64" if "userDataBase64" in resource.inputs else "userData"
    return base64.b64decode(resource.inputs[key]).decode()


def env_of(script: str) -> dict[str, str]:
    body = script.split("<<'GPUCLOUD_ENV'\n", 1)[1].split("\nGPUCLOUD_ENV\n", 1)[0]
    return dict(line.split("=", 1) for line in body.splitlines())


def expected_series(spec: ClusterSpec) -> int:
    types = load_catalog().instance_types
    return mp.cluster_series((types[g.instance_type], g.max_nodes) for g in spec.node_groups)


@pytest.fixture(scope="module", params=STACKS)
def self_hosted(request):
    stack = request.param
    spec = spec_with(stack, mode="self-hosted", retentionDays=400, alertEmails=["oncall@example.com"])
    return stack, spec, record(spec, stack)


@pytest.fixture(scope="module", params=STACKS)
def managed(request):
    stack = request.param
    spec = spec_with(stack, mode="managed", retentionDays=90, managedGrafana=True, alertEmails=["a@example.com"])
    return stack, spec, record(spec, stack)


# --- self-hosted -------------------------------------------------------------------------------


def test_monitor_instance_is_private_ssm_managed_and_imdsv2(self_hosted):
    _, spec, resources = self_hosted
    [monitor] = of(resources, INSTANCE)
    inputs = monitor.inputs
    assert inputs["associatePublicIpAddress"] is False
    assert inputs["instanceType"] == spec.monitoring.instance_type
    assert inputs["metadataOptions"]["httpTokens"] == "required"
    assert inputs["rootBlockDevice"]["encrypted"] is True
    [subnet] = [r for r in of(resources, "aws:ec2/subnet:Subnet") if r.id == inputs["subnetId"]]
    assert not subnet.inputs.get("mapPublicIpOnLaunch")  # a private node subnet
    attachments = of(resources, "aws:iam/rolePolicyAttachment:RolePolicyAttachment")
    assert any(
        a.inputs["policyArn"].endswith("policy/AmazonSSMManagedInstanceCore") and "monitor" in a.name
        for a in attachments
    )


def test_tsdb_volume_is_encrypted_gp3_sized_from_retention(self_hosted):
    _, spec, resources = self_hosted
    [volume] = of(resources, VOLUME)
    assert volume.inputs["encrypted"] is True and volume.inputs["type"] == "gp3"
    assert volume.inputs["size"] == mp.data_volume_gib(expected_series(spec), 400)
    assert volume.inputs["size"] > mp.MIN_DATA_VOLUME_GIB  # 400 days is more than the floor
    [attachment] = of(resources, "aws:ec2/volumeAttachment:VolumeAttachment")
    assert attachment.inputs["volumeId"] == volume.id
    env = env_of(user_data(of(resources, INSTANCE)[0]))
    assert env["GPUCLOUD_MONITOR_VOLUME_ID"] == volume.id and env["GPUCLOUD_RETENTION_DAYS"] == "400"
    # Prometheus' size cap (GB there is 2**30 bytes) leaves a fifth of the volume to WAL and compaction
    assert int(env["GPUCLOUD_RETENTION_SIZE_GIB"]) == int(volume.inputs["size"] * 0.8)


def test_replacing_the_monitor_detaches_the_tsdb_first_and_keeps_it(self_hosted):
    """Changed files replace the instance. Created first (Pulumi's default), the new instance's
    attachment fails with VolumeInUse (pulumi/pulumi-aws#2769): the old instance and its attachment
    must go first, and the volume must not be replaced with them. A new Ubuntu AMI in the SSM
    parameter is no reason to replace it."""
    _, _, resources = self_hosted
    [instance] = of(resources, INSTANCE)
    [attachment] = of(resources, "aws:ec2/volumeAttachment:VolumeAttachment")
    [volume] = of(resources, VOLUME)
    assert instance.options.delete_before_replace and attachment.options.delete_before_replace
    assert instance.options.ignore_changes == ("ami",)
    assert attachment.inputs["stopInstanceBeforeDetaching"] is True
    # the volume depends on nothing the instance's replacement changes: it stays, with the TSDB
    assert instance.urn not in {u for deps in volume.property_dependencies.values() for u in deps}
    assert not volume.options.delete_before_replace


def test_nothing_reaches_the_monitor_and_it_reaches_only_the_exporters(self_hosted):
    _, _, resources = self_hosted
    monitor_sg = next(r for r in of(resources, SG) if "monitor" in r.name).id
    node_sg = next(r for r in of(resources, SG) if r.name.endswith("-nodes")).id
    assert not [r for r in of(resources, INGRESS) if r.inputs["securityGroupId"] == monitor_sg]
    from_monitor = [r for r in of(resources, INGRESS) if r.inputs.get("referencedSecurityGroupId") == monitor_sg]
    assert {r.inputs["securityGroupId"] for r in from_monitor} == {node_sg}
    assert sorted((r.inputs["fromPort"], r.inputs["toPort"], r.inputs["ipProtocol"]) for r in from_monitor) == [
        (9100, 9100, "tcp"),
        (9400, 9400, "tcp"),
        (9401, 9401, "tcp"),
    ]
    out = [r.inputs for r in of(resources, EGRESS) if r.inputs["securityGroupId"] == monitor_sg]
    assert all(o["ipProtocol"] == "tcp" for o in out)  # no all-traffic egress
    assert {o["fromPort"] for o in out if o.get("cidrIpv4") == "0.0.0.0/0"} == {80, 443}


def test_monitor_role_is_scoped(self_hosted):
    _, _, resources = self_hosted
    [topic] = of(resources, TOPIC)
    [policy] = [r for r in of(resources, ROLE_POLICY) if r.name.endswith("monitoring-access")]
    statements = {s["Sid"]: s for s in json.loads(policy.inputs["policy"])["Statement"]}
    assert statements["DiscoverNodes"]["Resource"] == ["*"]  # DescribeInstances takes no resource
    assert set(statements["DiscoverNodes"]["Action"]) <= {"ec2:DescribeInstances", "ec2:DescribeAvailabilityZones"}
    assert statements["PublishAlerts"] == {
        "Sid": "PublishAlerts",
        "Effect": "Allow",
        "Action": ["sns:Publish"],
        "Resource": [f"arn:aws:sns:us-east-1:123456789012:{topic.inputs['name']}"],
    }
    assert statements["ReadMonitoringFiles"]["Action"] == ["s3:GetObject"]
    assert statements["ReadMonitoringFiles"]["Resource"][0].endswith("/gpucloud-monitor/*")
    assert not any("*" in a for s in statements.values() for a in s["Action"])


def test_alert_topic_is_encrypted_and_subscribes_the_emails(self_hosted):
    stack, spec, resources = self_hosted
    [topic] = of(resources, TOPIC)
    assert topic.inputs["kmsMasterKeyId"] == "alias/aws/sns"
    assert topic.inputs["name"] == f"{spec.name_for(stack)}-alerts"
    subs = of(resources, "aws:sns/topicSubscription:TopicSubscription")
    assert [(s.inputs["protocol"], s.inputs["endpoint"]) for s in subs] == [("email", "oncall@example.com")]


def test_every_rendered_file_is_staged_as_rendered_for_the_real_topic(self_hosted):
    stack, spec, resources = self_hosted
    topic_arn = f"arn:aws:sns:us-east-1:123456789012:{spec.name_for(stack)}-alerts"
    expected = stand_in_render(spec, stack, sns_topic_arn=topic_arn)
    staged = {r.inputs["key"]: r.inputs["content"] for r in of(resources, OBJECT)}
    assert staged == {f"gpucloud-monitor/{path}": text for path, text in expected.items()}
    env = env_of(user_data(of(resources, INSTANCE)[0]))
    assert env["GPUCLOUD_MONITOR_FILES"].endswith("/gpucloud-monitor/")
    assert user_data(of(resources, INSTANCE)[0]).rstrip().endswith("exec bash /opt/gpucloud-bootstrap.sh")


def test_changed_files_replace_the_monitor_through_its_user_data():
    stack = "p5-capacity-block"
    spec = spec_with(stack, mode="self-hosted")

    def changed(*args, **kwargs):
        return {**stand_in_render(*args, **kwargs), "rules/gpu.yml": "groups: [changed]\n"}

    first, second = (of(record(spec, stack, r), INSTANCE)[0] for r in (stand_in_render, changed))
    assert second.inputs["userDataReplaceOnChange"] is True
    assert (
        env_of(user_data(first))["GPUCLOUD_MONITOR_FILES_DIGEST"]
        != env_of(user_data(second))["GPUCLOUD_MONITOR_FILES_DIGEST"]
    )


def test_nodes_learn_the_mode_and_no_remote_write(self_hosted):
    _, _, resources = self_hosted
    for lt in of(resources, LT):
        env = env_of(user_data(lt))
        assert env["GPUCLOUD_MONITORING"] == "self-hosted" and env["GPUCLOUD_METRICS_PORT"] == "9401"
        assert "GPUCLOUD_AMP_REMOTE_WRITE_URL" not in env


def test_self_hosted_passes_the_policy_pack(self_hosted):
    stack, _, resources = self_hosted
    assert [v.describe() for v in run_policies(resources, stack=stack)] == []


# --- managed -----------------------------------------------------------------------------------


def test_managed_creates_workspace_rules_and_alert_manager(managed):
    _, _, resources = managed
    [workspace] = of(resources, AMP)
    [config] = of(resources, "aws:amp/workspaceConfiguration:WorkspaceConfiguration")
    assert config.inputs["workspaceId"] == workspace.id and config.inputs["retentionPeriodInDays"] == 90
    namespaces = of(resources, "aws:amp/ruleGroupNamespace:RuleGroupNamespace")
    assert sorted(n.inputs["name"] for n in namespaces) == ["gpu", "training"]
    assert all(n.inputs["workspaceId"] == workspace.id for n in namespaces)
    [definition] = of(resources, "aws:amp/alertManagerDefinition:AlertManagerDefinition")
    text = definition.inputs["definition"]
    assert text.startswith("alertmanager_config: |\n  receivers:")
    assert "topic_arn: arn:aws:sns:us-east-1:123456789012:" in text
    assert not of(resources, INSTANCE) and not of(resources, VOLUME)  # nodes write, no monitor


def test_managed_topic_lets_only_this_workspace_publish(managed):
    _, _, resources = managed
    [workspace] = of(resources, AMP)
    [topic] = of(resources, TOPIC)
    [key] = of(resources, "aws:kms/key:Key")
    assert topic.inputs["kmsMasterKeyId"] == f"arn:aws:kms:us-east-1:123456789012:key/{key.name}"
    assert key.inputs["enableKeyRotation"] is True
    key_statements = {s["Sid"]: s for s in json.loads(key.inputs["policy"])["Statement"]}
    assert key_statements["PublisherEncrypts"]["Action"] == ["kms:GenerateDataKey*", "kms:Decrypt"]
    assert key_statements["PublisherEncrypts"]["Principal"] == {"Service": "aps.amazonaws.com"}
    [policy] = of(resources, "aws:sns/topicPolicy:TopicPolicy")
    [statement] = json.loads(policy.inputs["policy"])["Statement"]
    assert statement["Principal"] == {"Service": "aps.amazonaws.com"}
    assert statement["Action"] == ["sns:Publish", "sns:GetTopicAttributes"]
    assert (
        statement["Condition"]["ArnEquals"]["aws:SourceArn"]
        == f"arn:aws:aps:us-east-1:123456789012:workspace/{workspace.id}"
    )
    assert statement["Condition"]["StringEquals"]["aws:SourceAccount"] == "123456789012"


def test_nodes_remote_write_to_that_workspace_only(managed):
    _, _, resources = managed
    [policy] = [r for r in of(resources, ROLE_POLICY) if r.name.endswith("remote-write")]
    [statement] = json.loads(policy.inputs["policy"])["Statement"]
    assert statement["Action"] == ["aps:RemoteWrite"]
    [resource] = statement["Resource"]
    assert resource.startswith("arn:aws:aps:us-east-1:123456789012:workspace/ws-")
    node_role = next(r for r in of(resources, "aws:iam/role:Role") if r.name.endswith("-node-role"))
    assert policy.inputs["role"] == node_role.inputs.get("name", node_role.name)
    for lt in of(resources, LT):
        env = env_of(user_data(lt))
        assert env["GPUCLOUD_MONITORING"] == "managed"
        assert env["GPUCLOUD_AMP_REMOTE_WRITE_URL"].endswith(
            f"/workspaces/{resource.rsplit('/', 1)[1]}/api/v1/remote_write"
        )


def test_managed_grafana_only_when_asked(managed):
    stack, spec, resources = managed
    [grafana] = of(resources, "aws:grafana/workspace:Workspace")
    assert grafana.inputs["authenticationProviders"] == ["AWS_SSO"]
    assert grafana.inputs["dataSources"] == ["PROMETHEUS"]
    without = record(spec.model_copy(update={"monitoring": Monitoring(mode="managed")}), stack)
    assert not of(without, "aws:grafana/workspace:Workspace")


def test_managed_passes_the_policy_pack(managed):
    stack, _, resources = managed
    assert [v.describe() for v in run_policies(resources, stack=stack)] == []


# --- off ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("stack", STACKS)
def test_off_creates_nothing_and_nodes_start_no_exporters(stack):
    def no_render(*args, **kwargs):
        raise AssertionError("off renders nothing")

    resources = record(spec_with(stack, mode="off"), stack, no_render)
    assert not [r.type for r in resources if r.type in MONITORING_TYPES]
    assert not [r for r in resources if "monitoring" in r.name]
    for lt in of(resources, LT):
        assert env_of(user_data(lt))["GPUCLOUD_MONITORING"] == "off"


@pytest.mark.parametrize("mode", ["self-hosted", "managed", "off"])
def test_stack_outputs_name_the_topic_and_the_monitor(mode):
    stack = "p5-capacity-block"
    spec = spec_with(stack, mode=mode)
    seen: dict[str, object] = {}

    @pulumi.runtime.test
    def run():
        outputs = build_cluster(spec, stack, None, monitoring_render=stand_in_render)
        outputs.export()
        topic = outputs.alert_topic_arn if outputs.alert_topic_arn is not None else pulumi.Output.from_input(None)
        monitor = outputs.monitor_instance_id
        monitor = monitor if monitor is not None else pulumi.Output.from_input(None)
        return pulumi.Output.all(topic, monitor).apply(lambda v: seen.update(topic=v[0], monitor=v[1]))

    with mocked_runtime(stack, spec.region, spec.availability_zone):
        run()
    expected_topic = {"off": None}.get(mode, "arn:aws:sns:us-east-1:123456789012:p5-capacity-block-alerts")
    assert seen == {
        "topic": expected_topic,
        "monitor": "p5-capacity-block-monitoring-instance-id" if mode == "self-hosted" else None,
    }


def test_monitor_user_data_is_valid_bash_within_ec2s_limit(self_hosted, tmp_path):
    import subprocess

    from gpucloud.infra.userdata import USER_DATA_LIMIT

    text = user_data(of(self_hosted[2], INSTANCE)[0])
    assert len(text.encode()) < USER_DATA_LIMIT
    assert "cat > /etc/gpucloud/monitor.env <<'GPUCLOUD_ENV'" in text and "install_release prometheus" in text
    script = tmp_path / "monitor-user-data.sh"
    script.write_text(text)
    subprocess.run(["bash", "-n", str(script)], check=True, timeout=30)


def test_topic_name_is_the_one_the_rendered_files_name():
    from gpucloud.infra.monitoring import alert_topic_name
    from gpucloud.monitoring.names import alert_topic_name as rendered_name

    assert alert_topic_name("p5-capacity-block") == rendered_name("p5-capacity-block")


def test_the_shipped_p5_stack_stages_exactly_what_monitoring_render_writes():
    from gpucloud.infra.preview import preview_stack
    from gpucloud.monitoring import render

    stack = "p5-capacity-block"
    spec = load_stack_file(stack_file_for(stack))
    assert spec.monitoring.mode == "self-hosted"  # the default for the shipped P4d/P5 stacks
    staged = {r.inputs["key"]: r.inputs["content"] for r in of(preview_stack(spec, stack).resources, OBJECT)}
    expected = render(spec, stack, sns_topic_arn=f"arn:aws:sns:us-east-1:123456789012:{stack}-alerts")
    assert staged == {f"gpucloud-monitor/{path}": text for path, text in expected.items()}
    assert {"prometheus.yml", "alertmanager.yml"} <= set(expected) and any(p.startswith("rules/") for p in expected)


# --- the daily report (monitoring.dailyReport; docs/cost.md, "The daily report") ---------------


def monitor_env(resources) -> dict[str, str]:
    [monitor] = of(resources, INSTANCE)
    return {name: shlex.split(value)[0] for name, value in env_of(user_data(monitor)).items()}


def test_shipped_self_hosted_stacks_run_the_daily_report_on_the_job_plane(self_hosted):
    stack, spec, resources = self_hosted
    assert spec.monitoring.daily_report is None  # the shipped stacks do not name it: on by default
    env = monitor_env(resources)
    node_env = {name: shlex.split(value)[0] for name, value in env_of(user_data(of(resources, LT)[0])).items()}
    assert env["GPUCLOUD_REPORT_SCHEDULE"] == "daily"
    # the job plane's real queue: the URI the nodes' own `gpucloud jobs` builds from their settings
    assert env["GPUCLOUD_QUEUE"] == uri_from_env(node_env)
    assert node_env["GPUCLOUD_JOB_TABLE"] in env["GPUCLOUD_QUEUE"]
    bucket = env["GPUCLOUD_MONITOR_FILES"].removeprefix("s3://").split("/", 1)[0]
    assert env["GPUCLOUD_REPORTS"] == f"s3://{bucket}/reports/"
    assert env["GPUCLOUD_REPORT_PACKAGE"] == spec.agent.package  # the nodes' wheel
    [topic] = of(resources, TOPIC)
    assert env["GPUCLOUD_ALERT_TOPIC_ARN"].endswith(f":{topic.inputs['name']}")
    [report] = [r for r in of(resources, ROLE_POLICY) if r.name.endswith("monitoring-report")]
    statements = {s["Sid"]: s for s in json.loads(report.inputs["policy"])["Statement"]}
    table_arn = f"arn:aws:dynamodb:{spec.region}:123456789012:table/{node_env['GPUCLOUD_JOB_TABLE']}"
    assert statements["ReadJobTable"]["Resource"] == [table_arn, f"{table_arn}/index/*"]
    assert statements["ReadJobTable"]["Action"] == ["dynamodb:GetItem", "dynamodb:Query"]
    assert statements["WriteReports"]["Resource"] == [f"arn:aws:s3:::{bucket}/reports/*"]
    wheel = spec.agent.package.removeprefix("s3://")
    assert statements["ReportPackage"] == {
        "Sid": "ReportPackage",
        "Effect": "Allow",
        "Action": ["s3:GetObject"],
        "Resource": [f"arn:aws:s3:::{wheel}"],  # that one object, as the nodes' AgentPackage
    }
    queue_arn = f"arn:aws:sqs:{spec.region}:123456789012:{spec.name_for(stack)}-jobplane-jobs"
    assert statements["OpenJobQueue"]["Resource"] == [queue_arn]  # the job queue, then its dead-letter queue
    assert statements["FindDeadLetterQueue"]["Resource"] == [f"{queue_arn}-dlq"]
    assert set(statements) == {"OpenJobQueue", "FindDeadLetterQueue", "ReadJobTable", "WriteReports", "ReportPackage"}


def test_daily_report_false_turns_it_off():
    stack = STACKS[0]
    spec = spec_with(stack, mode="self-hosted", dailyReport=False)
    resources = record(spec, stack)
    assert "GPUCLOUD_REPORT_SCHEDULE" not in monitor_env(resources)
    assert not [r for r in of(resources, ROLE_POLICY) if r.name.endswith("monitoring-report")]


def test_no_daily_report_without_a_package_for_the_monitor_to_install():
    stack = STACKS[0]
    spec = spec_with(stack, mode="self-hosted")
    spec = spec.model_copy(update={"agent": spec.agent.model_copy(update={"package": None})})
    assert not spec.monitoring.daily_report_on(spec.agent.package)
    assert Monitoring(mode="managed").daily_report_on("s3://b/w.whl") is False


def test_staged_monitoring_files_carry_only_the_tags_s3_allows() -> None:
    """S3 takes 10 tags on an object; a stack with a dozen tags of its own would fail every staged
    file's PutObject. They carry the stack, the cluster and the expiry: what the sweep finds them by."""
    from gpucloud.cluster.tags import CLUSTER_TAG, EXPIRES_AT_TAG, MAX_OBJECT_TAGS, STACK_TAG

    spec = spec_with("p4d-spot", mode="self-hosted").model_copy(
        update={"tags": {f"team{i}": "ml" for i in range(12)}, "ttl_hours": 6.0}
    )
    objects = of(record(spec, "p4d-spot"), "aws:s3/bucketObjectv2:BucketObjectv2")
    assert objects
    for staged in objects:
        assert set(staged.inputs["tags"]) == {STACK_TAG, CLUSTER_TAG, EXPIRES_AT_TAG}
        assert len(staged.inputs["tags"]) <= MAX_OBJECT_TAGS
