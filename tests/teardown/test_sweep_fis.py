"""gpucloud sweep finds and deletes the FIS experiment template a gpucloud:drill stack leaves behind
(moto server), and only the stack's: untagged, other-stack and keep=true templates stay."""

from __future__ import annotations

import datetime as dt
from typing import Any

from gpucloud.cluster.tags import KEEP_TAG, STACK_TAG
from gpucloud.teardown.plan import Selection
from gpucloud.teardown.sweep import sweep

REGION = "us-east-1"


def make_template(fis: Any, tags: dict[str, str]) -> str:
    """A drill-like template (the shape infra/drill.py creates); its id."""
    made = fis.create_experiment_template(
        clientToken=f"t-{len(fis.list_experiment_templates()['experimentTemplates'])}",
        description="gpucloud drill",
        roleArn="arn:aws:iam::123456789012:role/drill-fis",
        stopConditions=[{"source": "none"}],
        targets={
            "drill-target": {
                "resourceType": "aws:ec2:spot-instance",
                "resourceTags": {"gpucloud:drill-target": "true"},
                "selectionMode": "COUNT(1)",
            }
        },
        actions={
            "interrupt": {
                "actionId": "aws:ec2:send-spot-instance-interruptions",
                "parameters": {"durationBeforeInterruption": "PT2M"},
                "targets": {"SpotInstances": "drill-target"},
            }
        },
        tags=tags,
    )
    return str(made["experimentTemplate"]["id"])


def templates(fis: Any) -> set[str]:
    return {t["id"] for t in fis.list_experiment_templates()["experimentTemplates"]}


def test_sweep_deletes_the_stacks_fis_template_and_nothing_else(client) -> None:
    fis = client("fis")
    leaked = make_template(fis, {STACK_TAG: "ci-42", "Name": "ci-42-drill"})
    untagged = make_template(fis, {"Name": "ci-42-drill"})
    other_stack = make_template(fis, {STACK_TAG: "prod"})
    kept = make_template(fis, {STACK_TAG: "ci-42", KEEP_TAG: "true"})
    now = dt.datetime.now(dt.timezone.utc)

    outcomes = sweep(client, REGION, Selection(stack="ci-42"), delete=True, now=now)

    by_id = {o.decision.found.ident: o for o in outcomes if o.decision.found.kind == "fis:experiment-template"}
    assert set(by_id) == {leaked, kept}
    assert by_id[leaked].to_json()["result"] == "deleted"
    assert by_id[leaked].to_json()["arn"] == f"arn:aws:fis:{REGION}:123456789012:experiment-template/{leaked}"
    assert by_id[leaked].to_json()["created"] is not None
    assert by_id[kept].action == "skip"
    assert templates(fis) == {untagged, other_stack, kept}
    again = sweep(client, REGION, Selection(stack="ci-42"), delete=True, now=now)
    assert [o.decision.found.ident for o in again if o.action != "skip"] == []
