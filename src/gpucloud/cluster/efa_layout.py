"""The launch template's network interfaces: a pure function of the instance type and the layout.

Two layouts, as the EC2 User Guide documents them:

``efa-only`` (the current EC2 guide, "Maximize network bandwidth on Amazon EC2 instances with
multiple network cards", https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/efa-acc-inst-types.html):
    card 0 / device 0 is a plain ENA ``interface`` that carries the node's one private IP ("You
    can't use an EFA-only network interface as the primary network interface"); when card 0 has
    EFA and room for a second interface, an ``efa-only`` interface sits at card 0 / device 1;
    every further card gets one ``efa-only`` interface at **device index 0** ("use the next unused
    network card index, device index 0, for EFA-only network interface"). EFA-only interfaces
    have no IP addresses, so a p5 uses one IP instead of 32.
``legacy``:
    every card gets a combined ``efa`` interface (EFA with ENA, each with an IP): card 0 at device
    0, the others at device 1 (0 when the card holds one interface), the layout of the guide's
    earlier edition, ParallelCluster <= 3.14 and most published p4d/p5 templates.

The guide shows the EFA-only layout for P5, P5e and P5en (its "EFA configuration for P5 and P5e
instances" section, https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/efa-acc-inst-types.html#efa-for-p5);
it documents none for p4d/p4de, so those (and every other family) default to ``legacy`` and the
validators refuse an explicit ``efa-only`` for them (``spec/rules.py``).

Without EFA the node gets a single ``interface`` on card 0. The number of EFA interfaces never
exceeds the type's ``MaximumEfaInterfaces``.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from typing import Literal

from gpucloud.catalog import InstanceType, NetworkCard

InterfaceType = Literal["interface", "efa", "efa-only"]
Layout = Literal["efa-only", "legacy"]

# Families the EC2 guide documents the EFA-only layout for (see the module docstring).
EFA_ONLY_FAMILIES: frozenset[str] = frozenset({"p5", "p5e", "p5en"})


def efa_only_documented(itype: InstanceType) -> bool:
    return itype.family in EFA_ONLY_FAMILIES


def resolve_layout(itype: InstanceType, layout: Layout | None) -> Layout:
    """The layout asked for; unset: ``efa-only`` where AWS documents it, else ``legacy``."""
    if layout is not None:
        return layout
    return "efa-only" if efa_only_documented(itype) else "legacy"


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


def _secondary_device_index(card: NetworkCard, layout: Layout) -> int:
    if layout == "efa-only":
        return 0  # the current guide: EFA-only at device 0 of each further card (ENA, if any, at 1)
    return 0 if card.max_interfaces == 1 else 1


def plan_network_interfaces(itype: InstanceType, efa: bool, layout: Layout | None = None) -> list[NicPlan]:
    """The ordered network interfaces a node of ``itype`` gets (``layout`` None: ``resolve_layout``)."""
    layout = resolve_layout(itype, layout)
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
        nics.append(NicPlan(card.index, _secondary_device_index(card, layout), extra_type))
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


def summarize(itype: InstanceType, nics: list[NicPlan], layout: Layout | None) -> EfaLayoutSummary:
    efa_count = sum(n.is_efa for n in nics)
    return EfaLayoutSummary(
        instance_type=itype.name,
        layout=resolve_layout(itype, layout) if efa_count else "none",
        network_cards=len({n.network_card_index for n in nics}),
        interfaces=len(nics),
        efa_interfaces=efa_count,
        ip_interfaces=sum(n.has_ip for n in nics),
        by_type=dict(Counter(n.interface_type for n in nics)),
    )
