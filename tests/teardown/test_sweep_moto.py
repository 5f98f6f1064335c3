"""gpucloud sweep against the moto server: a small stack's real resources and untagged look-alikes.

Tagged ones go, in order, untagged and keep=true ones stay, and a second sweep finds nothing.
"""

from __future__ import annotations

import datetime as dt
import json

import pytest
from tests.teardown.leaked_stack import leave_stack_behind, make_stack

from gpucloud.cli import main
from gpucloud.teardown.delete import Deleter
from gpucloud.teardown.model import DELETE_ORDER
from gpucloud.teardown.plan import Selection
from gpucloud.teardown.sweep import sweep

REGION = "us-east-1"
NOW = dt.datetime.now(dt.timezone.utc)


def _run(argv: list[str]) -> int:
    try:
        main(argv)
    except SystemExit as done:
        return int(done.code or 0)
    return 0


def _sweep_json(capsys, *flags: str) -> list[dict]:
    code = _run(["sweep", "--region", REGION, *flags, "-o", "json"])
    out = capsys.readouterr().out
    assert code == 0, out
    return json.loads(out)["resources"]


def _ident(arn: str) -> str:
    return arn.rsplit("/", 1)[-1].rsplit(":", 1)[-1]


def _still_there(client, kind: str, ident: str) -> bool:
    ec2 = client("ec2")
    if kind.startswith("ec2:instance"):
        state = ec2.describe_instances(InstanceIds=[ident])["Reservations"][0]["Instances"][0]["State"]["Name"]
        return state not in ("terminated", "shutting-down")
    checks = {
        "ec2:vpc": lambda: ec2.describe_vpcs(Filters=[{"Name": "vpc-id", "Values": [ident]}])["Vpcs"],
        "ec2:subnet": lambda: ec2.describe_subnets(Filters=[{"Name": "subnet-id", "Values": [ident]}])["Subnets"],
        "ec2:security-group": lambda: ec2.describe_security_groups(Filters=[{"Name": "group-id", "Values": [ident]}])[
            "SecurityGroups"
        ],
        "ec2:launch-template": lambda: [
            t for t in ec2.describe_launch_templates()["LaunchTemplates"] if t["LaunchTemplateId"] == ident
        ],
        "ec2:natgateway": lambda: [
            n for n in ec2.describe_nat_gateways(NatGatewayIds=[ident])["NatGateways"] if n["State"] != "deleted"
        ],
        "fsx:file-system": lambda: [
            f for f in client("fsx").describe_file_systems()["FileSystems"] if f["FileSystemId"] == ident
        ],
        "ec2:volume": lambda: [v for v in ec2.describe_volumes()["Volumes"] if v["VolumeId"] == ident],
        "ec2:internet-gateway": lambda: [
            g for g in ec2.describe_internet_gateways()["InternetGateways"] if g["InternetGatewayId"] == ident
        ],
        "ec2:network-interface": lambda: [
            n for n in ec2.describe_network_interfaces()["NetworkInterfaces"] if n["NetworkInterfaceId"] == ident
        ],
        "ec2:route-table": lambda: [
            t for t in ec2.describe_route_tables()["RouteTables"] if t["RouteTableId"] == ident
        ],
        "ec2:vpc-endpoint": lambda: [
            e
            for e in ec2.describe_vpc_endpoints()["VpcEndpoints"]
            if e["VpcEndpointId"] == ident and e["State"].lower() != "deleted"
        ],
        "ec2:elastic-ip": lambda: [a for a in ec2.describe_addresses()["Addresses"] if a["AllocationId"] == ident],
        "sqs:queue": lambda: [u for u in client("sqs").list_queues().get("QueueUrls", []) if u.endswith("/" + ident)],
        "dynamodb:table": lambda: ident in client("dynamodb").list_tables()["TableNames"],
        "events:rule": lambda: [r for r in client("events").list_rules()["Rules"] if r["Name"] == ident],
        "iam:role": lambda: [r for r in client("iam").list_roles()["Roles"] if r["RoleName"] == ident],
        "iam:instance-profile": lambda: [
            p for p in client("iam").list_instance_profiles()["InstanceProfiles"] if p["InstanceProfileName"] == ident
        ],
        "s3:bucket": lambda: [b for b in client("s3").list_buckets()["Buckets"] if b["Name"] == ident],
        "autoscaling:autoScalingGroup": lambda: client("autoscaling").describe_auto_scaling_groups(
            AutoScalingGroupNames=[ident]
        )["AutoScalingGroups"],
    }
    return bool(checks[kind.split("#")[0]]())


def test_dry_run_lists_exactly_the_stack_then_delete_removes_it_and_spares_the_rest(client, capsys) -> None:
    leaked = leave_stack_behind(client, "ci-42")
    make_stack(client, "other-stack", prefix="other")  # another stack: --stack ci-42 must not touch it

    dry = _sweep_json(capsys, "--stack", "ci-42")
    would = {(r["type"], _ident(r["arn"])) for r in dry if r["action"] == "would delete"}
    expected = {(k.split("#")[0], v) for k, v in leaked.ids.items()}
    assert would == expected
    kept = [r for r in dry if r["action"] == "skip"]
    assert [(_ident(r["arn"]), r["result"]) for r in kept] == [("ci-42-kept-data", "skipped: gpucloud:keep=true")]
    assert all(r["stack"] == "ci-42" for r in dry)
    assert {r["result"] for r in dry if r["action"] == "would delete"} == {"dry run"}
    assert all(_still_there(client, k, v) for k, v in leaked.ids.items())  # a dry run deletes nothing

    code = _run(["sweep", "--region", REGION, "--stack", "ci-42", "--delete", "-o", "json"])
    captured = capsys.readouterr()
    assert code == 0, captured
    done = json.loads(captured.out)["resources"]
    assert "sweep: deleting ec2:vpc " in captured.err  # progress goes to stderr, JSON alone to stdout
    assert {tuple(r) for r in done} == {
        ("arn", "type", "stack", "created", "expires_at", "action", "result", "usd_per_hour")
    }
    created = {r["type"]: r["created"] for r in done}
    assert created["ec2:instance"] and created["s3:bucket"] and created["iam:role"] and created["ec2:vpc"] is None
    assert next(r for r in done if r["type"] == "ec2:instance")["usd_per_hour"] is None  # t3.micro: not in the catalog
    deleted = [r for r in done if r["action"] == "delete"]
    assert {r["result"] for r in deleted} <= {"deleted", "already gone"}, deleted
    order = [DELETE_ORDER.index(r["type"]) for r in deleted]
    assert order == sorted(order)  # groups and instances first, the bucket last
    assert deleted[-1]["type"] == "s3:bucket" and deleted[0]["type"] == "autoscaling:autoScalingGroup"
    gone = [k for k, v in leaked.ids.items() if _still_there(client, k, v)]
    assert gone == []
    assert all(_still_there(client, k, v) for k, v in leaked.spared.items())
    assert _still_there(
        client,
        "ec2:vpc",
        make_stack.__name__
        and client("ec2").describe_vpcs(Filters=[{"Name": "tag:gpucloud:stack", "Values": ["other-stack"]}])["Vpcs"][0][
            "VpcId"
        ],
    )

    again = _sweep_json(capsys, "--stack", "ci-42")
    assert [r for r in again if r["action"] != "skip"] == []


def test_bucket_is_emptied_of_versions_markers_and_uploads(client) -> None:
    from gpucloud.teardown.delete import empty_bucket

    made = make_stack(client, "ci-7", prefix="ci-7")
    s3 = client("s3")
    listing = s3.list_object_versions(Bucket=made["s3:bucket"])
    assert len(listing["Versions"]) == 2 and len(listing["DeleteMarkers"]) == 1
    assert len(s3.list_multipart_uploads(Bucket=made["s3:bucket"]).get("Uploads", [])) == 1
    empty_bucket(s3, made["s3:bucket"])
    listing = s3.list_object_versions(Bucket=made["s3:bucket"])
    assert not listing.get("Versions") and not listing.get("DeleteMarkers")
    assert not s3.list_multipart_uploads(Bucket=made["s3:bucket"]).get("Uploads")
    outcomes = sweep(client, REGION, Selection(stack="ci-7"), delete=True, now=NOW)
    assert {o.result for o in outcomes if o.decision.found.kind == "s3:bucket"} == {"deleted"}
    assert made["s3:bucket"] not in [b["Name"] for b in client("s3").list_buckets()["Buckets"]]


def test_older_than_and_expired_filter(client, capsys) -> None:
    past = (NOW - dt.timedelta(hours=1)).strftime("%Y-%m-%dT%H:%M:%SZ")
    future = (NOW + dt.timedelta(hours=5)).strftime("%Y-%m-%dT%H:%M:%SZ")
    make_stack(client, "expired", prefix="exp", expires_at=past)
    make_stack(client, "alive", prefix="alive", expires_at=future)

    listed = _sweep_json(capsys, "--all", "--expired")
    chosen = {r["stack"] for r in listed if r["action"] == "would delete"}
    assert chosen == {"expired"}
    skipped = {r["result"] for r in listed if r["stack"] == "alive"}
    assert skipped == {f"skipped: not expired (expires {future.replace('Z', '+00:00')})"}

    # everything was made seconds ago: nothing is older than an hour, everything older than 0.1 s
    young = _sweep_json(capsys, "--all", "--older-than", "1h")
    assert [r for r in young if r["action"] != "skip"] == []
    old = _sweep_json(capsys, "--all", "--older-than", "1s")
    assert {r["action"] for r in old} == {"would delete"}


def test_in_use_is_retried_with_backoff_bounded_and_then_succeeds(client) -> None:
    """A VPC with a subnet still in it is DependencyViolation until the subnet goes."""
    from gpucloud.teardown.discover import Discovery

    made = make_stack(client, "ci-9", prefix="ci-9")
    found = {f.kind: f for f in Discovery(client, REGION, "123456789012").run("ci-9")}
    vpc = found["ec2:vpc"]
    waits: list[float] = []
    bounded = Deleter(client, attempts=3, first_wait=1.0, max_wait=1.5, sleep=waits.append)
    assert bounded.delete(vpc).startswith("failed: DependencyViolation")
    assert waits == [1.0, 1.5]  # doubled, capped, and no wait after the last attempt

    def subnet_finishes_deleting(seconds: float) -> None:  # what AWS does while sweep waits
        waits.append(seconds)
        client("ec2").delete_subnet(SubnetId=made["ec2:subnet"])

    waits.clear()
    patient = Deleter(client, attempts=3, first_wait=1.0, sleep=subnet_finishes_deleting)
    for kind in ("ec2:network-interface", "ec2:instance", "ec2:natgateway", "ec2:vpc-endpoint", "ec2:route-table"):
        assert patient.delete(found[kind]) == "deleted"
    assert patient.delete(vpc) == "deleted"
    assert waits == [1.0]


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--region", REGION], "give exactly one of --stack NAME or --all"),
        (["--region", REGION, "--all", "--stack", "x"], "give exactly one of --stack NAME or --all"),
        (["--region", "moon", "--all"], "--region 'moon' is not an AWS region name"),
        (["--region", REGION, "--all", "--older-than", "6x"], "--older-than '6x' is not a duration"),
        (["--region", REGION, "--all", "--older-than", "0h"], "--older-than '0h' is not a duration"),
        (["--region", REGION, "--all", "-o", "yaml"], "Invalid value for '--output' / '-o'"),
    ],
)
def test_bad_flags_give_one_line(flags: list[str], message: str, capsys) -> None:
    assert _run(["sweep", *flags]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("gpucloud: error: ") and message in err, err
