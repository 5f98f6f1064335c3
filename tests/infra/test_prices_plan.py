"""`plan` prices honestly: everything billed by the hour, in the stack's region, reserved capacity as paid."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpucloud.catalog import get_instance_type, load_catalog
from gpucloud.catalog.pricing import hourly_price
from gpucloud.cli import main
from gpucloud.cluster.hourly_cost import (
    GroupSizing,
    RootVolumes,
    estimate_cost,
    infrastructure_cost,
    infrastructure_prices,
)
from gpucloud.spec import stack_file_for

LUSTRE = "aws:fsx/lustreFileSystem:LustreFileSystem"


def run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    try:
        main(argv)
        code = 0
    except SystemExit as done:
        code = int(done.code or 0)
    out, err = capsys.readouterr()
    return code, out, err


def plan_json(capsys, *args: str) -> dict:
    code, out, err = run(["plan", *args, "--output", "json"], capsys)
    assert code == 0, err
    return json.loads(out)


@pytest.fixture(autouse=True)
def wide_terminal(monkeypatch):
    monkeypatch.setenv("COLUMNS", "220")  # table cells unwrapped, so rows can be read back


def test_dev_minimum_is_not_zero_and_names_the_nat_gateway(capsys):
    cost = plan_json(capsys, "--stack", "dev")["cost"]
    items = {line["item"]: line for line in cost["infrastructure"]}
    prices = infrastructure_prices()
    # dev spans two zones: one NAT gateway (and its public address) in each, serving its own zone
    assert items["NAT gateway"]["usd_per_hour"]["min"] == pytest.approx(2 * prices.nat_gateway_usd_per_hour)
    assert "per GB" in items["NAT gateway"]["note"]  # data processing is extra, and says so
    assert cost["as_configured"]["min"] == 0.0  # no node at min ...
    paid = 2 * (prices.nat_gateway_usd_per_hour + prices.public_ipv4_usd_per_hour)
    assert cost["total"]["min"] >= paid  # ... still paid
    code, out, _ = run(["plan", "--stack", "dev"], capsys)
    assert code == 0
    flat = " ".join(out.split())
    assert "NAT gateway" in flat and "total │ │ as configured, all items │ $0.1000" in flat


def test_fsx_is_priced_by_size_and_throughput_tier():
    prices = infrastructure_prices()
    tiers = prices.fsx_lustre_usd_per_gb_month["PERSISTENT_2"]

    def hourly(gib: int, throughput: float) -> float | None:
        inputs = {"storageCapacity": gib, "perUnitStorageThroughput": throughput, "deploymentType": "PERSISTENT_2"}
        lines, _ = infrastructure_cost([(LUSTRE, inputs)], [], "us-east-1")
        return lines[0].usd_per_hour.max

    assert hourly(1200, 125) == round(1200 * tiers["125"] / prices.hours_per_month, 4)
    assert hourly(2400, 125.0) == pytest.approx(2 * hourly(1200, 125), abs=1e-4)  # by size
    assert hourly(1200, 1000) == round(1200 * tiers["1000"] / prices.hours_per_month, 4)  # by throughput class
    assert hourly(1200, 1000) > hourly(1200, 500) > hourly(1200, 250) > hourly(1200, 125)


def test_an_fsx_tier_without_a_price_is_unknown_with_a_warning():
    inputs = {"storageCapacity": 1200, "perUnitStorageThroughput": 40, "deploymentType": "PERSISTENT_1"}
    lines, warnings = infrastructure_cost([(LUSTRE, inputs)], [], "us-east-1")
    assert lines[0].usd_per_hour.max is None
    assert warnings == [
        "no FSx for Lustre price for PERSISTENT_1 at 40 MB/s/TiB in catalog/service_prices.json; its cost is unknown"
    ]


def test_the_shipped_fsx_is_in_plans_total(capsys):
    cost = plan_json(capsys, "--stack", "p4d-spot")["cost"]
    prices = infrastructure_prices()
    fsx = next(line for line in cost["infrastructure"] if line["item"] == "FSx for Lustre")
    assert fsx["usd_per_hour"]["max"] == round(2400 * 0.21 / prices.hours_per_month, 4)  # 2,400 GiB at 250 MB/s/TiB
    assert "2,400 GiB PERSISTENT_2 at 250 MB/s/TiB" in fsx["detail"]
    assert cost["total"]["max"] == pytest.approx(
        cost["as_configured"]["max"]
        + sum(line["usd_per_hour"]["max"] for line in cost["infrastructure"])
        + cost["monitoring"],
        abs=1e-3,
    )


def test_interface_endpoints_are_priced_per_endpoint_per_az_and_root_volumes_per_node():
    endpoint = {"vpcEndpointType": "Interface", "subnetIds": ["subnet-a", "subnet-b"]}
    gateway = {"vpcEndpointType": "Gateway"}  # free
    ep = "aws:ec2/vpcEndpoint:VpcEndpoint"
    volumes = [RootVolumes("g", 200, 0, 1, 4)]
    lines, _ = infrastructure_cost([(ep, endpoint), (ep, endpoint), (ep, gateway)], volumes, "us-west-2")
    prices = infrastructure_prices()
    by_item = {line.item: line for line in lines}
    assert by_item["interface VPC endpoints"].usd_per_hour.max == round(
        4 * prices.vpc_interface_endpoint_usd_per_hour_per_az, 4
    )
    root = by_item["EBS gp3 root volumes"].usd_per_hour
    per_node = 200 * prices.ebs_gp3_usd_per_gb_month / prices.hours_per_month
    assert (root.min, root.desired, root.max) == (0.0, round(per_node, 4), round(4 * per_node, 4))


def test_capacity_block_is_paid_at_the_block_rate_at_every_size_with_no_spot_row(capsys):
    data = plan_json(capsys, "--stack", "p5-capacity-block")
    group = data["cost"]["groups"][0]
    block = hourly_price("p5.48xlarge", "us-east-1", "capacity-block")
    assert group["as_configured"] == {
        "min": 2 * block.usd_per_hour,
        "desired": 2 * block.usd_per_hour,
        "max": 2 * block.usd_per_hour,
    }
    assert group["spot_estimate"] is None and group["spot_source"] is None
    assert data["cost"]["spot_estimate"] == {"min": None, "desired": None, "max": None}
    assert group["prices"]["capacity_block"]["source"] == "capacity-block"
    assert "paid up front for the block's whole duration" in group["note"]
    code, out, _ = run(["plan", "--stack", "p5-capacity-block"], capsys)
    assert code == 0
    table = out[out.index("Hourly cost") : out.index("Instance prices for")]
    assert "spot (" not in table and "block rate, paid" in table


def test_capacity_reservation_is_paid_whether_used_or_not():
    p4d = get_instance_type("p4d.24xlarge")
    catalog = load_catalog()
    reserved = GroupSizing("r", p4d, "capacity-reservation", 0, 1, 3)
    cost = estimate_cost([reserved], region="us-east-2", catalog=catalog)
    od = hourly_price("p4d.24xlarge", "us-east-2", "on-demand").usd_per_hour
    group = cost.groups[0]
    assert (group.as_configured.min, group.as_configured.max) == (round(3 * od, 4), round(3 * od, 4))
    assert not group.has_spot_view and cost.to_json()["groups"][0]["spot_estimate"] is None
    assert "paid at the on-demand rate whether used or not" in group.note


def stack_in(tmp_path: Path, region: str) -> Path:
    text = stack_file_for("dev").read_text().replace("us-east-1", region)
    path = tmp_path / "Pulumi.elsewhere.yaml"
    path.write_text(text)
    return path


def test_a_region_without_prices_warns_in_one_line_and_shows_unknown(tmp_path, capsys):
    data = plan_json(capsys, "--stack-file", str(stack_in(tmp_path, "eu-west-1")))
    warning = next(w for w in data["warnings"] if "eu-west-1" in w and "instance prices" in w)
    assert "\n" not in warning
    assert warning.startswith(
        "no instance prices for eu-west-1 in the catalog (priced: us-east-1, us-east-2, us-west-2)"
    )
    assert data["cost"]["as_configured"]["max"] is None and data["cost"]["total"]["max"] is None  # never us-east-1's
    code, out, _ = run(["plan", "--stack-file", str(stack_in(tmp_path, "eu-west-1"))], capsys)
    assert code == 0 and "warning: no instance prices for eu-west-1" in " ".join(out.split())


def test_a_us_west_2_stack_is_priced_from_us_west_2(tmp_path, capsys):
    data = plan_json(capsys, "--stack-file", str(stack_in(tmp_path, "us-west-2")))
    cost = data["cost"]
    # priced: only the cross-zone note that a two-zone stack gets anywhere
    assert cost["region"] == "us-west-2" and [w for w in cost["warnings"] if "between zones" not in w] == []
    assert cost["groups"][0]["prices"]["on_demand"]["region"] == "us-west-2"
    assert cost["groups"][0]["spot_source"] == "spot-estimate"  # no history in the bundled catalog: labelled


def test_p5_is_priced_after_the_2025_cut_with_its_as_of_date(capsys):
    data = plan_json(capsys, "--stack", "p5-capacity-block")
    od = data["cost"]["groups"][0]["prices"]["on_demand"]
    as_of = load_catalog().prices["us-east-1"].as_of.isoformat()
    assert (od["usd_per_hour"], od["source"], od["as_of"]) == (55.04, "on-demand", as_of)
    assert "announcing-up-to-45-price-reduction" in od["detail"]
    assert data["cost"]["prices_as_of"] == as_of
    code, out, _ = run(["plan", "--stack", "p5-capacity-block"], capsys)
    assert code == 0
    flat = " ".join(out.split())
    assert "$110.08" in flat and f"Instance prices for us-east-1 from the bundled catalog (as of {as_of})" in flat


def test_plan_says_what_a_group_over_several_zones_pays_for_crossing_them(capsys):
    """dev spreads over two zones: traffic between its nodes in different zones is billed as data
    between zones, which plan cannot count but must name; a one-zone stack pays none."""
    rate = infrastructure_prices().cross_az_usd_per_gb_each_way
    warnings = plan_json(capsys, "--stack", "dev")["cost"]["warnings"]
    [crossing] = [w for w in warnings if "between zones" in w]
    assert "node group dev also runs in us-east-1b" in crossing and f"{rate:g} USD per GB each way" in crossing
    assert not [w for w in plan_json(capsys, "--stack", "p4d-spot")["cost"]["warnings"] if "between zones" in w]
