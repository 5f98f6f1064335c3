"""`gpucloud plan --catalog-file`: a refreshed catalog drives the plan's validation and prices, and a
bad catalog file is refused with the same one-line errors as `gpucloud catalog show`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpucloud.catalog import BUNDLED_CATALOG
from gpucloud.cli import main


def run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    try:
        main(argv)
        code = 0
    except SystemExit as done:  # click's standalone mode exits even on success
        code = int(done.code or 0)
    out, err = capsys.readouterr()
    return code, out, err


def catalog_with(tmp_path: Path, name: str = "fresh.json", **g6_xlarge: object) -> Path:
    """The bundled catalog with other facts for g6.xlarge (the dev stack's type)."""
    data = json.loads(BUNDLED_CATALOG.read_text())
    data["as_of"], data["region"] = "2026-11-20", "us-east-1"
    data["instance_types"]["g6.xlarge"].update(g6_xlarge)
    path = tmp_path / name
    path.write_text(json.dumps(data))
    return path


def test_prices_come_from_the_given_catalog(tmp_path: Path, capsys) -> None:
    path = catalog_with(tmp_path, on_demand_usd_per_hour=0.5, spot_usd_per_hour=0.2)
    code, out, err = run(["plan", "--stack", "dev", "--catalog-file", str(path), "--output", "json"], capsys)
    assert code == 0, err
    plan = json.loads(out)
    assert plan["cost"]["on_demand"]["max"] == pytest.approx(2 * 0.5)  # dev: at most 2 x g6.xlarge
    assert plan["cost"]["spot_estimate"]["max"] == pytest.approx(2 * 0.2)
    assert plan["catalog"] == {"path": str(path), "as_of": "2026-11-20", "region": "us-east-1"}


def test_the_bundled_catalog_is_the_default(capsys) -> None:
    code, out, err = run(["plan", "--stack", "dev", "--output", "json"], capsys)
    assert code == 0, err
    bundled = json.loads(BUNDLED_CATALOG.read_text())
    assert json.loads(out)["catalog"] == {"path": None, "as_of": bundled["as_of"], "region": bundled["region"]}


def test_the_table_names_the_catalog_it_priced_with(tmp_path: Path, capsys, monkeypatch) -> None:
    monkeypatch.setenv("COLUMNS", "200")
    path = catalog_with(tmp_path, on_demand_usd_per_hour=0.5)
    code, out, err = run(["plan", "--stack", "dev", "--catalog-file", str(path)], capsys)
    assert code == 0, err
    flat = " ".join(out.split())
    assert f"Instance prices for us-east-1 from {path}" in flat and "instance facts as of 2026-11-20." in flat
    assert "$1.00" in out  # 2 nodes at the given on-demand price


def test_validation_uses_the_given_catalog(tmp_path: Path, capsys) -> None:
    # A catalog whose g6.xlarge costs more makes the dev stack break its $5/h ceiling.
    path = catalog_with(tmp_path, on_demand_usd_per_hour=4.0)
    code, out, err = run(["plan", "--stack", "dev", "--catalog-file", str(path)], capsys)
    assert (code, out) == (2, "")
    (line,) = err.strip().splitlines()
    assert "gpucloud:costCeilingUsdPerHour = 5" in line and "cost 8.00 USD/hour, above the ceiling" in line


def test_a_catalog_without_the_stacks_instance_type(tmp_path: Path, capsys) -> None:
    data = json.loads(BUNDLED_CATALOG.read_text())
    del data["instance_types"]["g6.xlarge"]
    path = tmp_path / "small.json"
    path.write_text(json.dumps(data))
    code, _, err = run(["plan", "--stack", "dev", "--catalog-file", str(path)], capsys)
    assert code == 2
    (line,) = err.strip().splitlines()
    assert "gpucloud:nodeGroups[0].instanceTypes[0].instanceType = 'g6.xlarge': unknown instance type" in line


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (None, "catalog file not found"),
        ("{not json", "not a readable JSON catalog"),
        (b"\xff\xfe\x00", "not a readable JSON catalog"),
        (
            '{"as_of": "2026-11-20", "region": "us-east-1", "sources": []}',
            "invalid catalog at instance_types: Field required",
        ),
        ("[1, 2]", "invalid catalog at (top level)"),
    ],
)
def test_bad_catalog_files_are_one_line_errors(tmp_path: Path, capsys, content, message: str) -> None:
    path = tmp_path / "catalog.json"
    if isinstance(content, bytes):
        path.write_bytes(content)
    elif content is not None:
        path.write_text(content)
    code, out, err = run(["plan", "--stack", "dev", "--catalog-file", str(path), "--output", "json"], capsys)
    assert (code, out) == (2, "")
    assert err.strip().splitlines() == [err.strip()] and "Traceback" not in err
    assert err.startswith(f"gpucloud: error: {path}: ") and message in err
    # `catalog show` refuses the same file with the same words
    show_code, _, show_err = run(["catalog", "show", "--catalog-file", str(path)], capsys)
    assert (show_code, show_err) == (2, err)


def test_a_bad_field_value_names_the_field(tmp_path: Path, capsys) -> None:
    path = catalog_with(tmp_path, gpus="eight")
    code, _, err = run(["plan", "--stack", "dev", "--catalog-file", str(path)], capsys)
    assert code == 2
    assert "invalid catalog at instance_types.g6.xlarge.gpus" in err and len(err.strip().splitlines()) == 1


def test_the_cost_ceiling_is_checked_at_the_stacks_own_regions_prices(tmp_path: Path, capsys) -> None:
    # g6.xlarge at 0.5 USD/h in the home region (us-east-1), 4.0 in us-west-2: the dev stack moved to
    # us-west-2 (at most 2 nodes) costs 8.00 USD/h there, above its 5 USD/h ceiling.
    data = json.loads(catalog_with(tmp_path, on_demand_usd_per_hour=0.5).read_text())
    data["prices"]["us-west-2"]["instance_types"]["g6.xlarge"]["on_demand_usd_per_hour"] = 4.0
    catalog = tmp_path / "regions.json"
    catalog.write_text(json.dumps(data))
    stack = tmp_path / "Pulumi.west.yaml"
    stack.write_text(
        (Path(__file__).parents[2] / "stacks" / "Pulumi.dev.yaml")
        .read_text()
        .replace("us-east-1", "us-west-2")  # the region and its zones
    )
    code, out, err = run(["plan", "--stack-file", str(stack), "--catalog-file", str(catalog)], capsys)
    assert (code, out) == (2, ""), err
    (line,) = err.strip().splitlines()
    assert "gpucloud:costCeilingUsdPerHour = 5" in line and "in us-west-2 cost 8.00 USD/hour, above the ceiling" in line
    east = tmp_path / "Pulumi.east.yaml"
    east.write_text((Path(__file__).parents[2] / "stacks" / "Pulumi.dev.yaml").read_text())
    code, _, err = run(["plan", "--stack-file", str(east), "--catalog-file", str(catalog), "-o", "json"], capsys)
    assert code == 0, err  # 2 x 0.5 USD/h at home
