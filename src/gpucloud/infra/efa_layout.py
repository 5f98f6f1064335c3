"""The launch template's network interfaces: a pure function of the instance type and the layout.

Two layouts (``p4d-p5-clusters`` reference, §2):

``efa-only`` (AWS's current guidance; ParallelCluster's default since 2026-03):
    card 0 / device 0 is a plain ENA ``interface`` that carries the node's one private IP; when
    card 0 has EFA and room for a second interface, an ``efa-only`` interface sits at card 0 /
    device 1; every further card gets one ``efa-only`` interface. EFA-only interfaces have no IP
    addresses, so a p5 uses one IP instead of 32.
``legacy``:
    every card gets a combined ``efa`` interface (EFA with ENA, each with an IP); the layout
    ParallelCluster <= 3.14 and most published p4d/p5 templates use.

Without EFA the node gets a single ``interface`` on card 0. The number of EFA interfaces never
exceeds the type's ``MaximumEfaInterfaces``. Device index on cards other than 0 follows AWS: 0 when
the card holds only one interface, else 1.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from typing import Literal

from gpucloud.catalog import InstanceType, NetworkCard

InterfaceType = Literal["interface", "efa", "efa-only"]
Layout = Literal["efa-only", "legacy"]


@dataclasses.dataclass(frozen=True)
class NicPlan:
    network_card_index: int
    device_index: int
    interface_type: InterfaceType

    @property
    def is_efa(self) -> bool:
        return self.interface_type != "interface"

    @property
    def has_ip(self) -> bool:
        return self.interface_type != "efa-only"


@dataclasses.dataclass(frozen=True)
class EfaLayoutSummary:
    instance_type: str
    layout: str  # "efa-only", "legacy" or "none"
    network_cards: int
    interfaces: int
    efa_interfaces: int
    ip_interfaces: int
    by_type: dict[str, int]

    def to_json(self) -> dict:
        return dataclasses.asdict(self)


def _secondary_device_index(card: NetworkCard) -> int:
    return 0 if card.max_interfaces == 1 else 1


def plan_network_interfaces(itype: InstanceType, efa: bool, layout: Layout = "efa-only") -> list[NicPlan]:
    """The ordered network interfaces a node of ``itype`` gets."""
    cards = sorted(itype.network_cards, key=lambda c: c.index)
    if not cards:
        raise ValueError(f"{itype.name}: the catalog lists no network cards")
    if not efa or itype.max_efa_interfaces == 0:
        return [NicPlan(cards[0].index, 0, "interface")]

    # ParallelCluster's heuristic: card 0 carries EFA when every card does (false on p6-b300,
    # whose card 0 is ENA-only).
    card0_has_efa = itype.max_efa_interfaces >= len(cards)
    first = cards[0]
    nics = _card0_interfaces(first, card0_has_efa, layout)
    budget = itype.max_efa_interfaces - sum(n.is_efa for n in nics)
    extra_type: InterfaceType = "efa" if layout == "legacy" else "efa-only"
    for card in cards[1 : budget + 1]:
        nics.append(NicPlan(card.index, _secondary_device_index(card), extra_type))
    return nics


def _card0_interfaces(first: NetworkCard, has_efa: bool, layout: Layout) -> list[NicPlan]:
    """Card 0: the primary interface (it carries the node's IP), plus EFA where the card has it."""
    if not has_efa:
        return [NicPlan(first.index, 0, "interface")]
    if layout == "efa-only" and first.max_interfaces >= 2:
        # AWS's current advice: ENA primary, EFA-only beside it (EFA-only cannot be primary)
        return [NicPlan(first.index, 0, "interface"), NicPlan(first.index, 1, "efa-only")]
    # legacy layout, or card 0 holds a single interface: combined EFA (with ENA) as the primary
    return [NicPlan(first.index, 0, "efa")]


def summarize(itype: InstanceType, nics: list[NicPlan], layout: str) -> EfaLayoutSummary:
    efa_count = sum(n.is_efa for n in nics)
    return EfaLayoutSummary(
        instance_type=itype.name,
        layout=layout if efa_count else "none",
        network_cards=len({n.network_card_index for n in nics}),
        interfaces=len(nics),
        efa_interfaces=efa_count,
        ip_interfaces=sum(n.has_ip for n in nics),
        by_type=dict(Counter(n.interface_type for n in nics)),
    )
