"""Real boto3 clients whose calls are answered by botocore's Stubber (validated against the models)."""

from __future__ import annotations

import datetime
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import boto3
from botocore.stub import Stubber

from gpucloud.catalog.refresh import ON_DEMAND_FILTERS, AwsClients

NOW = datetime.datetime(2026, 11, 21, 12, 0, tzinfo=datetime.timezone.utc)


def _session() -> boto3.session.Session:
    return boto3.session.Session(
        aws_access_key_id="AKIDEXAMPLE", aws_secret_access_key="secret", region_name="us-east-1"
    )


@contextmanager
def stubbed_clients(region: str = "us-east-1") -> Iterator[tuple[AwsClients, Stubber, Stubber]]:
    session = _session()
    ec2 = session.client("ec2", region_name=region)
    pricing = session.client("pricing", region_name="us-east-1")
    with Stubber(ec2) as ec2_stub, Stubber(pricing) as pricing_stub:
        yield AwsClients(ec2=ec2, pricing=pricing), ec2_stub, pricing_stub
        ec2_stub.assert_no_pending_responses()
        pricing_stub.assert_no_pending_responses()


def expect_describe(stub: Stubber, types: Sequence[str], pages: Sequence[Sequence[dict]]) -> None:
    for number, page in enumerate(pages):
        params = {"Filters": [{"Name": "instance-type", "Values": list(types)}]}
        response = {"InstanceTypes": list(page)}
        if number:
            params["NextToken"] = f"page-{number}"
        if number + 1 < len(pages):
            response["NextToken"] = f"page-{number + 1}"
        stub.add_response("describe_instance_types", response, params)


def expect_prices(stub: Stubber, region: str, instance_type: str, price_list: Sequence[str]) -> None:
    filters = {"regionCode": region, "instanceType": instance_type, **ON_DEMAND_FILTERS}
    stub.add_response(
        "get_products",
        {"FormatVersion": "aws_v1", "PriceList": list(price_list)},
        {
            "ServiceCode": "AmazonEC2",
            "FormatVersion": "aws_v1",
            "Filters": [{"Type": "TERM_MATCH", "Field": k, "Value": v} for k, v in filters.items()],
        },
    )


def expect_spot(
    stub: Stubber, types: Sequence[str], history: Sequence[dict], *more_pages: Sequence[dict], days=7
) -> None:
    """DescribeSpotPriceHistory answered in one page per ``history`` argument, linked by NextToken."""
    pages = [history, *more_pages]
    for number, page in enumerate(pages):
        params = {
            "InstanceTypes": list(types),
            "ProductDescriptions": ["Linux/UNIX"],
            "StartTime": NOW - datetime.timedelta(days=days),
            "EndTime": NOW,
        }
        response: dict = {"SpotPriceHistory": list(page)}
        if number:
            params["NextToken"] = f"spot-{number}"
        if number + 1 < len(pages):
            response["NextToken"] = f"spot-{number + 1}"
        stub.add_response("describe_spot_price_history", response, params)
