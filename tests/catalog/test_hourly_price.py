"""hourly_price: one figure per type, region and lifecycle, always saying which kind of price it is."""

from __future__ import annotations

import datetime

import pytest

from gpucloud.catalog import Catalog, SpotPoint, load_catalog
from gpucloud.catalog.pricing import NoPrice, hourly_price
from gpucloud.errors import UserError

CUT_URL = "https://aws.amazon.com/blogs/aws/announcing-up-to-45-price-reduction-for-amazon-ec2-nvidia-gpu-accelerated-instances/"
T0 = datetime.datetime(2026, 11, 20, 0, 0, tzinfo=datetime.timezone.utc)


def with_history(catalog: Catalog, region: str, instance_type: str, history: dict[str, list[SpotPoint]]) -> Catalog:
    regional = catalog.prices[region]
    entry = regional.instance_types[instance_type].model_copy(update={"spot_history": history})
    regional = regional.model_copy(update={"instance_types": {**regional.instance_types, instance_type: entry}})
    return catalog.model_copy(update={"prices": {**catalog.prices, region: regional}})


@pytest.mark.parametrize("region", ["us-east-1", "us-east-2", "us-west-2"])
@pytest.mark.parametrize(
    ("instance_type", "usd"),
    [("p5.48xlarge", 55.04), ("p4d.24xlarge", 21.957642), ("p5en.48xlarge", 63.296)],
)
def test_p4_p5_on_demand_prices_are_after_the_june_2025_cut(region, instance_type, usd):
    price = hourly_price(instance_type, region, "on-demand")
    assert (price.usd_per_hour, price.source, price.region) == (usd, "on-demand", region)
    assert CUT_URL in price.detail and price.as_of == load_catalog().prices[region].as_of


def test_the_home_region_fields_agree_with_the_regional_prices():
    catalog = load_catalog()
    for name, entry in catalog.prices[catalog.region].instance_types.items():
        assert catalog.instance_types[name].on_demand_usd_per_hour == entry.on_demand_usd_per_hour, name


def test_spot_without_history_is_an_estimate_labelled_as_one():
    price = hourly_price("p5.48xlarge", "us-east-1", "spot", az="us-east-1a")
    assert price.source == "spot-estimate" and price.is_estimate and "estimate" in price.detail
    assert price.usd_per_hour < hourly_price("p5.48xlarge", "us-east-1", "on-demand").usd_per_hour


def test_spot_history_gives_the_price_in_force_in_that_az_at_that_time():
    catalog = with_history(
        load_catalog(),
        "us-west-2",
        "p5.48xlarge",
        {
            "us-west-2a": [
                SpotPoint(at=T0, usd_per_hour=20.0),
                SpotPoint(at=T0 + datetime.timedelta(hours=5), usd_per_hour=24.0),
            ],
            "us-west-2b": [SpotPoint(at=T0, usd_per_hour=30.0)],
            "us-west-2c": [SpotPoint(at=T0, usd_per_hour=26.0)],
        },
    )

    def spot(az=None, at=None):
        return hourly_price("p5.48xlarge", "us-west-2", "spot", az, at, catalog=catalog)

    early = spot("us-west-2a", T0 + datetime.timedelta(hours=1))
    assert (early.usd_per_hour, early.source, early.az, early.as_of) == (20.0, "spot-history", "us-west-2a", T0.date())
    assert spot("us-west-2a").usd_per_hour == 24.0  # latest
    assert spot("us-west-2a", datetime.datetime(2026, 11, 20, 6)).usd_per_hour == 24.0  # naive = UTC
    assert spot(None, T0 + datetime.timedelta(hours=1)).usd_per_hour == 26.0  # median of 20, 30, 26
    assert spot("us-west-2d").source == "spot-estimate"  # an AZ without history
    assert spot("us-west-2a", T0 - datetime.timedelta(days=1)).source == "spot-estimate"  # before any history


def test_capacity_block_is_priced_at_its_block_rate():
    price = hourly_price("p5.48xlarge", "us-east-1", "capacity-block")
    assert (price.usd_per_hour, price.source) == (39.33, "capacity-block")
    assert "capacityblocks/pricing" in price.detail


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ("p5.48xlarge", "eu-west-1", "on-demand"),
            "no prices for region eu-west-1 in the catalog; priced regions: us-east-1",
        ),
        (("p9.48xlarge", "us-east-1", "on-demand"), "no prices for p9.48xlarge in us-east-1"),
        (("p5.4xlarge", "us-east-1", "on-demand"), "no on-demand price for p5.4xlarge in us-east-1"),
        (("g6.xlarge", "us-east-1", "capacity-block"), "no Capacity Block rate for g6.xlarge in us-east-1"),
    ],
)
def test_a_missing_price_is_a_one_line_error(args, message):
    with pytest.raises(NoPrice, match=message) as err:
        hourly_price(*args)
    assert "\n" not in str(err.value)


def test_unknown_lifecycle_is_refused():
    with pytest.raises(UserError, match="unknown lifecycle 'reserved'; allowed: on-demand, spot, capacity-block"):
        hourly_price("p5.48xlarge", "us-east-1", "reserved")
