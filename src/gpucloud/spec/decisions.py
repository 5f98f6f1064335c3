"""Settings that are decided from the spec plus the catalog (used by the validators and the program)."""

from __future__ import annotations

from gpucloud.catalog import InstanceType
from gpucloud.spec.model import NodeGroup


def efa_enabled(group: NodeGroup, itype: InstanceType) -> bool:
    """EFA ``on`` means on; ``auto`` means on whenever the instance type has EFA interfaces."""
    if group.efa.mode == "off":
        return False
    if group.efa.mode == "on":
        return True
    return itype.efa_supported and itype.max_efa_interfaces > 0


def uses_placement_group(group: NodeGroup, itype: InstanceType) -> bool:
    """An explicit setting wins; otherwise a cluster placement group goes with EFA.

    Never by default on capacity blocks and reservations: those carry their own placement, and a
    second placement group can make launches fail with InsufficientInstanceCapacity.
    """
    if group.placement_group is not None:
        return group.placement_group
    if group.capacity.type in ("capacity-block", "capacity-reservation"):
        return False
    return efa_enabled(group, itype) and itype.supports_cluster_placement
