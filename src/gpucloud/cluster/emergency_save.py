"""The emergency-save model: from a spot notice to a durable commit, at cluster sizes.

Pure arithmetic, no I/O. Given the state to save (bytes, summed over the cluster), the number of
nodes writing it, the instance type and the durable tier, it says how long notice -> durable commit
takes, whether that fits in the notice, and the largest state that would. ``gpucloud plan`` prints
it per node group and tier and marks the fastest durable tier. For every shipped stack that is S3,
the tier a job without a URI uses on a cluster (``checkpoint/placement.py``); at a notice the
supervisor judges the same budget (lead minus stop margin) by the job's last measured save.

Every rate is a named constant with its source. Figures marked [estimate] were not measured on
AWS (no AWS and no P4d/P5 here): change them when a drill on real nodes says otherwise.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable

GB = 10**9
GIB = 2**30
TIB = 2**40
MB = 10**6

# A spot interruption notice comes two minutes before EC2 stops or terminates the instance.
# https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/spot-instance-termination-notices.html
NOTICE_LEAD_SECONDS = 120.0
# The supervisor wants the commit this long before the notice deadline: the default of
# spot-train --stop-margin (jobs/supervisor.py reads it from here).
STOP_MARGIN_SECONDS = 5.0
# spot-train polls IMDS once a second by default (--poll-interval): the notice is seen up to 1 s late.
DETECT_SECONDS = 1.0
# Manifest, then LATEST: a handful of small requests after the data is in. [estimate]
COMMIT_SECONDS = 1.0

# FSx for Lustre PERSISTENT_2 SSD: file system throughput = storage (TiB) x PerUnitStorageThroughput
# (MB/s/TiB), for the whole file system, shared by every client; burst credits are for reads.
# https://docs.aws.amazon.com/fsx/latest/LustreGuide/managing-throughput-capacity.html
# https://docs.aws.amazon.com/fsx/latest/LustreGuide/ssd-storage.html
FSX_SOURCE = "https://docs.aws.amazon.com/fsx/latest/LustreGuide/managing-throughput-capacity.html"

# Bandwidth, Gbps, of the network card that carries the node's IP traffic (S3, Lustre without EFA):
# the ENA interface sits on card 0, and EFA-only interfaces carry no IP. Multi-card types list
# their per-card figure; "up to" types their baseline. Instances may use their full bandwidth to
# services in the same Region (S3 through the stack's gateway endpoint: no NAT gateway in the path).
# https://docs.aws.amazon.com/ec2/latest/instancetypes/ac.html (network specifications)
# https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/ec2-instance-network-bandwidth.html
IP_CARD_GBPS: dict[str, float] = {
    "p4d.24xlarge": 100.0,  # 400 Gbps over 4 cards
    "p4de.24xlarge": 100.0,
    "p5.4xlarge": 100.0,
    "p5.48xlarge": 100.0,  # 3200 Gbps over 32 cards
    "p5e.48xlarge": 100.0,
    "p5en.48xlarge": 200.0,  # 3200 Gbps over 16 cards
    "g5.xlarge": 2.5,  # up to 10
    "g5.2xlarge": 5.0,  # up to 10
    "g5.12xlarge": 40.0,
    "g5.48xlarge": 100.0,
    "g6.xlarge": 2.5,  # up to 10
    "g6.2xlarge": 5.0,  # up to 10
    "g6.12xlarge": 40.0,
    "g6.48xlarge": 100.0,
    "g6e.48xlarge": 100.0,  # 400 Gbps over 4 cards
}
UNKNOWN_IP_CARD_GBPS = 10.0  # an instance type the table does not know: assume a small one

# Share of the card's line rate that parallel multipart PUTs to S3 sustain. Each connection to S3
# tops out at 5 Gbps, so a node needs 20+ connections for 100 Gbps (the CRT and s3torchconnector
# open them; boto3's transfer manager opens max_concurrency).
# https://repost.aws/articles/AR1Jqz-WmjRzCgVGa-uVSdLQ/maximizing-amazon-s3-transfer-throughput-to-amazon-ec2-instances
# Third-party CRT measurements upload at 20-60% of a 100 Gbps NIC. [estimate]
S3_LINE_EFFICIENCY = 0.5
S3_SOURCE = "https://repost.aws/articles/AR1Jqz-WmjRzCgVGa-uVSdLQ/maximizing-amazon-s3-transfer-throughput-to-amazon-ec2-instances"

# Instance-store NVMe write rate per drive (drives striped). AWS publishes none. [estimate]
# https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/instance-store-volumes.html
NVME_GBPS_PER_DRIVE = 2.0  # GB/s
# Without NVMe scratch, a save to S3 is staged on the gp3 root volume: 125 MiB/s baseline unless
# provisioned higher (the stack does not). https://docs.aws.amazon.com/ebs/latest/userguide/general-purpose.html
ROOT_GP3_BYTES_PER_SECOND = 125 * 2**20

TIERS = ("fsx", "s3", "nvme")
DURABLE_TIERS = frozenset({"fsx", "s3"})


@dataclasses.dataclass(frozen=True)
class Node:
    """What of an instance type the model needs."""

    instance_type: str
    nvme_drives: int = 0

    @property
    def ip_bytes_per_second(self) -> float:
        return IP_CARD_GBPS.get(self.instance_type, UNKNOWN_IP_CARD_GBPS) * GB / 8

    @property
    def staging_bytes_per_second(self) -> float:
        """Where the runtime stages a save before uploading it: NVMe scratch, else the root volume."""
        return self.nvme_drives * NVME_GBPS_PER_DRIVE * GB if self.nvme_drives else ROOT_GP3_BYTES_PER_SECOND


@dataclasses.dataclass(frozen=True)
class FsxTier:
    """FSx for Lustre PERSISTENT_2: one throughput for the whole file system."""

    size_gib: int
    throughput_per_tib: int  # MB/s per TiB
    name: str = "fsx"
    staged: bool = False  # written in place, committed by a rename

    def cluster_bytes_per_second(self, node: Node, nodes: int) -> float:
        file_system = self.size_gib * GIB / TIB * self.throughput_per_tib * MB
        return min(file_system, nodes * node.ip_bytes_per_second)


@dataclasses.dataclass(frozen=True)
class S3Tier:
    """S3, written from every node at once: each node at its own rate, so it scales with nodes."""

    line_efficiency: float = S3_LINE_EFFICIENCY
    name: str = "s3"
    # The runtime writes the DCP files to a local directory first (checksummed there), then every
    # rank uploads its own files at once (checkpoint/commit.py): the staging write comes first.
    staged: bool = True

    def cluster_bytes_per_second(self, node: Node, nodes: int) -> float:
        return nodes * node.ip_bytes_per_second * self.line_efficiency


@dataclasses.dataclass(frozen=True)
class NvmeTier:
    """The node's own instance store: fast, but lost when the instance terminates (not durable)."""

    name: str = "nvme"
    staged: bool = False

    def cluster_bytes_per_second(self, node: Node, nodes: int) -> float:
        return nodes * node.nvme_drives * NVME_GBPS_PER_DRIVE * GB


Tier = FsxTier | S3Tier | NvmeTier


@dataclasses.dataclass(frozen=True)
class SaveEstimate:
    tier: str
    durable: bool
    state_bytes: int
    nodes: int
    bytes_per_second: float  # effective, the whole cluster's (a staged tier's staging write included)
    seconds: float  # notice -> commit
    budget_seconds: float  # notice lead minus the stop margin
    max_bytes: int  # the largest state that commits within the budget

    @property
    def fits(self) -> bool:
        return self.seconds <= self.budget_seconds

    @property
    def max_gib(self) -> float:
        return self.max_bytes / GIB

    def to_json(self) -> dict[str, object]:
        return {
            "tier": self.tier,
            "durable": self.durable,
            "nodes": self.nodes,
            "state_gib": round(self.state_bytes / GIB, 3),
            "seconds": round(self.seconds, 1),
            "budget_seconds": round(self.budget_seconds, 1),
            "max_gib": round(self.max_gib, 1),
            "fits": self.fits,
            "gb_per_second": round(self.bytes_per_second / GB, 3),
        }


def budget_seconds(lead: float = NOTICE_LEAD_SECONDS, stop_margin: float = STOP_MARGIN_SECONDS) -> float:
    """Seconds from the notice by which the save must be committed."""
    return lead - stop_margin


def estimate(
    state_bytes: int,
    nodes: int,
    node: Node,
    tier: Tier,
    *,
    lead: float = NOTICE_LEAD_SECONDS,
    stop_margin: float = STOP_MARGIN_SECONDS,
) -> SaveEstimate:
    """Notice -> commit for ``state_bytes`` (the whole cluster's) written by ``nodes`` nodes at once."""
    if nodes < 1:
        raise ValueError(f"nodes must be >= 1, got {nodes}")
    if state_bytes < 0:
        raise ValueError(f"state_bytes must be >= 0, got {state_bytes}")
    transfer = tier.cluster_bytes_per_second(node, nodes)
    if tier.staged:  # staging then upload, one after the other: their times add up
        staging = nodes * node.staging_bytes_per_second
        rate = 1 / (1 / staging + 1 / transfer) if staging > 0 and transfer > 0 else 0.0
    else:
        rate = transfer
    budget = budget_seconds(lead, stop_margin)
    overhead = DETECT_SECONDS + COMMIT_SECONDS
    seconds = overhead + (state_bytes / rate if rate > 0 else float("inf"))
    max_bytes = int(max(0.0, budget - overhead) * rate)
    return SaveEstimate(
        tier=tier.name,
        durable=tier.name in DURABLE_TIERS,
        state_bytes=state_bytes,
        nodes=nodes,
        bytes_per_second=rate,
        seconds=seconds,
        budget_seconds=budget,
        max_bytes=max_bytes,
    )


def estimate_seconds_at_rate(state_bytes: int, bytes_per_second: float) -> float:
    """Notice -> commit at a measured rate (the previous save's bytes over its duration)."""
    if bytes_per_second <= 0:
        return float("inf")
    return DETECT_SECONDS + state_bytes / bytes_per_second + COMMIT_SECONDS


def cluster_tiers(fsx: FsxTier | None, node: Node) -> list[Tier]:
    """The tiers a cluster has: S3 (always: the checkpoint bucket), FSx when the stack makes one,
    the NVMe when the instance type has drives."""
    tiers: list[Tier] = [S3Tier()]
    if fsx is not None:
        tiers.insert(0, fsx)
    if node.nvme_drives > 0:
        tiers.append(NvmeTier())
    return tiers


def fastest_durable(estimates: Iterable[SaveEstimate]) -> SaveEstimate | None:
    """The durable tier that commits soonest: the fastest (same state everywhere; ties: the first)."""
    durable = [e for e in estimates if e.durable]
    return max(durable, key=lambda e: e.bytes_per_second) if durable else None
