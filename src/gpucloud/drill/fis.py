"""The AWS calls of a drill on a cluster: the target tag (EC2), the stop alarm (CloudWatch) and the
experiment (AWS FIS). Each takes its boto3 client as an argument, so tests hand in clients under
botocore's Stubber, which checks every request against the service's real model.

- The target: ``drill.contract.TARGET_TAG`` on exactly one instance (CreateTags, DeleteTags).
  The stack's template selects by that tag, so the experiment can reach no other node.
- The stop condition: the template stops the experiment when its alarm fires; an alarm already in
  ALARM would stop it at once (FIS checks stop conditions when an experiment starts,
  https://docs.aws.amazon.com/fis/latest/userguide/stop-conditions.html), so a drill refuses to
  start then.
- The experiment: StartExperiment with a client token (a retried start after a lost reply does
  not start a second experiment) and tags naming the drill; GetExperiment until its state is final.
  States: pending, initiating, running, completed, stopping, stopped, failed, cancelled
  (https://docs.aws.amazon.com/fis/latest/APIReference/API_ExperimentState.html); only
  ``completed`` means the interruption was sent; ``stopped`` (a stop condition fired, or someone
  stopped it), ``failed`` (e.g. no target resolved) and ``cancelled`` end the drill with
  the state's reason.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Mapping
from typing import Any

from gpucloud.cluster.drill_contract import LEAD_PARAMETER, SPOT_ACTION_ID, TARGET_TAG, TARGET_VALUE
from gpucloud.errors import UserError, error_line

DEFAULT_LEAD_SECONDS = 120.0  # a real spot reclaim's two minutes, and the action's documented default
COMPLETED = "completed"
UNSUCCESSFUL = frozenset({"stopped", "failed", "cancelled"})
FINAL = UNSUCCESSFUL | {COMPLETED}
_DURATION = re.compile(r"PT(?:(?P<h>\d+(?:\.\d+)?)H)?(?:(?P<m>\d+(?:\.\d+)?)M)?(?:(?P<s>\d+(?:\.\d+)?)S)?")


class ExperimentUnsuccessful(UserError):
    """The experiment ended without sending the interruption (stopped, failed, cancelled): no verdict."""

    exit_code = 1


def aws_error(call: str, err: BaseException) -> UserError:
    """One line for a failed AWS call: the call, the error code and AWS's message."""
    from botocore.exceptions import ClientError

    if isinstance(err, ClientError):
        error = err.response.get("Error", {})
        text = f"{error.get('Code', 'Error')}: {error.get('Message', '')}".strip().rstrip(":")
    else:
        text = error_line(err)
    return UserError(f"{call} failed: {text}", exit_code=1)


def _call(what: str, fn: Callable[..., Any], **request: Any) -> Any:
    from botocore.exceptions import BotoCoreError, ClientError

    try:
        return fn(**request)
    except (BotoCoreError, ClientError) as err:
        raise aws_error(what, err) from None


def iso_duration_seconds(text: str) -> float:
    """Seconds of an ISO 8601 time duration as FIS writes them (``PT2M``, ``PT90S``, ``PT1M30S``)."""
    match = _DURATION.fullmatch(text.strip())
    if match is None or not any(match.groupdict().values()):
        raise UserError(f"{LEAD_PARAMETER} {text!r} is not an ISO 8601 duration like PT2M")
    parts = {k: float(v) for k, v in match.groupdict().items() if v}
    return parts.get("h", 0.0) * 3600 + parts.get("m", 0.0) * 60 + parts.get("s", 0.0)


def template_lead_seconds(template: Mapping[str, Any]) -> float:
    """The notice's lead the template's spot action gives (its ``durationBeforeInterruption``,
    default two minutes: https://docs.aws.amazon.com/fis/latest/userguide/fis-actions-reference.html#send-spot-instance-interruptions)."""
    for action in (template.get("actions") or {}).values():
        if action.get("actionId") == SPOT_ACTION_ID:
            value = (action.get("parameters") or {}).get(LEAD_PARAMETER)
            return DEFAULT_LEAD_SECONDS if value is None else iso_duration_seconds(value)
    raise UserError(
        f"experiment template {template.get('id')} has no {SPOT_ACTION_ID} action; it is not the stack's drill "
        "template (run `pulumi up` with gpucloud:drill: true)"
    )


def get_template(fis: Any, template_id: str) -> dict[str, Any]:
    return _call(f"fis GetExperimentTemplate {template_id}", fis.get_experiment_template, id=template_id)[
        "experimentTemplate"
    ]


def check_stop_alarm(cloudwatch: Any, alarm_name: str) -> None:
    """Refuse to start while the stop condition's alarm is in ALARM (the experiment would stop at once)."""
    reply = _call(f"cloudwatch DescribeAlarms {alarm_name}", cloudwatch.describe_alarms, AlarmNames=[alarm_name])
    alarms = reply.get("MetricAlarms", [])
    if not alarms:
        raise UserError(
            f"the drill's stop alarm {alarm_name} does not exist; run `pulumi up` on the stack", exit_code=1
        )
    if alarms[0].get("StateValue") == "ALARM":
        raise UserError(
            f"the drill's stop alarm {alarm_name} is in ALARM (a job slot is on the dead-letter queue): "
            "inspect and clear the dead letters first; a drill needs a steady state to start from",
            exit_code=1,
        )


def tag_target(ec2: Any, instance_id: str) -> None:
    tag = [{"Key": TARGET_TAG, "Value": TARGET_VALUE}]
    _call(f"ec2 CreateTags {TARGET_TAG} on {instance_id}", ec2.create_tags, Resources=[instance_id], Tags=tag)


def untag_target(ec2: Any, instance_id: str) -> None:
    # Naming the value too: a tag someone set to another value on purpose stays.
    tag = [{"Key": TARGET_TAG, "Value": TARGET_VALUE}]
    _call(f"ec2 DeleteTags {TARGET_TAG} on {instance_id}", ec2.delete_tags, Resources=[instance_id], Tags=tag)


def start_experiment(fis: Any, template_id: str, *, client_token: str, tags: Mapping[str, str]) -> dict[str, Any]:
    reply = _call(
        f"fis StartExperiment (template {template_id})",
        fis.start_experiment,
        clientToken=client_token,
        experimentTemplateId=template_id,
        tags=dict(tags),
    )
    return reply["experiment"]


def stop_experiment(fis: Any, experiment_id: str) -> None:
    _call(f"fis StopExperiment {experiment_id}", fis.stop_experiment, id=experiment_id)


def status_of(experiment: Mapping[str, Any]) -> str:
    return str((experiment.get("state") or {}).get("status", "pending"))


def unsuccessful_line(experiment: Mapping[str, Any]) -> str:
    """``experiment EXP failed: <reason> (<error code>)``: the one line a failed experiment becomes."""
    state = experiment.get("state") or {}
    reason = " ".join(str(state.get("reason") or "no reason given").split())
    code = (state.get("error") or {}).get("code")
    return f"experiment {experiment.get('id')} {status_of(experiment)}: {reason}" + (f" ({code})" if code else "")


def follow_experiment(
    fis: Any,
    experiment_id: str,
    *,
    poll_interval_s: float,
    deadline: float,
    on_poll: Callable[[dict[str, Any]], None] = lambda experiment: None,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> dict[str, Any]:
    """GetExperiment until the experiment's state is final; ``on_poll`` sees each reply.
    Returns the completed experiment; raises ``ExperimentUnsuccessful`` (one line, the state's
    reason) when it ended otherwise, and ``TimeoutError`` at ``deadline`` (on ``clock``)."""
    while True:
        experiment = _call(f"fis GetExperiment {experiment_id}", fis.get_experiment, id=experiment_id)["experiment"]
        on_poll(experiment)
        status = status_of(experiment)
        if status == COMPLETED:
            return experiment
        if status in UNSUCCESSFUL:
            raise ExperimentUnsuccessful(unsuccessful_line(experiment))
        if clock() >= deadline:
            raise TimeoutError(f"experiment {experiment_id} still {status}")
        sleep(poll_interval_s)


def injected_at(experiment: Mapping[str, Any], fallback: float) -> float:
    """When the interruption was sent (epoch seconds): the spot action's start, else the
    experiment's start, else ``fallback`` (when StartExperiment returned)."""
    for action in (experiment.get("actions") or {}).values():
        if action.get("actionId") == SPOT_ACTION_ID and action.get("startTime") is not None:
            return _epoch(action["startTime"])
    start = experiment.get("startTime")
    return fallback if start is None else _epoch(start)


def summary(experiment: Mapping[str, Any], template_id: str) -> dict[str, Any]:
    """What the verdict's ``experiment`` holds: ids, the final state and its reason, when it ran (epoch
    seconds under ``*_at`` keys: ISO 8601 in JSON output)."""
    state = experiment.get("state") or {}
    return {
        "id": experiment.get("id"),
        "template_id": template_id,
        "state": status_of(experiment),
        "reason": state.get("reason"),
        "started_at": None if experiment.get("startTime") is None else _epoch(experiment["startTime"]),
        "ended_at": None if experiment.get("endTime") is None else _epoch(experiment["endTime"]),
    }


def _epoch(value: Any) -> float:
    """botocore parses timestamps to datetimes; epoch numbers pass through."""
    return float(value.timestamp()) if hasattr(value, "timestamp") else float(value)
