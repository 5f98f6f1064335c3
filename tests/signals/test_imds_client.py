"""The IMDSv2 client and the emulator's token contract, over real HTTP on 127.0.0.1."""

from __future__ import annotations

import http.client
import json
import logging

import pytest

from gpucloud.errors import UserError
from gpucloud.offline.imds_emulator import ImdsEmulator
from gpucloud.signals.imds import (
    DEFAULT_ENDPOINT,
    DEFAULT_ENDPOINT_IPV6,
    ImdsClient,
    ImdsUnavailable,
    resolve_endpoint,
)

from .helpers import FakeClock


def raw(
    emulator: ImdsEmulator, method: str, path: str, headers: dict[str, str] | None = None
) -> tuple[int, str, http.client.HTTPResponse]:
    conn = http.client.HTTPConnection("127.0.0.1", emulator.port, timeout=5)
    try:
        conn.request(method, path, headers=headers or {})
        response = conn.getresponse()
        return response.status, response.read().decode(), response
    finally:
        conn.close()


# -- the emulator's IMDS contract ----------------------------------------------------------------
def test_token_put_rules(emulator):
    status, token, response = raw(emulator, "PUT", "/latest/api/token", {"X-aws-ec2-metadata-token-ttl-seconds": "300"})
    assert status == 200 and token
    assert response.getheader("X-aws-ec2-metadata-token-ttl-seconds") == "300"
    assert raw(emulator, "PUT", "/latest/api/token")[0] == 400  # TTL missing
    for bad in ("0", "21601", "ten", "-5"):
        assert raw(emulator, "PUT", "/latest/api/token", {"X-aws-ec2-metadata-token-ttl-seconds": bad})[0] == 400
    ttl = {"X-aws-ec2-metadata-token-ttl-seconds": "60"}
    assert raw(emulator, "PUT", "/latest/api/token", {**ttl, "X-Forwarded-For": "10.0.0.1"})[0] == 403
    assert raw(emulator, "PUT", "/2021-03-23/api/token", ttl)[0] == 403
    assert raw(emulator, "GET", "/latest/api/token")[0] == 405


def test_metadata_get_rules(emulator):
    _, token, _ = raw(emulator, "PUT", "/latest/api/token", {"X-aws-ec2-metadata-token-ttl-seconds": "300"})
    auth = {"X-aws-ec2-metadata-token": token}
    assert raw(emulator, "GET", "/latest/meta-data/instance-id")[0] == 401  # IMDSv2 required
    assert raw(emulator, "GET", "/latest/meta-data/instance-id", {"X-aws-ec2-metadata-token": "forged"})[0] == 401
    status, body, response = raw(emulator, "GET", "/latest/meta-data/instance-life-cycle", auth)
    assert (status, body) == (200, "spot")
    assert response.getheader("Content-Type") == "text/plain"
    assert 0 < int(response.getheader("X-aws-ec2-metadata-token-ttl-seconds")) <= 300
    assert raw(emulator, "GET", "/latest/meta-data/spot/instance-action", auth)[0] == 404
    assert raw(emulator, "GET", "/latest/meta-data/events/recommendations/rebalance", auth)[0] == 404
    assert raw(emulator, "GET", "/latest/meta-data/autoscaling/target-lifecycle-state", auth)[0] == 404
    assert raw(emulator, "GET", "/latest/meta-data/events/maintenance/scheduled", auth)[:2] == (200, "[]")
    status, body, response = raw(emulator, "GET", "/latest/dynamic/instance-identity/document", auth)
    assert response.getheader("Content-Type") == "text/plain"  # JSON items are text/plain on IMDS too
    assert json.loads(body)["instanceId"] == "i-1234567890abcdef0"


def test_instance_identity_is_configurable_and_checked():
    with ImdsEmulator(instance_id="i-0abc", region="eu-west-1", instance_life_cycle="on-demand") as emu:
        client = ImdsClient(emu.endpoint)
        assert client.get("/latest/meta-data/instance-id").text == "i-0abc"
        assert json.loads(client.get("/latest/dynamic/instance-identity/document").text)["region"] == "eu-west-1"
        assert client.get("/latest/meta-data/instance-life-cycle").text == "on-demand"
    with pytest.raises(ValueError, match="instance_colour"):
        ImdsEmulator(instance_colour="blue")


def test_botocore_reads_the_emulator(emulator, monkeypatch):
    """Other IMDS clients work against it too: botocore's own IMDSv2 fetcher."""
    from botocore.utils import InstanceMetadataRegionFetcher

    assert InstanceMetadataRegionFetcher(base_url=emulator.endpoint + "/").retrieve_region() == "us-east-1"


# -- the client ----------------------------------------------------------------------------------
def test_get_text(emulator, client):
    assert client.get_text("/latest/meta-data/instance-type") == "p5.48xlarge"
    assert client.get_text("/latest/meta-data/spot/instance-action") is None
    emulator.fail_with(500, 1)
    with pytest.raises(ImdsUnavailable, match="HTTP 500"):
        client.get_text("/latest/meta-data/instance-type")


def test_client_never_raises_on_http_status(emulator, client):
    assert client.get("/latest/meta-data/spot/instance-action").absent
    emulator.fail_with(503, 1)
    assert client.get("/latest/meta-data/instance-id").status == 503
    assert client.get("latest/meta-data/instance-id").text == "i-1234567890abcdef0"


def test_token_is_reused_then_refreshed_before_expiry():
    clock = FakeClock()
    with ImdsEmulator(token_max_ttl=60, clock=clock) as emu:
        client = ImdsClient(emu.endpoint, clock=clock)  # asks 21600 s, is granted 60 s
        client.get("/latest/meta-data/instance-id")
        clock.advance(40)
        client.get("/latest/meta-data/instance-id")
        assert client.tokens_fetched == 1
        clock.advance(15)  # 5 s left: inside the refresh margin (10 % of a short TTL, at most 15 s)
        assert client.get("/latest/meta-data/instance-id").ok
        assert client.tokens_fetched == 2
        assert emu.stats().get("status 401", 0) == 0  # refreshed before the service had to refuse it


def test_expired_token_is_retried_once_with_a_fresh_one():
    service_clock = FakeClock()
    with ImdsEmulator(token_max_ttl=60, clock=service_clock) as emu:
        client = ImdsClient(emu.endpoint)  # its own (real) clock still thinks the token is fresh
        client.get("/latest/meta-data/instance-id")
        service_clock.advance(61)
        assert client.get("/latest/meta-data/instance-id").ok
        assert client.tokens_fetched == 2
        assert emu.stats()["status 401"] == 1


def test_401_storm_retries_once_then_reports_401(emulator, client):
    emulator.fail_tokens(1)
    assert client.get("/latest/meta-data/instance-id").ok  # the retry with a fresh token succeeds
    emulator.fail_tokens(2)
    assert client.get("/latest/meta-data/instance-id").status == 401  # one retry only, no loop
    assert client.get("/latest/meta-data/instance-id").ok


def test_token_put_timeout_is_logged_loudly_then_v1_is_tried(caplog):
    with ImdsEmulator(require_token=False) as emu:
        emu.hang(5, count=100, target="token")  # the hop-limit failure: the PUT answer never arrives
        client = ImdsClient(emu.endpoint, read_timeout=0.2)
        with caplog.at_level(logging.ERROR, logger="gpucloud.signals"):
            assert client.get("/latest/meta-data/instance-id").text == "i-1234567890abcdef0"  # via IMDSv1
        assert "HttpPutResponseHopLimit ≥ 2" in caplog.text
        client.get("/latest/meta-data/instance-id")
        assert emu.stats()["PUT /latest/api/token"] == 1  # no second 0.2 s stall per request


def test_token_put_timeout_with_v2_required_is_401_then_unavailable_never_a_hang(emulator, caplog):
    emulator.hang(5, count=2, target="token")
    client = ImdsClient(emulator.endpoint, read_timeout=0.2)
    with caplog.at_level(logging.ERROR, logger="gpucloud.signals"):
        assert client.get("/latest/meta-data/spot/instance-action").status == 401  # IMDSv1 refused
        # Now known: v1 is no way out, so the next token timeout is reported as unavailable.
        with pytest.raises(ImdsUnavailable, match="HttpPutResponseHopLimit") as err:
            client.get("/latest/meta-data/spot/instance-action")
        assert err.value.reason == "token-timeout"
        assert client.get("/latest/meta-data/spot/instance-action").absent  # the PUT answers again
    assert emulator.stats()["PUT /latest/api/token"] == 3
    assert sum("HttpPutResponseHopLimit" in r.getMessage() for r in caplog.records) == 1  # once per episode


def test_refused_and_timeouts_raise_imds_unavailable(emulator, client):
    emulator.hang(2, count=1, target="metadata")
    with pytest.raises(ImdsUnavailable) as err:
        client.get("/latest/meta-data/instance-id")
    assert err.value.reason == "read-timeout"
    emulator.refuse_connections()
    with pytest.raises(ImdsUnavailable, match="connection refused") as err:
        client.get("/latest/meta-data/instance-id")
    assert err.value.reason == "refused"
    emulator.accept_connections()
    assert client.get("/latest/meta-data/instance-id").ok


def test_connect_timeout_is_short():
    # 192.0.2.0/24 is TEST-NET-1: never routed, so the SYN goes unanswered (or is rejected at once).
    client = ImdsClient("http://192.0.2.1:80", connect_timeout=0.2)
    with pytest.raises(ImdsUnavailable) as err:
        client.get("/latest/meta-data/instance-id")
    assert err.value.reason in ("connect-timeout", "refused")


def test_client_rejects_bad_settings():
    with pytest.raises(ValueError, match="token_ttl"):
        ImdsClient("http://127.0.0.1:1", token_ttl=0)
    with pytest.raises(ValueError, match="positive"):
        ImdsClient("http://127.0.0.1:1", connect_timeout=0)


# -- endpoint resolution -------------------------------------------------------------------------
def test_endpoint_precedence(monkeypatch):
    monkeypatch.delenv("AWS_EC2_METADATA_SERVICE_ENDPOINT", raising=False)
    monkeypatch.delenv("AWS_EC2_METADATA_SERVICE_ENDPOINT_MODE", raising=False)
    assert resolve_endpoint(None) == DEFAULT_ENDPOINT
    monkeypatch.setenv("AWS_EC2_METADATA_SERVICE_ENDPOINT_MODE", "IPv6")
    assert resolve_endpoint(None) == DEFAULT_ENDPOINT_IPV6
    monkeypatch.setenv("AWS_EC2_METADATA_SERVICE_ENDPOINT", "http://127.0.0.1:1338/")
    assert resolve_endpoint(None) == "http://127.0.0.1:1338"
    assert resolve_endpoint("http://[::1]:9000") == "http://[::1]:9000"


@pytest.mark.parametrize(
    "value, message",
    [
        ("127.0.0.1:1338", "not an http\\(s\\) URL"),
        ("ftp://host", "not an http\\(s\\) URL"),
        ("http://host:99999", "not a valid URL"),
        ("http://host/latest/meta-data", "without a path"),
        ("http://", "not an http\\(s\\) URL"),
    ],
)
def test_bad_endpoints_are_user_errors(value, message):
    with pytest.raises(UserError, match=message):
        resolve_endpoint(value)


def test_bad_endpoint_from_environment_names_the_variable(monkeypatch):
    monkeypatch.setenv("AWS_EC2_METADATA_SERVICE_ENDPOINT", "nonsense")
    with pytest.raises(UserError, match="AWS_EC2_METADATA_SERVICE_ENDPOINT"):
        resolve_endpoint(None)
