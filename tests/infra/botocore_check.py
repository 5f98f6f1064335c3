"""One check for "this is a request real AWS accepts the shape of", shared by the infra tests."""

from __future__ import annotations

from typing import Any

import botocore.session
from botocore.stub import Stubber


def assert_valid_request(service: str, operation: str, params: dict[str, Any]) -> None:
    """Send ``params`` through a real botocore client of ``service``: botocore validates them against
    the service model (names, types, lengths, required members) before the Stubber answers."""
    client = botocore.session.get_session().create_client(
        service, region_name="us-east-1", aws_access_key_id="x", aws_secret_access_key="y"
    )
    with Stubber(client) as stub:
        stub.add_response(operation, {}, expected_params=params)
        getattr(client, operation)(**params)
        stub.assert_no_pending_responses()
