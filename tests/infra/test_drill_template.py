"""gpucloud:drill under Pulumi mocks: the FIS experiment template interrupts one running spot node
that carries the cluster tag and the drill target tag, with the 2-minute notice; its stop condition
is the job dead-letter alarm; its role is FIS's only and may interrupt only such nodes; the stack
output is what `gpucloud drill` reads; nothing of it exists without the setting. The template's
inputs also pass botocore's own FIS model for CreateExperimentTemplate."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from botocore.exceptions import ParamValidationError
from tests.cli_run import one_line_error, run_cli

from gpucloud.cluster.drill_contract import STACK_OUTPUT, TARGET_TAG, TARGET_VALUE
from gpucloud.cluster.tags import EXPIRES_AT_TAG, STACK_TAG
from gpucloud.infra.preview import ACCOUNT, StackPreview, preview_stack
from gpucloud.policy.least_privilege import wildcard_actions
from gpucloud.policy.tagging import is_taggable
from gpucloud.spec import load_stack_file, stack_file_for
from gpucloud.spec.model import ClusterSpec

from .botocore_check import assert_valid_request
from .stack_outputs import run_with_outputs

TEMPLATE = "aws:fis/experimentTemplate:ExperimentTemplate"
ALARM = "aws:cloudwatch/metricAlarm:MetricAlarm"
ROLE = "aws:iam/role:Role"
ROLE_POLICY = "aws:iam/rolePolicy:RolePolicy"
QUEUE = "aws:sqs/queue:Queue"
REPO = Path(__file__).resolve().parents[2]


def drill_resources(preview: StackPreview) -> list:
    [component] = preview.of_type("gpucloud:drill:SpotDrill")
    return [r for r in preview.resources if r.parent == component.urn]


def one(resources: list, type_token: str):
    [found] = [r for r in resources if r.type == type_token]
    return found


@pytest.fixture(scope="module")
def spot(previews) -> StackPreview:
    return previews["p4d-spot"]


@pytest.fixture(scope="module")
def template(spot) -> dict[str, Any]:
    return one(drill_resources(spot), TEMPLATE).inputs


def test_the_action_sends_the_two_minute_spot_interruption_notice(template) -> None:
    [action] = template["actions"]
    assert action["actionId"] == "aws:ec2:send-spot-instance-interruptions"
    assert action["parameters"] == [{"key": "durationBeforeInterruption", "value": "PT2M"}]
    [target] = template["targets"]
    assert action["target"] == {"key": "SpotInstances", "value": target["name"]}


def test_the_target_is_one_running_spot_instance_of_this_cluster_tagged_for_the_drill(template) -> None:
    [target] = template["targets"]
    assert target["resourceType"] == "aws:ec2:spot-instance"
    assert target["selectionMode"] == "COUNT(1)"
    assert {t["key"]: t["value"] for t in target["resourceTags"]} == {
        "gpucloud:cluster": "p4d-spot",
        TARGET_TAG: TARGET_VALUE,
    }
    assert target["filters"] == [{"path": "State.Name", "values": ["running"]}]
    assert "resourceArns" not in target
    # no tagged instance: the experiment fails rather than passing without an interruption
    assert template["experimentOptions"]["emptyTargetResolutionMode"] == "fail"


def test_the_stop_condition_is_the_job_dead_letter_alarm(spot, template) -> None:
    resources = drill_resources(spot)
    alarm = one(resources, ALARM)
    [stop] = template["stopConditions"]
    assert stop == {
        "source": "aws:cloudwatch:alarm",
        "value": f"arn:aws:cloudwatch:us-east-1:{ACCOUNT}:metricalarm/p4d-spot-drill-stop",  # the mocks' alarm ARN
    }
    [template_resource] = [r for r in resources if r.type == TEMPLATE]
    assert template_resource.property_dependencies["stopConditions"] == [alarm.urn]
    [dlq] = [r for r in spot.of_type(QUEUE) if r.name == "p4d-spot-jobplane-jobs-dlq"]
    inputs = alarm.inputs
    assert inputs["name"] == "p4d-spot-drill-stop"
    assert (inputs["namespace"], inputs["metricName"]) == ("AWS/SQS", "ApproximateNumberOfMessagesVisible")
    assert inputs["dimensions"] == {"QueueName": dlq.name}  # the job plane's DLQ, not the events one
    assert (inputs["comparisonOperator"], inputs["threshold"]) == ("GreaterThanThreshold", 0)
    assert inputs["treatMissingData"] == "notBreaching"  # an idle, empty DLQ publishes nothing


def test_the_role_is_for_fis_in_this_account_and_region_only(spot, template) -> None:
    resources = drill_resources(spot)
    role = one(resources, ROLE)
    assert template["roleArn"] == f"arn:aws:iam::{ACCOUNT}:role/{role.name}"
    [statement] = json.loads(role.inputs["assumeRolePolicy"])["Statement"]
    assert statement["Principal"] == {"Service": "fis.amazonaws.com"}
    assert statement["Action"] == "sts:AssumeRole"
    assert statement["Condition"] == {
        "StringEquals": {"aws:SourceAccount": ACCOUNT},
        "ArnLike": {"aws:SourceArn": f"arn:aws:fis:us-east-1:{ACCOUNT}:experiment/*"},
    }


def test_the_role_may_interrupt_only_the_clusters_drill_target(spot) -> None:
    resources = drill_resources(spot)
    policy = one(resources, ROLE_POLICY)
    document = json.loads(policy.inputs["policy"])
    by_sid = {s["Sid"]: s for s in document["Statement"]}
    assert set(by_sid) == {"InterruptDrillTarget", "ResolveTargets"}
    interrupt = by_sid["InterruptDrillTarget"]
    assert interrupt["Action"] == ["ec2:SendSpotInstanceInterruptions"]
    assert interrupt["Resource"] == [f"arn:aws:ec2:us-east-1:{ACCOUNT}:instance/*"]
    assert interrupt["Condition"] == {
        "StringEquals": {"aws:ResourceTag/gpucloud:cluster": "p4d-spot", f"aws:ResourceTag/{TARGET_TAG}": TARGET_VALUE}
    }
    assert by_sid["ResolveTargets"]["Action"] == ["ec2:DescribeInstances"]
    assert wildcard_actions(document) == []
    assert policy.property_dependencies["role"] == [one(resources, ROLE).urn]


def test_every_drill_resource_carries_the_stack_tag_and_expires_at() -> None:
    spec = load_stack_file(stack_file_for("p4d-spot")).model_copy(update={"ttl_hours": 6})
    resources = record(spec, "p4d-spot")
    [component] = [r for r in resources if r.type == "gpucloud:drill:SpotDrill"]
    mine = [r for r in resources if r.parent == component.urn and is_taggable(r.type)]
    assert {r.type for r in mine} == {TEMPLATE, ALARM, ROLE}
    for r in mine:
        assert r.inputs["tags"][STACK_TAG] == "p4d-spot", r.name
        assert r.inputs["tags"][EXPIRES_AT_TAG].endswith("Z"), r.name


def record(spec: ClusterSpec, stack: str) -> list:
    return preview_stack(spec, stack).resources


def exported(spec: ClusterSpec, stack: str) -> dict[str, Any]:
    return run_with_outputs(spec, stack)[1]


def test_the_stack_output_names_the_template_role_and_alarm() -> None:
    outputs = exported(load_stack_file(stack_file_for("p4d-spot")), "p4d-spot")
    assert outputs[STACK_OUTPUT] == {
        "experimentTemplateId": "p4d-spot-drill-template-id",  # the mocks' id for the template
        "roleArn": f"arn:aws:iam::{ACCOUNT}:role/p4d-spot-drill-fis",
        "stopAlarmName": "p4d-spot-drill-stop",
    }


def test_off_by_default_even_on_a_spot_stack(previews) -> None:
    spec = load_stack_file(stack_file_for("dev"))
    assert spec.drill is False and any(g.capacity.type == "spot" for g in spec.node_groups)
    assert not [r for r in previews["dev"].resources if "drill" in r.type or r.type == TEMPLATE]
    assert STACK_OUTPUT not in exported(spec, "dev")


def test_drill_without_a_spot_group_is_one_clear_line(tmp_path, capsys) -> None:
    config = yaml.safe_load((REPO / "stacks" / "Pulumi.dev.yaml").read_text())["config"]
    for group in config["gpucloud:nodeGroups"]:
        group["capacity"] = {"type": "on-demand"}
        if "instanceTypes" in group:  # several types are for spot groups only: keep the first
            group["instanceType"] = group.pop("instanceTypes")[0]["instanceType"]
    config["gpucloud:drill"] = True
    path = tmp_path / "Pulumi.nospot.yaml"
    path.write_text(yaml.safe_dump({"config": config}))
    code, out, err = run_cli(capsys, "plan", "--stack-file", str(path), "--output", "json")
    assert code == 2 and out == ""
    line = one_line_error(err)
    assert line.startswith(
        f"gpucloud: error: {path}: gpucloud:drill = True: needs a node group with capacity.type: spot"
    )


def test_plan_lists_the_template(capsys) -> None:
    code, out, _ = run_cli(capsys, "plan", "--stack", "p4d-spot", "--output", "json")
    plan = json.loads(out)
    assert code == 0 and plan["policy_violations"] == []
    assert [r["name"] for r in plan["resources"] if r["type"] == TEMPLATE] == ["p4d-spot-drill-template"]


# -- the template as the FIS API receives it ---------------------------------------------------


def create_request(inputs: dict[str, Any]) -> dict[str, Any]:
    """CreateExperimentTemplate's parameters for the recorded Pulumi inputs: the provider turns the
    named action and target lists into maps and key/value lists into objects. Unknown keys pass
    through untouched, so botocore refuses a field the API does not have."""
    request = {k: v for k, v in inputs.items() if k not in ("actions", "targets")}
    request["clientToken"] = "drill-test"
    request["actions"] = {}
    for action in inputs["actions"]:
        body = {k: v for k, v in action.items() if k not in ("name", "parameters", "target")}
        body["parameters"] = {p["key"]: p["value"] for p in action.get("parameters", [])}
        body["targets"] = {action["target"]["key"]: action["target"]["value"]}
        request["actions"][action["name"]] = body
    request["targets"] = {}
    for target in inputs["targets"]:
        body = {k: v for k, v in target.items() if k not in ("name", "resourceTags")}
        body["resourceTags"] = {t["key"]: t["value"] for t in target.get("resourceTags", [])}
        request["targets"][target["name"]] = body
    return request


def test_the_template_is_a_valid_create_experiment_template_request(template) -> None:
    assert_valid_request("fis", "create_experiment_template", create_request(template))


def test_the_request_check_refuses_a_field_the_fis_api_lacks(template) -> None:
    # the check above has teeth: one misnamed target field and botocore refuses the request
    request = create_request(template)
    target = next(iter(request["targets"].values()))
    target["resourceTag"] = target.pop("resourceTags")
    with pytest.raises(ParamValidationError, match="resourceTag"):
        assert_valid_request("fis", "create_experiment_template", request)
