"""`catalog refresh` keeps DescribeSpotPriceHistory per AZ (Stubber against the real EC2 model)."""

from __future__ import annotations

import datetime
import json

import pytest
from aws_responses import g6_xlarge, p5_48xlarge, price_list_entry, spot_entry
from stubbed_aws import NOW, expect_describe, expect_prices, expect_spot, stubbed_clients

from cli_run import run_cli
from gpucloud.catalog import load_catalog
from gpucloud.catalog import refresh as catalog_refresh
from gpucloud.catalog.pricing import hourly_price
from gpucloud.catalog.refresh import refresh_catalog

TYPES = ["g6.xlarge", "p5.48xlarge"]


def refresh_with_history(*pages, region="us-east-1", days=7):
    with stubbed_clients(region) as (clients, ec2, pricing):
        expect_describe(ec2, TYPES, [[g6_xlarge(), p5_48xlarge()]])
        expect_prices(pricing, region, "g6.xlarge", [price_list_entry("g6.xlarge", "0.8048", region=region)])
        expect_prices(pricing, region, "p5.48xlarge", [price_list_entry("p5.48xlarge", "55.04", region=region)])
        expect_spot(ec2, TYPES, *pages, days=days)
        return refresh_catalog(clients, region=region, types=TYPES, base=load_catalog(), now=NOW, spot_days=days)


def test_every_page_and_every_az_is_kept():
    result = refresh_with_history(
        [
            spot_entry("p5.48xlarge", "us-east-1a", "21.50", 10, NOW),
            spot_entry("p5.48xlarge", "us-east-1b", "23.00", 600, NOW),
        ],
        [
            spot_entry("p5.48xlarge", "us-east-1a", "20.00", 3000, NOW),  # older point, on a later page
            spot_entry("p5.48xlarge", "us-east-1c", "25.00", 60, NOW),
        ],
    )
    history = result.catalog.prices["us-east-1"].instance_types["p5.48xlarge"].spot_history
    assert sorted(history) == ["us-east-1a", "us-east-1b", "us-east-1c"]
    assert [p.usd_per_hour for p in history["us-east-1a"]] == [20.0, 21.5]  # oldest first
    assert result.catalog.instance_types["p5.48xlarge"].spot_usd_per_hour == 23.0  # median of latest per AZ

    catalog = result.catalog
    now = hourly_price("p5.48xlarge", "us-east-1", "spot", "us-east-1a", NOW, catalog=catalog)
    assert (now.usd_per_hour, now.source, now.az) == (21.5, "spot-history", "us-east-1a")
    two_days_ago = NOW - datetime.timedelta(days=2)
    assert (
        hourly_price("p5.48xlarge", "us-east-1", "spot", "us-east-1a", two_days_ago, catalog=catalog).usd_per_hour
        == 20.0
    )


def test_a_type_without_history_keeps_a_labelled_estimate():
    result = refresh_with_history([spot_entry("p5.48xlarge", "us-east-1a", "21.50", 10, NOW)])
    g6 = hourly_price("g6.xlarge", "us-east-1", "spot", "us-east-1a", catalog=result.catalog)
    assert g6.source == "spot-estimate" and g6.usd_per_hour > 0
    assert result.catalog.instance_types["g6.xlarge"].spot_usd_per_hour is None  # no history: no measured figure


def test_refreshing_a_region_keeps_the_other_regions_prices():
    result = refresh_with_history([spot_entry("p5.48xlarge", "us-west-2a", "19.0", 5, NOW)], region="us-west-2")
    catalog = result.catalog
    assert catalog.prices["us-east-1"] == load_catalog().prices["us-east-1"]
    west = catalog.prices["us-west-2"].instance_types["p5.48xlarge"]
    assert west.on_demand_source.startswith("pricing:GetProducts") and list(west.spot_history) == ["us-west-2a"]


def test_the_history_window_is_the_requested_days():
    result = refresh_with_history([spot_entry("p5.48xlarge", "us-east-1a", "21.50", 10, NOW)], days=30)
    assert result.catalog.prices["us-east-1"].instance_types["p5.48xlarge"].spot_history


def test_refresh_cli_passes_spot_days_and_show_labels_history_and_estimates(capsys, monkeypatch, tmp_path):
    monkeypatch.setenv("COLUMNS", "200")  # table cells unwrapped
    target = tmp_path / "catalog.json"
    with stubbed_clients() as (clients, ec2, pricing):
        expect_describe(ec2, TYPES, [[g6_xlarge(), p5_48xlarge()]])
        expect_prices(pricing, "us-east-1", "g6.xlarge", [price_list_entry("g6.xlarge", "0.8048")])
        expect_prices(pricing, "us-east-1", "p5.48xlarge", [price_list_entry("p5.48xlarge", "55.04")])
        expect_spot(ec2, TYPES, [spot_entry("p5.48xlarge", "us-east-1a", "22.0", 1, NOW)], days=3)
        monkeypatch.setattr(catalog_refresh, "make_clients", lambda region: clients)
        monkeypatch.setattr(catalog_refresh, "utcnow", lambda: NOW)
        argv = ["catalog", "refresh", "--types", ",".join(TYPES), "--spot-days", "3", "--output-file", str(target)]
        code, out, err = run_cli(capsys, *argv)
    assert code == 0, err
    report = " ".join(out.split())
    assert "-> 22.00 (history)" in report and "-> 0.32 (estimate)" in report  # the refresh report labels both
    code, out, _ = run_cli(
        capsys, "catalog", "show", "--catalog-file", str(target), "--region", "us-east-1", "-o", "json"
    )
    prices = json.loads(out)["prices"]
    assert prices["p5.48xlarge"]["spot"]["source"] == "spot-history"
    assert prices["g6.xlarge"]["spot"]["source"] == "spot-estimate"
    code, out, _ = run_cli(capsys, "catalog", "show", "--catalog-file", str(target), "--region", "us-east-1")
    assert "22.00 (history)" in out and "(estimate)" in out


def test_show_for_a_region_without_prices_is_one_line(capsys):
    code, out, err = run_cli(capsys, "catalog", "show", "--region", "eu-west-1")
    assert code == 2 and out == "" and err.count("\n") == 1
    assert "--region: no prices for eu-west-1 in the catalog; priced regions: us-east-1, us-east-2, us-west-2" in err


@pytest.mark.parametrize(
    ("edit", "where"),
    [
        (
            lambda c: c["prices"]["us-west-2"]["instance_types"]["p5.48xlarge"].update(on_demand_usd_per_hour=-3),
            "prices.us-west-2.instance_types.p5.48xlarge.on_demand_usd_per_hour = -3",
        ),
        (lambda c: c["prices"]["us-west-2"].pop("as_of"), "prices.us-west-2.as_of"),
        (
            lambda c: c["prices"]["us-east-1"]["instance_types"]["p5.48xlarge"].update(
                spot_history={"us-east-1a": [{"at": "yesterday", "usd_per_hour": 1}]}
            ),
            "prices.us-east-1.instance_types.p5.48xlarge.spot_history.us-east-1a.0.at = 'yesterday'",
        ),
        (lambda c: c["prices"]["us-east-1"].update(currency="EUR"), "prices.us-east-1.currency"),
    ],
)
def test_a_bad_prices_section_is_a_one_line_error(capsys, tmp_path, edit, where):
    from gpucloud.catalog import BUNDLED_CATALOG

    data = json.loads(BUNDLED_CATALOG.read_text())
    edit(data)
    path = tmp_path / "catalog.json"
    path.write_text(json.dumps(data))
    code, out, err = run_cli(capsys, "catalog", "show", "--catalog-file", str(path))
    assert code == 2 and out == "" and err.count("\n") == 1
    assert err.startswith(f"gpucloud: error: {path}: invalid catalog at {where}")
