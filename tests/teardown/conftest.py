"""Fixtures of the sweep tests on the moto server."""

from __future__ import annotations

from typing import Any

import boto3
import pytest

REGION = "us-east-1"


@pytest.fixture
def client(fresh_aws_account: str):
    """A factory of boto3 clients on a fresh moto account, one per service (as the sweep takes)."""
    clients: dict[str, Any] = {}

    def make(service: str) -> Any:
        if service not in clients:
            clients[service] = boto3.client(service, region_name=REGION, endpoint_url=fresh_aws_account)
        return clients[service]

    return make
