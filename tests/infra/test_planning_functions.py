"""Pure planning functions: EFA interface layout, subnets, cost, the node IAM policy, user data."""

from __future__ import annotations

import base64
import json
import subprocess

import pytest

from gpucloud.catalog import InstanceType, NetworkCard, get_instance_type
from gpucloud.cluster.addressing import plan_subnets
from gpucloud.cluster.efa_layout import plan_network_interfaces, summarize
from gpucloud.cluster.hourly_cost import GroupSizing, estimate_cost
from gpucloud.infra.iam import GroupScope, JobPlaneArns, node_policy_document
from gpucloud.infra.userdata import USER_DATA_LIMIT, render_user_data


def layout(name: str, efa: bool = True, mode: str | None = "efa-only"):
    return [
        (n.network_card_index, n.device_index, n.interface_type)
        for n in plan_network_interfaces(get_instance_type(name), efa, mode)  # type: ignore[arg-type]
    ]


@pytest.mark.parametrize(
    ("name", "cards"),
    [
        ("p4d.24xlarge", 4),
        ("p4de.24xlarge", 4),
        ("p5.48xlarge", 32),
        ("p5e.48xlarge", 32),
        ("p5en.48xlarge", 16),
        ("g6e.48xlarge", 4),
    ],
)
def test_efa_only_layout(name: str, cards: int) -> None:
    nics = layout(name)
    # the current EC2 guide: ENA primary carries the only IP, an EFA-only beside it at card 0 /
    # device 1, then one EFA-only at device 0 of each further card
    assert nics[0] == (0, 0, "interface")
    assert nics[1] == (0, 1, "efa-only")
    assert nics[2:] == [(card, 0, "efa-only") for card in range(1, cards)]
    summary = summarize(
        get_instance_type(name), plan_network_interfaces(get_instance_type(name), True, "efa-only"), "efa-only"
    )
    assert (summary.network_cards, summary.efa_interfaces, summary.ip_interfaces) == (cards, cards, 1)


@pytest.mark.parametrize(("name", "cards"), [("p4d.24xlarge", 4), ("p5.48xlarge", 32), ("p5en.48xlarge", 16)])
def test_legacy_layout(name: str, cards: int) -> None:
    assert layout(name, mode="legacy") == [(0, 0, "efa")] + [(c, 1, "efa") for c in range(1, cards)]


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("p5.48xlarge", "efa-only"),
        ("p5e.48xlarge", "efa-only"),
        ("p5en.48xlarge", "efa-only"),
        ("p4d.24xlarge", "legacy"),  # AWS documents no EFA-only layout for p4d/p4de
        ("p4de.24xlarge", "legacy"),
        ("g6e.48xlarge", "legacy"),
        ("g5.48xlarge", "legacy"),
    ],
)
def test_unset_layout_is_efa_only_only_where_aws_documents_it(name: str, expected: str) -> None:
    itype = get_instance_type(name)
    assert summarize(itype, plan_network_interfaces(itype, True), None).layout == expected
    assert layout(name, mode=None) == layout(name, mode=expected)


def test_no_efa_types_get_one_plain_interface() -> None:
    for name in ("g5.xlarge", "g6.xlarge", "g6.2xlarge"):
        assert layout(name) == [(0, 0, "interface")]
        assert layout(name, mode="legacy") == [(0, 0, "interface")]
    assert layout("p5.48xlarge", efa=False) == [(0, 0, "interface")]


def test_single_efa_dev_types() -> None:
    assert layout("g6.12xlarge") == [(0, 0, "interface"), (0, 1, "efa-only")]
    assert layout("g5.48xlarge", mode="legacy") == [(0, 0, "efa")]


def _synthetic(cards: list[int], max_efa: int) -> InstanceType:
    base = get_instance_type("p5.48xlarge")
    return base.model_copy(
        update={
            "name": "x.synthetic",
            "max_efa_interfaces": max_efa,
            "network_cards": [NetworkCard(index=i, max_interfaces=n) for i, n in enumerate(cards)],
        }
    )


def test_card0_with_room_for_one_interface_gets_combined_efa() -> None:
    nics = plan_network_interfaces(_synthetic([1, 1], 2), True, "efa-only")
    assert [(n.network_card_index, n.device_index, n.interface_type) for n in nics] == [
        (0, 0, "efa"),
        (1, 0, "efa-only"),
    ]  # device 0 on a card that holds one interface


def test_card0_without_efa_keeps_ena_and_efa_budget() -> None:
    # p6-b300 style: card 0 is ENA-only, EFA on the other cards, never more than MaximumEfaInterfaces
    nics = plan_network_interfaces(_synthetic([4, 2, 2, 2], 2), True, "efa-only")
    assert [(n.network_card_index, n.interface_type) for n in nics] == [
        (0, "interface"),
        (1, "efa-only"),
        (2, "efa-only"),
    ]


def test_subnet_plan() -> None:
    assert plan_subnets("10.0.0.0/16") == plan_subnets("10.0.0.0/16")
    plan = plan_subnets("10.0.0.0/16")
    assert (plan.private, plan.public) == ("10.0.0.0/17", "10.0.128.0/20")
    assert plan_subnets("192.168.4.0/24").public.endswith("/28")


def _sizing(name: str, capacity: str, lo: int, want: int, hi: int, base: int = 0) -> GroupSizing:
    return GroupSizing(name, get_instance_type(name), capacity, lo, want, hi, base)


def test_cost_views() -> None:
    p4d = get_instance_type("p4d.24xlarge")
    cost = estimate_cost([_sizing("p4d.24xlarge", "spot", 0, 4, 4, base=1)])
    od, spot = p4d.on_demand_usd_per_hour, p4d.spot_usd_per_hour
    assert cost.on_demand.max == round(4 * od, 4)
    assert cost.spot.desired == round(4 * spot, 4)
    assert cost.as_configured.desired == round(od + 3 * spot, 4)  # one on-demand base node
    assert cost.as_configured.min == 0.0


def test_cost_sums_groups_and_unknown_prices_stay_unknown() -> None:
    cost = estimate_cost([_sizing("g6.xlarge", "on-demand", 1, 1, 2), _sizing("p5e.48xlarge", "on-demand", 0, 0, 1)])
    assert cost.on_demand.min == get_instance_type("g6.xlarge").on_demand_usd_per_hour  # p5e at 0 nodes costs 0
    assert cost.on_demand.max is None  # p5e has no known price: the total is unknown, not understated
    assert cost.to_json()["groups"][1]["on_demand"]["max"] is None


RESOURCE_WILDCARD_SIDS = {"FindOwnGroup", "PublishBacklog", "FindInstances"}


SCOPED_BY_TAG_SIDS = {"NodeLifecycle", "DrainOnTermination"}


def test_node_policy_is_scoped_to_the_given_arns() -> None:
    jobs = JobPlaneArns(
        "arn:aws:sqs:r:1:q", "arn:aws:sqs:r:1:q-dlq", "arn:aws:sqs:r:1:e", "arn:aws:dynamodb:r:1:table/t"
    )
    scope = GroupScope("arn:aws:autoscaling:r:1:autoScalingGroup:*:autoScalingGroupName/*", stack="s", cluster="c")
    doc = node_policy_document("arn:aws:s3:::b", jobs, scope)
    for st in doc["Statement"]:
        assert all("*" not in a for a in st["Action"])
        if st["Sid"] in RESOURCE_WILDCARD_SIDS:  # actions AWS grants only on "*" (see iam.py)
            continue
        if st["Sid"] in SCOPED_BY_TAG_SIDS:  # any group of this account and region, if tagged with this stack
            assert st["Condition"] == scope.condition() and st["Resource"] == [scope.group_arn_pattern]
            continue
        assert st["Resource"] and all(
            "*" not in r.removesuffix("/*") and r.startswith("arn:aws:") for r in st["Resource"]
        )
    assert doc["Statement"][1]["Resource"] == ["arn:aws:s3:::b/*"]
    assert "DrainOnTermination" not in json.dumps(node_policy_document("a", jobs, None))


def test_user_data_renders_valid_bash_with_quoted_settings(tmp_path) -> None:
    text = render_user_data({"GPUCLOUD_CLUSTER": "c1", "GPUCLOUD_ODD": "it's $HOME `x`"})
    assert text.startswith("#!/usr/bin/env bash\n")
    assert "GPUCLOUD_ODD='it'\"'\"'s $HOME `x`'" in text  # single-quoted: nothing expands
    script = tmp_path / "ud.sh"
    script.write_text(text)
    subprocess.run(["bash", "-n", str(script)], check=True)
    assert len(text.encode()) < USER_DATA_LIMIT
    assert base64.b64encode(text.encode())  # what the launch template carries


def test_user_data_over_the_ec2_limit_is_refused() -> None:
    with pytest.raises(ValueError, match="EC2 allows"):
        render_user_data({"A": "x"}, script="#" * USER_DATA_LIMIT)
