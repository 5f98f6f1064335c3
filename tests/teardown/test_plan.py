"""Sweep planning, pure: what is deleted, in which order, what is skipped and why."""

from __future__ import annotations

import datetime as dt

import pytest

from gpucloud.errors import UserError
from gpucloud.teardown.model import Found, kind_from_arn
from gpucloud.teardown.plan import Selection, parse_duration, plan_sweep

NOW = dt.datetime(2026, 11, 24, 12, 0, tzinfo=dt.timezone.utc)
A = "arn:aws:ec2:us-east-1:123456789012"


def found(arn: str, stack: str | None = "ci", created: dt.datetime | None = None, **tags: str) -> Found:
    kind, ident = kind_from_arn(arn)
    base = {"gpucloud:stack": stack} if stack else {}
    return Found(
        arn, kind, ident, {**base, **{k.replace("_", ":", 1).replace("_", "-"): v for k, v in tags.items()}}, created
    )


@pytest.mark.parametrize(
    ("arn", "kind", "ident"),
    [
        (f"{A}:vpc/vpc-1", "ec2:vpc", "vpc-1"),
        ("arn:aws:s3:::ckpt-bucket", "s3:bucket", "ckpt-bucket"),
        ("arn:aws:sqs:us-east-1:1:jobs", "sqs:queue", "jobs"),
        ("arn:aws:iam::1:role/gpucloud/node", "iam:role", "node"),
        (
            "arn:aws:autoscaling:us-east-1:1:autoScalingGroup:u-u-i-d:autoScalingGroupName/dev-asg",
            "autoscaling:autoScalingGroup",
            "dev-asg",
        ),
        ("arn:aws:logs:us-east-1:1:log-group:/gpucloud/dev:*", "logs:log-group", "/gpucloud/dev"),
        ("arn:aws:cloudwatch:us-east-1:1:alarm:dev-backlog", "cloudwatch:alarm", "dev-backlog"),
        ("arn:aws:fsx:us-east-1:1:file-system/fs-1", "fsx:file-system", "fs-1"),
        ("arn:aws:lambda:us-east-1:1:function:dev-budget-stop", "lambda:function", "dev-budget-stop"),
        ("arn:aws:kms:us-east-1:1:key/1234abcd-12ab", "kms:key", "1234abcd-12ab"),
    ],
)
def test_kind_and_id_from_arn(arn: str, kind: str, ident: str) -> None:
    assert kind_from_arn(arn) == (kind, ident)


def test_dependency_order_and_skips() -> None:
    items = [
        found("arn:aws:s3:::ckpt"),
        found(f"{A}:vpc/vpc-1"),
        found(f"{A}:subnet/subnet-1"),
        found(f"{A}:instance/i-1"),
        found("arn:aws:autoscaling:us-east-1:1:autoScalingGroup:x:autoScalingGroupName/g"),
        found(f"{A}:natgateway/nat-1"),
        found(f"{A}:elastic-ip/eipalloc-1"),
        found("arn:aws:s3:::precious", gpucloud_keep="TRUE"),
        found("arn:aws:kafka:us-east-1:1:cluster/x/y"),
        found(f"{A}:vpc/vpc-other", stack="other"),
        found(f"{A}:vpc/vpc-untagged", stack=None),
    ]
    decisions = plan_sweep(items, Selection(stack="ci"), NOW)
    deleted = [d.found.ident for d in decisions if d.delete]
    assert deleted == ["g", "i-1", "nat-1", "eipalloc-1", "subnet-1", "vpc-1", "ckpt"]
    skipped = {d.found.ident: d.reason for d in decisions if not d.delete}
    assert skipped == {
        "precious": "gpucloud:keep=TRUE",  # the tag as written
        "x/y": "sweep does not delete kafka:cluster resources; delete it by hand",
    }
    every = plan_sweep(items, Selection(stack=None), NOW)
    assert {d.found.ident: d.reason for d in every if not d.delete}["vpc-untagged"] == "no gpucloud:stack tag"
    assert "vpc-other" in [d.found.ident for d in every if d.delete]


def test_age_comes_from_the_stack_when_the_resource_has_none() -> None:
    old = NOW - dt.timedelta(hours=8)
    items = [
        found(f"{A}:instance/i-1", created=old),
        found(f"{A}:vpc/vpc-1"),  # no creation time of its own: as old as its stack
        found(f"{A}:vpc/vpc-2", stack="fresh"),  # a stack with no known time at all
        found(f"{A}:instance/i-2", stack="young", created=NOW - dt.timedelta(hours=1)),
    ]
    decisions = {
        d.found.ident: d for d in plan_sweep(items, Selection(stack=None, older_than=dt.timedelta(hours=6)), NOW)
    }
    assert decisions["vpc-1"].delete and decisions["vpc-1"].age_from == old
    assert decisions["vpc-2"].reason.startswith("creation time unknown")
    assert decisions["i-2"].reason.startswith("younger than --older-than")


def test_expired_reads_the_tag() -> None:
    items = [
        found(f"{A}:vpc/vpc-past", gpucloud_expires_at="2026-11-24T11:59:59Z"),
        found(f"{A}:vpc/vpc-future", gpucloud_expires_at="2026-11-24T12:00:01Z"),
        found(f"{A}:vpc/vpc-none"),
        found(f"{A}:vpc/vpc-garbage", gpucloud_expires_at="soon"),
    ]
    decisions = {d.found.ident: d for d in plan_sweep(items, Selection(stack="ci", expired_only=True), NOW)}
    assert [k for k, d in decisions.items() if d.delete] == ["vpc-past"]
    assert (
        decisions["vpc-none"].reason == decisions["vpc-garbage"].reason == "no gpucloud:expires-at tag (or not a time)"
    )


@pytest.mark.parametrize(
    ("text", "seconds"), [("6h", 21600), ("30m", 1800), ("2d", 172800), ("1.5h", 5400), ("90s", 90)]
)
def test_durations(text: str, seconds: float) -> None:
    assert parse_duration(text).total_seconds() == seconds


@pytest.mark.parametrize("text", ["6", "h", "-1h", "0h", "6 hours", ""])
def test_bad_durations(text: str) -> None:
    with pytest.raises(UserError, match="allowed: a positive number and a unit"):
        parse_duration(text)


def test_hourly_cost_of_what_was_found_comes_from_the_catalog() -> None:
    from gpucloud.catalog.pricing import hourly_price
    from gpucloud.teardown.hourly_cost import hourly_usd

    def instance(itype: str, lifecycle: str) -> Found:
        return Found(f"{A}:instance/i-1", "ec2:instance", "i-1", {}, instance_type=itype, lifecycle=lifecycle)

    spot = hourly_usd(instance("p4d.24xlarge", "spot"), "us-east-1")
    assert spot == hourly_price("p4d.24xlarge", "us-east-1", "spot").usd_per_hour
    assert hourly_usd(instance("p4d.24xlarge", "on-demand"), "us-east-1") > spot > 0
    assert hourly_usd(instance("t3.large", "on-demand"), "us-east-1") == 0.0832  # the monitor's type
    assert hourly_usd(instance("t3.micro", "on-demand"), "us-east-1") is None  # unknown, never zero
    assert hourly_usd(found(f"{A}:vpc/vpc-1"), "us-east-1") is None
