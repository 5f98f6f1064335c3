"""`egress: endpoints`: every AWS API the runtime on a node calls has a VPC endpoint, and the agent
is never left to pip in a VPC without a route to a package index."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from gpucloud.errors import UserError
from gpucloud.infra.network import ENDPOINT_FOR_CLIENT, ENDPOINT_SERVICES, GATEWAY_SERVICES
from gpucloud.infra.preview import preview_stack
from gpucloud.spec import spec_from_config

SRC = Path(__file__).resolve().parents[2] / "src" / "gpucloud"
# Run on the operator's machine or in CI, never on a node: the catalog refresh (EC2, Pricing), the
# stack program (infra/, under Pulumi) and the sweep of leftover resources (teardown/).
NOT_ON_NODES = ("catalog/refresh.py", "infra/", "teardown/")


def node_sources() -> str:
    """The source of everything a node may run."""
    return "\n".join(
        p.read_text(encoding="utf-8")
        for p in sorted(SRC.rglob("*.py"))
        if not p.relative_to(SRC).as_posix().startswith(NOT_ON_NODES)
    )


CLIENT_RE = re.compile(r"""\bclient\(\s*["']([a-z0-9-]+)["']""")

OFFLINE = {
    "aws:region": "eu-west-1",
    "gpucloud:nodeGroups": [{"name": "a", "instanceType": "g6.xlarge", "maxNodes": 2}],
    "gpucloud:network": {"vpcCidr": "10.9.0.0/20", "egress": "endpoints"},
    # the gpucloud image brings the agent (and the Lustre client): nothing to download at boot
    "gpucloud:ami": {"parameter": "/gpucloud/image/ami-id"},
}


def runtime_clients() -> dict[str, list[str]]:
    """boto3 service name -> the runtime files that create a client for it."""
    found: dict[str, list[str]] = {}
    for path in sorted(SRC.rglob("*.py")):
        relative = path.relative_to(SRC).as_posix()
        if relative.startswith(NOT_ON_NODES):
            continue
        for service in CLIENT_RE.findall(path.read_text(encoding="utf-8")):
            found.setdefault(service, []).append(relative)
    return found


def test_the_scan_finds_the_clients_we_know_of() -> None:
    assert {"sqs", "dynamodb", "s3", "autoscaling", "cloudwatch"} <= set(runtime_clients())


# Clients only a NAT egress reaches: the validators refuse them with egress: endpoints.
NAT_ONLY = {"budgets": "budget.onExceeded stop-scale-out (spec rule budget_stop_scale_out)"}


def test_every_runtime_client_has_an_endpoint() -> None:
    reachable = set(ENDPOINT_SERVICES) | set(GATEWAY_SERVICES)
    missing = {
        service: files
        for service, files in runtime_clients().items()
        if ENDPOINT_FOR_CLIENT.get(service, service) not in reachable and service not in NAT_ONLY
    }
    assert missing == {}


# Endpoints for what runs on a node but is not a boto3 client of ours: Session Manager's agent.
NOT_OUR_CLIENTS = {"ssm", "ssmmessages", "ec2messages"}


def test_every_endpoint_serves_a_runtime_client() -> None:
    """An interface endpoint is billed per hour and zone: none for a service nothing on a node calls."""
    used = {ENDPOINT_FOR_CLIENT.get(service, service) for service in runtime_clients()}
    assert set(ENDPOINT_SERVICES) - NOT_OUR_CLIENTS - used == set()


def test_the_endpoint_stack_creates_them_all() -> None:
    preview = preview_stack(spec_from_config(OFFLINE, "test"), "offline")
    endpoints = {
        r.inputs["serviceName"].removeprefix("com.amazonaws.eu-west-1."): r.inputs["vpcEndpointType"]
        for r in preview.of_type("aws:ec2/vpcEndpoint:VpcEndpoint")
    }
    assert endpoints["monitoring"] == "Interface"  # the agent's PutMetricData
    for service in set(runtime_clients()) - set(NAT_ONLY):
        name = ENDPOINT_FOR_CLIENT.get(service, service)
        assert endpoints[name] == ("Gateway" if name in GATEWAY_SERVICES else "Interface")


@pytest.mark.parametrize(
    "package", ["s3://wheels-bucket/gpucloud-0.1.0-py3-none-any.whl", "gpucloud==0.1.0"], ids=["wheel", "pip"]
)
def test_endpoint_egress_refuses_an_agent_that_needs_the_package_index(package: str) -> None:
    with pytest.raises(UserError) as refused:
        spec_from_config({**OFFLINE, "gpucloud:agent": {"package": package}}, "Pulumi.offline.yaml")
    message = str(refused.value)
    assert "\n" not in message
    assert "gpucloud:agent.package" in message and "egress 'endpoints' has no route to a package index" in message


def test_nat_egress_may_install_the_agent_with_pip() -> None:
    config = {
        **OFFLINE,
        "gpucloud:network": {"vpcCidr": "10.9.0.0/20", "egress": "nat"},
        "gpucloud:agent": {"package": "gpucloud==0.1.0"},
    }
    assert spec_from_config(config, "test").agent.package == "gpucloud==0.1.0"


def test_endpoint_egress_installs_the_agent_from_a_wheelhouse() -> None:
    """A DLAMI (no agent in the image) with egress: endpoints: the wheelhouse in S3 comes through the
    S3 gateway endpoint and pip installs it with --no-index."""
    config = {**OFFLINE, "gpucloud:agent": {"package": "s3://wheels-bucket/wheelhouse/gpucloud-0.1.0/"}}
    del config["gpucloud:ami"]
    spec = spec_from_config(config, "Pulumi.offline.yaml")
    assert spec.agent.s3_wheelhouse is not None and spec.agent.s3_wheel is None
