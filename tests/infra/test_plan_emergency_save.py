"""`gpucloud plan` and the emergency save: per group and tier, the largest checkpoint that commits
within the notice; a warning naming the tier and the time when gpucloud:expectedCheckpointGiB
does not fit."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from gpucloud.catalog import load_catalog
from gpucloud.cli import main
from gpucloud.planning.cluster_plan import plan_cluster
from gpucloud.spec import load_stack_file, stack_file_for

REPO = Path(__file__).resolve().parents[2]


def stack_with(tmp_path: Path, name: str, **config: object) -> Path:
    data = yaml.safe_load((REPO / "stacks" / f"Pulumi.{name}.yaml").read_text(encoding="utf-8"))
    data["config"].update(config)
    path = tmp_path / f"Pulumi.{name}.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    return path


def run_plan(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    try:
        main(argv)
        code = 0
    except SystemExit as done:
        code = int(done.code or 0)
    out, err = capsys.readouterr()
    return code, out, err


def test_plan_json_carries_emergency_save_per_group_and_warns_for_fsx(tmp_path: Path, capsys) -> None:
    path = stack_with(tmp_path, "p4d-spot", **{"gpucloud:expectedCheckpointGiB": 200})
    code, out, err = run_plan(["plan", "--stack-file", str(path), "--output", "json"], capsys)
    assert code == 0, err
    [group] = json.loads(out)["emergency_save"]
    assert group["node_group"] == "a100" and group["nodes"] == 4
    # the durable copy goes to S3, written from all four nodes: it fits
    assert (group["tier"], group["fits"]) == ("s3", True)
    assert group["seconds"] < 115 and group["max_gib"] > 200
    fsx = next(t for t in group["tiers"] if t["tier"] == "fsx")
    assert fsx["fits"] is False and fsx["seconds"] > 300 and 55 < fsx["max_gib"] < 70
    warnings = [line for line in err.splitlines() if line.startswith("warning:")]
    assert len(warnings) == 1
    assert "a100" in warnings[0] and "through fsx takes 369 s" in warnings[0] and "115 s" in warnings[0]


def test_plan_table_shows_the_largest_checkpoint_per_tier_without_a_size(capsys) -> None:
    code, out, err = run_plan(["plan", "--stack", "p5-capacity-block"], capsys)
    assert code == 0, err
    assert "Emergency save: largest checkpoint committed" in out
    assert "warning:" not in err  # no expected size: nothing to warn about
    table = out.split("Emergency save: largest checkpoint committed", 1)[1]
    rows = [line for line in table.splitlines() if line.startswith("│ h100")]
    assert [r.split("│")[3].strip() for r in rows] == ["fsx", "s3 *", "nvme (not"]


def emergency_plan(tmp_path: Path, **config: object):
    spec = load_stack_file(stack_with(tmp_path, "dev", **config), load_catalog())
    return plan_cluster(spec).groups[0].emergency_save


def test_a_groups_expected_size_overrides_the_stacks(tmp_path: Path) -> None:
    group = yaml.safe_load((REPO / "stacks" / "Pulumi.dev.yaml").read_text())["config"]["gpucloud:nodeGroups"][0]
    plan = emergency_plan(
        tmp_path,
        **{"gpucloud:expectedCheckpointGiB": 500, "gpucloud:nodeGroups": [{**group, "expectedCheckpointGiB": 8}]},
    )
    assert plan.expected_gib == 8
    assert plan.misses == []  # 8 GiB over two g6.xlarge to S3 fits


def test_the_stacks_expected_size_applies_to_groups_without_one(tmp_path: Path) -> None:
    plan = emergency_plan(tmp_path, **{"gpucloud:expectedCheckpointGiB": 70})
    assert plan.expected_gib == 70
    assert [e.tier for e in plan.misses] == ["s3"]  # dev has no FSx; two small nodes cannot push 70 GiB


def test_no_nvme_tier_when_the_stack_turns_scratch_off() -> None:
    spec = load_stack_file(stack_file_for("p4d-spot"), load_catalog())
    tiers = [e.tier for e in plan_cluster(spec).groups[0].emergency_save.tiers]
    assert tiers == ["fsx", "s3", "nvme"]
    off = spec.model_copy(update={"storage": spec.storage.model_copy(update={"nvme_scratch": False})})
    assert [e.tier for e in plan_cluster(off).groups[0].emergency_save.tiers] == ["fsx", "s3"]


def test_plan_says_when_a_large_fsx_beats_the_bucket_a_job_uses_by_default(tmp_path: Path, capsys) -> None:
    """A job without --checkpoint-uri writes to the bucket (fastest for every shipped stack); a stack
    whose FSx is faster than S3 from its nodes is told which URI to submit with."""
    storage = yaml.safe_load((REPO / "stacks" / "Pulumi.p4d-spot.yaml").read_text())["config"]["gpucloud:storage"]
    storage["fsx"].update({"sizeGiB": 48000, "throughputPerTiB": 1000})
    path = stack_with(tmp_path, "p4d-spot", **{"gpucloud:storage": storage})
    code, out, err = run_plan(["plan", "--stack-file", str(path), "--output", "json"], capsys)
    assert code == 0, err
    [group] = json.loads(out)["emergency_save"]
    assert (group["tier"], group["default_tier"]) == ("fsx", "s3")
    [warning] = [line for line in err.splitlines() if line.startswith("warning:")]
    assert "fsx commits an emergency save faster than the bucket" in warning
    assert "--checkpoint-uri /fsx/checkpoints" in warning and "GPUCLOUD_SHARED_PATHS=/fsx" in warning
    # the shipped stack: the bucket is the fastest, nothing to say
    code, out, err = run_plan(["plan", "--stack", "p4d-spot", "--output", "json"], capsys)
    assert code == 0 and "faster than the bucket" not in err
