"""drill/fis.py's AWS calls against botocore's real FIS, EC2 and CloudWatch models (the Stubber
checks every request's parameter names and types, and every canned reply's shape)."""

from __future__ import annotations

import datetime as dt
from typing import Any

import boto3
import pytest
from botocore.stub import Stubber
from tests.signals.helpers import FakeClock

from gpucloud.cluster.drill_contract import TARGET_TAG
from gpucloud.drill import fis
from gpucloud.errors import UserError

from .fis_replies import EXPERIMENT_ID, TEMPLATE_ID, experiment

INSTANCE = "i-0123456789abcdef0"
STARTED = dt.datetime(2026, 11, 24, 12, 0, 0, tzinfo=dt.timezone.utc)


def client(service: str) -> Any:
    return boto3.client(service, region_name="us-east-1", aws_access_key_id="x", aws_secret_access_key="x")


@pytest.fixture
def stubbed():
    """(client, stubber) per service; every canned reply must have been asked for."""
    made: list[Stubber] = []

    def make(service: str) -> tuple[Any, Stubber]:
        c = client(service)
        stub = Stubber(c)
        stub.activate()
        made.append(stub)
        return c, stub

    yield make
    for stub in made:
        stub.assert_no_pending_responses()
        stub.deactivate()


def test_start_experiment_sends_the_template_a_client_token_and_tags(stubbed):
    c, stub = stubbed("fis")
    tags = {"gpucloud:stack": "p4d-spot", "gpucloud:drill-job": "j-1"}
    stub.add_response(
        "start_experiment",
        experiment("initiating"),
        {"clientToken": "gpucloud-drill-j-1", "experimentTemplateId": TEMPLATE_ID, "tags": tags},
    )
    started = fis.start_experiment(c, TEMPLATE_ID, client_token="gpucloud-drill-j-1", tags=tags)
    assert started["id"] == EXPERIMENT_ID
    assert fis.status_of(started) == "initiating"


def test_follow_experiment_polls_until_completed(stubbed):
    c, stub = stubbed("fis")
    for status in ("pending", "initiating", "running", "running"):
        stub.add_response("get_experiment", experiment(status), {"id": EXPERIMENT_ID})
    action = {"actionId": fis.SPOT_ACTION_ID, "startTime": STARTED, "state": {"status": "completed"}}
    stub.add_response(
        "get_experiment",
        experiment("completed", actions={"interrupt": action}, startTime=STARTED),
        {"id": EXPERIMENT_ID},
    )
    clock, seen = FakeClock(start=0.0), []
    final = fis.follow_experiment(
        c,
        EXPERIMENT_ID,
        poll_interval_s=5.0,
        deadline=1000.0,
        on_poll=lambda e: seen.append(fis.status_of(e)),
        clock=clock,
        sleep=clock.sleep,
    )
    assert seen == ["pending", "initiating", "running", "running", "completed"]
    assert clock.slept == [5.0] * 4  # one wait between polls, none after the final state
    assert fis.injected_at(final, fallback=0.0) == STARTED.timestamp()
    assert fis.summary(final, TEMPLATE_ID)["state"] == "completed"


@pytest.mark.parametrize(
    ("status", "reason", "code", "expected"),
    [
        (
            "failed",
            "Target resolution returned empty set",
            "TargetResolutionFailed",
            f"experiment {EXPERIMENT_ID} failed: Target resolution returned empty set (TargetResolutionFailed)",
        ),
        (
            "stopped",
            "Experiment stopped by stop condition",
            None,
            f"experiment {EXPERIMENT_ID} stopped: Experiment stopped by stop condition",
        ),
        ("cancelled", None, None, f"experiment {EXPERIMENT_ID} cancelled: no reason given"),
    ],
)
def test_an_experiment_that_ends_otherwise_is_one_line_with_its_reason(stubbed, status, reason, code, expected):
    c, stub = stubbed("fis")
    stub.add_response("get_experiment", experiment("running"), {"id": EXPERIMENT_ID})
    stub.add_response("get_experiment", experiment(status, reason, code=code), {"id": EXPERIMENT_ID})
    clock = FakeClock(start=0.0)
    with pytest.raises(fis.ExperimentUnsuccessful) as raised:
        fis.follow_experiment(c, EXPERIMENT_ID, poll_interval_s=1, deadline=100, clock=clock, sleep=clock.sleep)
    assert str(raised.value) == expected
    assert raised.value.exit_code == 1


def test_following_gives_up_at_the_deadline(stubbed):
    c, stub = stubbed("fis")
    for _ in range(3):
        stub.add_response("get_experiment", experiment("running"), {"id": EXPERIMENT_ID})
    clock = FakeClock(start=0.0)
    with pytest.raises(TimeoutError, match="still running"):
        fis.follow_experiment(c, EXPERIMENT_ID, poll_interval_s=5, deadline=10, clock=clock, sleep=clock.sleep)
    assert clock.slept == [5, 5]


def test_an_aws_error_is_one_line_naming_the_call(stubbed):
    c, stub = stubbed("fis")
    stub.add_client_error(
        "start_experiment",
        service_error_code="AccessDeniedException",
        service_message="User is not authorized to perform: fis:StartExperiment",
        http_status_code=403,
    )
    with pytest.raises(UserError) as raised:
        fis.start_experiment(c, TEMPLATE_ID, client_token="t", tags={})
    message = str(raised.value)
    assert message == (
        f"fis StartExperiment (template {TEMPLATE_ID}) failed: AccessDeniedException: "
        "User is not authorized to perform: fis:StartExperiment"
    )
    assert "\n" not in message and raised.value.exit_code == 1


def test_the_target_tag_goes_on_and_comes_off_exactly_one_instance(stubbed):
    c, stub = stubbed("ec2")
    tag = [{"Key": TARGET_TAG, "Value": "true"}]
    stub.add_response("create_tags", {}, {"Resources": [INSTANCE], "Tags": tag})
    stub.add_response("delete_tags", {}, {"Resources": [INSTANCE], "Tags": tag})
    fis.tag_target(c, INSTANCE)
    fis.untag_target(c, INSTANCE)


def template(parameters: dict[str, str] | None, action_id: str = fis.SPOT_ACTION_ID) -> dict[str, Any]:
    action: dict[str, Any] = {"actionId": action_id, "targets": {"SpotInstances": "drill-target"}}
    if parameters is not None:
        action["parameters"] = parameters
    return {"experimentTemplate": {"id": TEMPLATE_ID, "actions": {"interrupt-one-spot-node": action}}}


@pytest.mark.parametrize(
    ("parameters", "lead"),
    [
        ({"durationBeforeInterruption": "PT2M"}, 120.0),
        ({"durationBeforeInterruption": "PT1M30S"}, 90.0),
        ({"durationBeforeInterruption": "PT15M"}, 900.0),
        (None, 120.0),  # the action's default: two minutes
    ],
)
def test_the_lead_comes_from_the_templates_spot_action(stubbed, parameters, lead):
    c, stub = stubbed("fis")
    stub.add_response("get_experiment_template", template(parameters), {"id": TEMPLATE_ID})
    assert fis.template_lead_seconds(fis.get_template(c, TEMPLATE_ID)) == lead


def test_a_template_without_the_spot_action_or_with_a_bad_lead_is_refused():
    with pytest.raises(UserError, match="has no aws:ec2:send-spot-instance-interruptions action"):
        fis.template_lead_seconds(template(None, action_id="aws:ec2:stop-instances")["experimentTemplate"])
    with pytest.raises(UserError, match="'2 minutes' is not an ISO 8601 duration like PT2M"):
        fis.template_lead_seconds(template({"durationBeforeInterruption": "2 minutes"})["experimentTemplate"])


@pytest.mark.parametrize(
    ("alarms", "refused"),
    [
        ([{"AlarmName": "c-drill-stop", "StateValue": "OK"}], None),
        ([{"AlarmName": "c-drill-stop", "StateValue": "INSUFFICIENT_DATA"}], None),
        ([{"AlarmName": "c-drill-stop", "StateValue": "ALARM"}], "is in ALARM"),
        ([], "does not exist"),
    ],
)
def test_a_stop_alarm_in_alarm_refuses_the_drill(stubbed, alarms, refused):
    c, stub = stubbed("cloudwatch")
    stub.add_response("describe_alarms", {"MetricAlarms": alarms}, {"AlarmNames": ["c-drill-stop"]})
    if refused is None:
        fis.check_stop_alarm(c, "c-drill-stop")
    else:
        with pytest.raises(UserError, match=refused):
            fis.check_stop_alarm(c, "c-drill-stop")


def test_stop_experiment_names_the_experiment(stubbed):
    c, stub = stubbed("fis")
    stub.add_response("stop_experiment", experiment("stopping"), {"id": EXPERIMENT_ID})
    fis.stop_experiment(c, EXPERIMENT_ID)
