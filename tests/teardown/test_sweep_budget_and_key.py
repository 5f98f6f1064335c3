"""gpucloud sweep removes what keeps billing after a stack is gone: its AWS Budgets budget (global,
like IAM; botocore Stubber, since moto has no budget tags) and its customer managed KMS keys (moto
server), whose deletion KMS only schedules: the shortest wait, and the sweep says so."""

from __future__ import annotations

import datetime as dt
from typing import Any

import boto3
from botocore.stub import Stubber

from gpucloud.cluster.tags import KEEP_TAG, STACK_TAG
from gpucloud.teardown.delete import Deleter
from gpucloud.teardown.discover import Discovery
from gpucloud.teardown.model import Found, kind_from_arn
from gpucloud.teardown.plan import Selection
from gpucloud.teardown.sweep import sweep

REGION = "us-east-1"
ACCOUNT = "123456789012"


def make_key(kms: Any, tags: dict[str, str]) -> str:
    made = kms.create_key(
        Description="gpucloud budget topic", Tags=[{"TagKey": k, "TagValue": v} for k, v in tags.items()]
    )
    return str(made["KeyMetadata"]["KeyId"])


def test_sweep_schedules_the_deletion_of_the_stacks_keys_in_seven_days_and_spares_the_rest(client) -> None:
    kms = client("kms")
    leaked = make_key(kms, {STACK_TAG: "ci-42", "Name": "ci-42-budget-key"})
    untagged, other = make_key(kms, {"Name": "ci-42-budget-key"}), make_key(kms, {STACK_TAG: "prod"})
    kept = make_key(kms, {STACK_TAG: "ci-42", KEEP_TAG: "true"})
    now = dt.datetime.now(dt.timezone.utc)

    outcomes = sweep(client, REGION, Selection(stack="ci-42"), delete=True, now=now)

    keys = {o.decision.found.ident: o for o in outcomes if o.decision.found.kind == "kms:key"}
    assert set(keys) == {leaked, kept}
    assert keys[leaked].result == "deletion scheduled: KMS deletes it in 7 days (the shortest wait KMS allows)"
    assert keys[kept].result == "skipped: gpucloud:keep=true"
    assert outcomes[-1].decision.found.kind == "kms:key"  # after every topic and bucket it may encrypt
    state = {k: kms.describe_key(KeyId=k)["KeyMetadata"] for k in (leaked, untagged, other, kept)}
    assert state[leaked]["KeyState"] == "PendingDeletion"
    assert dt.timedelta(days=6, hours=23) < state[leaked]["DeletionDate"] - now <= dt.timedelta(days=7, minutes=5)
    assert {state[k]["KeyState"] for k in (untagged, other, kept)} == {"Enabled"}

    again = sweep(client, REGION, Selection(stack="ci-42"), delete=False, now=now)
    assert [o.decision.found.ident for o in again if o.decision.found.kind == "kms:key"] == [kept]  # scheduled: gone


def test_sweep_finds_and_deletes_the_stacks_budget_by_its_tags() -> None:
    budgets = boto3.client("budgets", region_name="us-east-1", aws_access_key_id="a", aws_secret_access_key="b")
    stub = Stubber(budgets)
    listed = [{"BudgetName": n, "TimeUnit": "MONTHLY", "BudgetType": "COST"} for n in ("gpucloud-ci-42", "team")]
    stub.add_response("describe_budgets", {"Budgets": listed}, {"AccountId": ACCOUNT})
    arn = f"arn:aws:budgets::{ACCOUNT}:budget/gpucloud-ci-42"
    stub.add_response(
        "list_tags_for_resource",
        {"ResourceTags": [{"Key": STACK_TAG, "Value": "ci-42"}, {"Key": "Name", "Value": "ci-42-budget"}]},
        {"ResourceARN": arn},
    )
    stub.add_response(
        "list_tags_for_resource", {"ResourceTags": []}, {"ResourceARN": f"arn:aws:budgets::{ACCOUNT}:budget/team"}
    )
    stub.add_response("delete_budget", {}, {"AccountId": ACCOUNT, "BudgetName": "gpucloud-ci-42"})

    with stub:
        (found,) = Discovery(lambda service: budgets, REGION, ACCOUNT).budgets("ci-42")
        assert (found.arn, found.kind, found.ident, found.stack) == (arn, "budgets:budget", "gpucloud-ci-42", "ci-42")
        assert Deleter(lambda service: budgets).delete(found) == "deleted"
        stub.assert_no_pending_responses()


def test_the_budget_stop_function_is_deleted_by_name() -> None:
    functions = boto3.client("lambda", region_name="us-east-1", aws_access_key_id="a", aws_secret_access_key="b")
    arn = f"arn:aws:lambda:{REGION}:{ACCOUNT}:function:ci-42-budget-stop"
    found = Found(arn, *kind_from_arn(arn), {STACK_TAG: "ci-42"})
    with Stubber(functions) as stub:
        stub.add_response("delete_function", {}, {"FunctionName": "ci-42-budget-stop"})
        assert Deleter(lambda service: functions).delete(found) == "deleted"
