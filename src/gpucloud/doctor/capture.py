"""What doctor captures on a node: one named output per command or file.

The names double as file names in a recorded capture directory (``gpucloud doctor --record DIR``
writes one, ``--recorded DIR`` reads one back), so a node's state can be attached to a ticket and
re-checked anywhere. ``None`` means the command is missing or failed to run.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

GPU_QUERY_FIELDS = "index,name,driver_version,memory.total,pci.bus_id"

NVIDIA_SMI_QUERY = "nvidia-smi-query.csv"
NVIDIA_SMI = "nvidia-smi.txt"
NVIDIA_SMI_XML = "nvidia-smi-q.xml"
CUDA_VERSION_JSON = "cuda-version.json"
NCCL_PACKAGE = "nccl-version.txt"
EFA_INSTALLED = "efa_installed_packages"
FI_INFO_EFA = "fi_info-efa.txt"
INFINIBAND = "sys-class-infiniband.txt"
MOUNTS = "proc-mounts.txt"
LSBLK = "lsblk.json"
ENVIRON = "environ.txt"
IMDS = "imds.json"
ENV_PREFIXES = ("NCCL_", "FI_", "RDMAV_", "CUDA_", "LD_LIBRARY_PATH", "LD_PRELOAD")
UNIT_PREFIX = "systemctl-is-active-"  # + unit name + ".txt"

# Where each output comes from on a node: a command (argv) or a file to read.
COMMANDS: dict[str, tuple[str, ...]] = {
    NVIDIA_SMI_QUERY: ("nvidia-smi", f"--query-gpu={GPU_QUERY_FIELDS}", "--format=csv"),
    NVIDIA_SMI: ("nvidia-smi",),
    NVIDIA_SMI_XML: ("nvidia-smi", "-q", "-x"),
    NCCL_PACKAGE: ("dpkg-query", "-W", "-f=${Version}", "libnccl2"),
    FI_INFO_EFA: ("fi_info", "-p", "efa", "-t", "FI_EP_RDM"),
    INFINIBAND: ("ls", "-1", "/sys/class/infiniband"),
    LSBLK: ("lsblk", "--json", "-o", "NAME,TYPE,SIZE,MODEL,MOUNTPOINT"),
}
# Outputs whose error text the parsers turn into a reason ("NVIDIA-SMI has failed ...", "fi_getinfo: -61");
# any other command that exits non-zero counts as missing.
KEEP_FAILURE_OUTPUT = frozenset({NVIDIA_SMI_QUERY, NVIDIA_SMI, FI_INFO_EFA})
FILES: dict[str, str] = {
    CUDA_VERSION_JSON: "/usr/local/cuda/version.json",
    EFA_INSTALLED: "/opt/amazon/efa_installed_packages",
    MOUNTS: "/proc/mounts",
}
# Not on PATH for non-login shells on every AMI.
EXTRA_PATH = ("/opt/amazon/efa/bin", "/usr/local/cuda/bin", "/usr/bin", "/bin", "/usr/sbin", "/sbin")


def unit_key(unit: str) -> str:
    return f"{UNIT_PREFIX}{unit}.txt"


@dataclass(frozen=True)
class NodeCapture:
    outputs: Mapping[str, str | None] = field(default_factory=dict)

    def get(self, key: str) -> str | None:
        return self.outputs.get(key)
