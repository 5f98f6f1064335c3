"""gpucloud:ttlHours: every tagged resource of the planned stack carries gpucloud:expires-at, and plan shows it."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

import pytest

from gpucloud.cli import main
from gpucloud.cluster import tags
from gpucloud.cluster.tags import EXPIRES_AT_TAG, STACK_TAG, expires_at

REPO = Path(__file__).resolve().parents[2]
NOW = dt.datetime(2026, 11, 24, 8, 0, 0, tzinfo=dt.timezone.utc)


def _stack_with_ttl(tmp_path: Path, ttl: str) -> Path:
    text = (REPO / "stacks" / "Pulumi.dev.yaml").read_text(encoding="utf-8")
    path = tmp_path / "Pulumi.ttl.yaml"
    path.write_text(text.replace("config:\n", f"config:\n  gpucloud:ttlHours: {ttl}\n", 1), encoding="utf-8")
    return path


def _run(argv: list[str]) -> int:
    try:
        main(argv)
    except SystemExit as done:
        return int(done.code or 0)
    return 0


def _tag_sets(inputs: dict) -> list[dict[str, str]]:
    """A resource's tags: a map for most, a list of {key, value} for autoscaling groups."""
    found = []
    if isinstance(inputs.get("tags"), dict):
        found.append(inputs["tags"])
    if isinstance(inputs.get("tags"), list):
        found.append({t["key"]: t["value"] for t in inputs["tags"]})
    return found


def test_every_tagged_resource_expires_ttl_hours_after_the_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    monkeypatch.setattr(tags, "clock", lambda: NOW)
    assert _run(["plan", "--stack-file", str(_stack_with_ttl(tmp_path, "6")), "-o", "json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["expires_at"] == "2026-11-24T14:00:00Z"
    tagged = [t for r in data["resources"] for t in _tag_sets(r["inputs"]) if STACK_TAG in t]
    assert len(tagged) > 20
    assert {t.get(EXPIRES_AT_TAG) for t in tagged} == {"2026-11-24T14:00:00Z"}


def test_plan_table_shows_expiry_and_no_ttl_means_no_tag(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    monkeypatch.setattr(tags, "clock", lambda: NOW)
    assert _run(["plan", "--stack-file", str(_stack_with_ttl(tmp_path, "1.5"))]) == 0
    assert "expires-at: 2026-11-24T09:30:00Z" in capsys.readouterr().out
    assert _run(["plan", "--stack", "dev", "-o", "json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["expires_at"] is None
    assert not [t for r in data["resources"] for t in _tag_sets(r["inputs"]) if EXPIRES_AT_TAG in t]


def test_expiry_is_utc_to_the_second_whatever_the_clock_zone() -> None:
    east = dt.timezone(dt.timedelta(hours=5))
    assert expires_at(24, dt.datetime(2026, 1, 1, 5, 0, 0, 123456, tzinfo=east)) == "2026-01-02T00:00:00Z"
    assert expires_at(None, NOW) is None


def test_policy_pack_requires_the_expiry_on_every_resource_once_one_has_it() -> None:
    from tests.policy.test_policy_runner import Recorded

    from gpucloud.policy.runner import run_policies

    def vpc(name: str, **more: str) -> Recorded:
        return Recorded("aws:ec2/vpc:Vpc", name, {"cidrBlock": "10.0.0.0/16", "tags": {STACK_TAG: "dev", **more}})

    asg_tags = [{"key": STACK_TAG, "value": "dev", "propagateAtLaunch": True}]
    asg = Recorded("aws:autoscaling/group:Group", "asg", {"tags": asg_tags, "maxSize": 1, "minSize": 0})
    expiry = "2026-11-24T14:00:00Z"

    def expiry_violations(resources: list[Recorded]) -> list[str]:
        found = run_policies(resources, stack="dev")
        return [v.message for v in found if v.policy == "expiry-on-every-resource"]

    assert expiry_violations([vpc("a"), vpc("b"), asg]) == []  # no TTL: nothing required
    assert expiry_violations([vpc("a", **{EXPIRES_AT_TAG: expiry}), vpc("b"), asg]) == [
        f"'b' has no '{EXPIRES_AT_TAG}'; every resource of a stack with a TTL has '{expiry}'",
        f"'asg' has no '{EXPIRES_AT_TAG}'; every resource of a stack with a TTL has '{expiry}'",
    ]
    asg.inputs["tags"] = asg_tags + [{"key": EXPIRES_AT_TAG, "value": expiry, "propagateAtLaunch": True}]
    assert expiry_violations([vpc("a", **{EXPIRES_AT_TAG: expiry}), vpc("b", **{EXPIRES_AT_TAG: expiry}), asg]) == []


def test_the_expiry_is_stored_by_the_first_run_and_every_resource_reads_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """From the clock at every run, the tag moved at each `pulumi up`: every resource updated, every
    launch template a new version. The first run stores it in an SSM parameter whose value later
    runs ignore (a TTL change is a new parameter), and the tags are that parameter's value."""
    from gpucloud.infra.preview import preview_stack
    from gpucloud.spec import load_stack_file

    monkeypatch.setattr(tags, "clock", lambda: NOW)
    path = REPO / "stacks" / "Pulumi.dev.yaml"
    spec = load_stack_file(path).model_copy(update={"ttl_hours": 6.0})
    preview = preview_stack(spec, "ttl")
    [anchor] = preview.of_type("aws:ssm/parameter:Parameter")
    assert anchor.inputs["name"] == "/gpucloud/ttl/expires-at/6h"
    assert anchor.inputs["insecureValue"] == "2026-11-24T14:00:00Z"
    assert set(anchor.options.ignore_changes) == {"insecureValue", "tags"}
    for template in preview.of_type("aws:ec2/launchTemplate:LaunchTemplate"):
        assert anchor.urn in template.property_dependencies["tagSpecifications"]
