"""`catalog refresh` logic against Stubber-answered AWS calls, and its pure parsing functions."""

from __future__ import annotations

import datetime

import pytest
from aws_responses import (
    c5_xlarge,
    g6_xlarge,
    p5_48xlarge,
    price_list_entry,
    spot_entry,
)
from stubbed_aws import (
    NOW,
    expect_describe,
    expect_prices,
    expect_spot,
    stubbed_clients,
)

from gpucloud.catalog import Catalog, load_catalog
from gpucloud.catalog.refresh import (
    build_catalog,
    instance_type_from_description,
    on_demand_prices,
    parse_type_names,
    refresh_catalog,
    refresh_steps,
    spot_estimates,
)
from gpucloud.errors import UserError


@pytest.fixture
def base() -> Catalog:
    return load_catalog()


def test_p5_description_becomes_the_catalog_entry():
    entry = instance_type_from_description(p5_48xlarge())
    assert (entry.name, entry.family, entry.gpus, entry.gpu_model, entry.gpu_memory_mib) == (
        "p5.48xlarge",
        "p5",
        8,
        "H100",
        81920,
    )
    assert (entry.vcpus, entry.memory_gib, entry.nvme_disks, entry.nvme_gib) == (192, 2048.0, 8, 30400)
    assert [c.index for c in entry.network_cards] == list(range(32))
    assert {c.max_interfaces for c in entry.network_cards} == {2}
    assert entry.efa_supported and entry.max_efa_interfaces == 32
    assert entry.placement_strategies == ["cluster", "partition", "spread"]
    assert entry.usage_classes == ["on-demand", "spot", "capacity-block"]


def test_type_without_efa_has_zero_efa_interfaces():
    entry = instance_type_from_description(g6_xlarge())
    assert not entry.efa_supported and entry.max_efa_interfaces == 0 and entry.nvme_gib == 250


def test_type_without_gpus_is_rejected():
    with pytest.raises(ValueError, match="c5.xlarge has no GPUs"):
        instance_type_from_description(c5_xlarge())


def test_on_demand_price_ignores_reserved_terms_and_other_usage_types():
    entries = [
        price_list_entry("p5.48xlarge", "55.0400000000"),
        price_list_entry("p5.48xlarge", "60.0000000000", usagetype="DedicatedUsage:p5.48xlarge"),
    ]
    assert on_demand_prices(entries, "p5.48xlarge") == [55.04]
    assert on_demand_prices([], "p5.48xlarge") == []


def test_unreadable_price_list_entry_is_an_error():
    with pytest.raises(ValueError, match="unreadable PriceList entry for p5.48xlarge"):
        on_demand_prices(["{not json"], "p5.48xlarge")


def test_spot_estimate_is_median_of_latest_price_per_az():
    history = [
        spot_entry("p5.48xlarge", "us-east-1a", "30.0", 5, NOW),
        spot_entry("p5.48xlarge", "us-east-1a", "99.0", 60, NOW),  # older: ignored
        spot_entry("p5.48xlarge", "us-east-1b", "20.0", 1, NOW),
        spot_entry("p5.48xlarge", "us-east-1c", "40.0", 2, NOW),
    ]
    assert spot_estimates(history) == {"p5.48xlarge": 30.0}


@pytest.mark.parametrize(
    "values, expected",
    [
        (("p5.48xlarge,g6.xlarge", "p5.48xlarge"), ["g6.xlarge", "p5.48xlarge"]),
        ((" p4d.24xlarge ",), ["p4d.24xlarge"]),
    ],
)
def test_type_names_are_split_and_deduplicated(values, expected):
    assert parse_type_names(values) == expected


@pytest.mark.parametrize("bad", ["p5", "P5.48XLARGE", "p5.48xlarge;rm"])
def test_bad_type_names_are_rejected(bad):
    with pytest.raises(UserError, match="is not an EC2 instance type name; expected family.size"):
        parse_type_names([bad])


def test_refresh_queries_aws_and_builds_the_catalog(base):
    types = ["g6.xlarge", "p5.48xlarge"]
    pre_cut = base.instance_types["p5.48xlarge"].model_copy(update={"on_demand_usd_per_hour": 98.32})
    base = base.model_copy(update={"instance_types": {**base.instance_types, "p5.48xlarge": pre_cut}})
    steps: list[str] = []
    with stubbed_clients() as (clients, ec2, pricing):
        expect_describe(ec2, types, [[g6_xlarge()], [p5_48xlarge()]])  # two pages
        expect_prices(pricing, "us-east-1", "g6.xlarge", [price_list_entry("g6.xlarge", "0.8048000000")])
        expect_prices(pricing, "us-east-1", "p5.48xlarge", [price_list_entry("p5.48xlarge", "55.0400000000")])
        expect_spot(
            ec2,
            types,
            [
                spot_entry("g6.xlarge", "us-east-1a", "0.3121", 3, NOW),
                spot_entry("p5.48xlarge", "us-east-1b", "21.5000", 3, NOW),
            ],
        )
        result = refresh_catalog(clients, region="us-east-1", types=types, base=base, now=NOW, on_step=steps.append)
    catalog = result.catalog
    assert catalog.as_of == datetime.date(2026, 11, 21) and catalog.region == "us-east-1"
    assert list(catalog.instance_types) == types
    p5 = catalog.instance_types["p5.48xlarge"]
    assert (p5.on_demand_usd_per_hour, p5.spot_usd_per_hour, p5.nvme_gib) == (55.04, 21.5, 30400)
    assert catalog.instance_types["g6.xlarge"].on_demand_usd_per_hour == 0.8048
    assert any(s.startswith("ec2:DescribeInstanceTypes (us-east-1") for s in catalog.sources)
    assert len(steps) == refresh_steps(types, include_spot=True)
    change = next(c for c in result.changes if c.name == "p5.48xlarge")
    assert (
        change.status == "refreshed"
        and change.on_demand_before == base.instance_types["p5.48xlarge"].on_demand_usd_per_hour
    )
    assert "on_demand_usd_per_hour" in change.changed_fields and "nvme_gib" in change.changed_fields


def test_type_not_offered_in_region_keeps_its_previous_entry(base):
    types = ["p5.48xlarge", "p5en.48xlarge"]
    with stubbed_clients("eu-west-1") as (clients, ec2, pricing):
        expect_describe(ec2, types, [[p5_48xlarge()]])
        expect_prices(
            pricing, "eu-west-1", "p5.48xlarge", [price_list_entry("p5.48xlarge", "61.5", region="eu-west-1")]
        )
        result = refresh_catalog(clients, region="eu-west-1", types=types, base=base, include_spot=False, now=NOW)
    kept = result.catalog.instance_types["p5en.48xlarge"]
    assert kept == base.instance_types["p5en.48xlarge"]
    assert [c.status for c in result.changes] == ["refreshed", "kept"]
    assert any("Not offered in eu-west-1: p5en.48xlarge" in note for note in result.catalog.notes)
    assert result.catalog.instance_types["p5.48xlarge"].spot_usd_per_hour is None  # --no-spot


def test_unknown_type_is_an_error_and_nothing_is_built(base):
    with stubbed_clients() as (clients, ec2, _pricing):
        expect_describe(ec2, ["p9.48xlarge"], [[]])
        with pytest.raises(UserError, match=r"--types: p9.48xlarge not offered in us-east-1"):
            refresh_catalog(clients, region="us-east-1", types=["p9.48xlarge"], base=base, include_spot=False, now=NOW)


def test_non_gpu_type_is_an_error(base):
    with pytest.raises(UserError, match="c5.xlarge has no GPUs .*GPU instance types only"):
        build_catalog(
            base=base,
            region="us-east-1",
            as_of=NOW.date(),
            requested=["c5.xlarge"],
            descriptions=[c5_xlarge()],
            on_demand={},
            spot=None,
        )


def test_access_denied_names_the_missing_permission(base):
    with stubbed_clients() as (clients, ec2, pricing):
        expect_describe(ec2, ["p5.48xlarge"], [[p5_48xlarge()]])
        pricing.add_client_error(
            "get_products",
            service_error_code="AccessDeniedException",
            service_message="User is not authorized to perform: pricing:GetProducts",
            http_status_code=400,
        )
        with pytest.raises(UserError) as err:
            refresh_catalog(clients, region="us-east-1", types=["p5.48xlarge"], base=base, now=NOW)
    assert str(err.value) == (
        "GetProducts in us-east-1 failed: AccessDeniedException: User is not authorized to perform: "
        "pricing:GetProducts; the credentials need pricing:GetProducts"
    )


def test_unauthorized_describe_is_a_user_error(base):
    with stubbed_clients() as (clients, ec2, _pricing):
        ec2.add_client_error(
            "describe_instance_types",
            service_error_code="UnauthorizedOperation",
            service_message="You are not authorized to perform this operation.",
            http_status_code=403,
        )
        with pytest.raises(UserError, match="the credentials need ec2:DescribeInstanceTypes"):
            refresh_catalog(clients, region="us-east-1", types=["p5.48xlarge"], base=base, now=NOW)
