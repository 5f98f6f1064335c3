"""Parsers for the outputs doctor captures, shaped as the real tools print them.

Every parser raises ``ParseError`` with a one-line reason on output it does not recognise, so a
corrupt or truncated capture becomes a failed check that says what was wrong, never a traceback.
"""

from __future__ import annotations

import csv
import io
import re
from dataclasses import dataclass
from typing import Any
from xml.etree import ElementTree

from gpucloud.payload import parse_json

MAX_SMI_XML_CHARS = 4 * 1024 * 1024  # 27 kB per GPU on an H200 (driver 580); 8 GPUs are well under this
MAX_BLOCK_DEPTH = 16  # disk > partition > RAID > LVM > crypt is 5; deeper is not lsblk output


class ParseError(ValueError):
    pass


@dataclass(frozen=True)
class Gpu:
    index: int
    name: str
    driver_version: str
    memory_mib: int
    bus_id: str


def parse_gpu_query(text: str) -> list[Gpu]:
    """``nvidia-smi --query-gpu=index,name,driver_version,memory.total,pci.bus_id --format=csv``."""
    if "NVIDIA-SMI has failed" in text or "No devices were found" in text:
        raise ParseError(text.strip().splitlines()[0])
    rows = list(csv.reader(io.StringIO(text.strip()), skipinitialspace=True))
    if not rows or [h.split(" [")[0] for h in rows[0]] != [
        "index",
        "name",
        "driver_version",
        "memory.total",
        "pci.bus_id",
    ]:
        raise ParseError("nvidia-smi CSV header is not index, name, driver_version, memory.total, pci.bus_id")
    gpus = []
    for line_no, row in enumerate(rows[1:], start=2):
        if len(row) != 5:
            raise ParseError(f"nvidia-smi CSV line {line_no} has {len(row)} fields, expected 5")
        memory = re.fullmatch(r"(\d+) MiB", row[3].strip())
        if not row[0].strip().isdigit() or memory is None:
            raise ParseError(f"nvidia-smi CSV line {line_no} is not '<index>, <name>, <driver>, <N> MiB, <bus id>'")
        gpus.append(Gpu(int(row[0]), row[1].strip(), row[2].strip(), int(memory[1]), row[4].strip()))
    return gpus


@dataclass(frozen=True)
class GpuMemoryHealth:
    bus_id: str
    remap_pending: bool  # a row remap waits for a GPU reset; until then that memory is unusable
    remap_failure: bool  # the remapper ran out of spare rows: the GPU cannot be repaired in place
    dram_uncorrectable: int  # since the driver loaded (volatile)


def parse_smi_xml_memory(text: str) -> list[GpuMemoryHealth]:
    """Row remapping and uncorrectable DRAM errors per GPU, from ``nvidia-smi -q -x``."""
    if len(text) > MAX_SMI_XML_CHARS:
        raise ParseError(f"nvidia-smi -q -x output is {len(text)} characters, over {MAX_SMI_XML_CHARS}")
    if "<!ENTITY" in text:
        raise ParseError("nvidia-smi -q -x output declares XML entities; nvidia-smi never does")
    try:
        root = ElementTree.fromstring(text)
    except ElementTree.ParseError as err:
        raise ParseError(f"nvidia-smi -q -x output is not XML: {err}") from None
    if root.tag != "nvidia_smi_log":
        raise ParseError(f"nvidia-smi -q -x output has root <{root.tag}>, expected <nvidia_smi_log>")
    health = []
    for gpu in root.findall("gpu"):
        dram = (gpu.findtext("ecc_errors/volatile/dram_uncorrectable") or "").strip()
        health.append(
            GpuMemoryHealth(
                bus_id=gpu.get("id", "?"),
                # Pre-Ampere GPUs have no row remapper: the elements are absent or "N/A".
                remap_pending=(gpu.findtext("remapped_rows/remapped_row_pending") or "").strip() == "Yes",
                remap_failure=(gpu.findtext("remapped_rows/remapped_row_failure") or "").strip() == "Yes",
                dram_uncorrectable=int(dram) if dram.isdigit() else 0,  # "N/A" with ECC off
            )
        )
    return health


def parse_smi_banner(text: str) -> tuple[str, str]:
    """Driver version and the highest CUDA version the driver supports, from plain ``nvidia-smi``."""
    match = re.search(r"Driver Version:\s*([\d.]+)\s+CUDA Version:\s*([\d.]+)", text)
    if match is None:
        first = text.strip().splitlines()[0] if text.strip() else "empty output"
        raise ParseError(f"nvidia-smi banner has no 'Driver Version: ... CUDA Version: ...' line ({first})")
    return match[1], match[2]


def parse_cuda_version_json(text: str) -> str:
    """The toolkit release from ``/usr/local/cuda/version.json`` (``{"cuda": {"version": ...}}``)."""
    try:
        data = parse_json(text, "it", ParseError)  # deep nesting, huge integers: ParseError too
    except ParseError as err:
        raise ParseError(f"/usr/local/cuda/version.json has no cuda.version: {err}") from None
    version = data.get("cuda") if isinstance(data, dict) else None
    version = version.get("version") if isinstance(version, dict) else None
    if not isinstance(version, str) or not version.strip():
        raise ParseError("/usr/local/cuda/version.json has no cuda.version string")
    return version.strip()


def parse_efa_installed(text: str) -> str:
    """The installer release from ``/opt/amazon/efa_installed_packages``."""
    match = re.search(r"^# EFA installer version:\s*(\S+)", text, re.MULTILINE)
    if match is None:
        raise ParseError("/opt/amazon/efa_installed_packages has no '# EFA installer version:' line")
    return match[1]


def parse_fi_info_domains(text: str) -> list[str]:
    """EFA devices listed by ``fi_info -p efa``: distinct domains without the -rdm/-dgrm suffix."""
    if "fi_getinfo" in text or "No data available" in text:
        raise ParseError(f"fi_info found no EFA provider ({text.strip().splitlines()[0]})")
    domains = re.findall(r"^\s*domain:\s*(\S+)", text, re.MULTILINE)
    if not domains:
        raise ParseError("fi_info output lists no 'domain:' entries")
    devices = {re.sub(r"-(rdm|dgrm)$", "", d) for d in domains}
    return sorted(devices)


def parse_infiniband_listing(text: str) -> list[str]:
    """``ls -1 /sys/class/infiniband``: one RDMA device per line (``rdmap16s27`` on EFA)."""
    names = [line.strip() for line in text.splitlines() if line.strip()]
    bad = [n for n in names if not re.fullmatch(r"[\w.-]+", n)]
    if bad:
        raise ParseError(f"/sys/class/infiniband listing has an unexpected entry {bad[0]!r}")
    return names


@dataclass(frozen=True)
class Mount:
    device: str
    path: str
    fstype: str
    options: str


def parse_mounts(text: str) -> list[Mount]:
    """``/proc/mounts`` (also ``mount`` output in the ``<dev> on <path> type <fs> (<opts>)`` form)."""
    mounts = []
    for line_no, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        parts = line.split()
        if len(parts) >= 6 and parts[1] == "on" and parts[3] == "type":
            mounts.append(Mount(parts[0], _unescape(parts[2]), parts[4], parts[5].strip("()")))
        elif len(parts) == 6:
            mounts.append(Mount(parts[0], _unescape(parts[1]), parts[2], parts[3]))
        else:
            raise ParseError(f"mount table line {line_no} is not '<device> <path> <type> <options> 0 0'")
    return mounts


def _unescape(path: str) -> str:
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m[1], 8)), path)


@dataclass(frozen=True)
class BlockDevice:
    name: str
    type: str
    model: str
    mountpoint: str | None
    children: tuple[BlockDevice, ...]

    def mounted_anywhere(self) -> list[str]:
        """Mount points of this device or anything built on it (partition, md RAID, LVM volume)."""
        points = [self.mountpoint] if self.mountpoint else []
        for child in self.children:
            points += child.mounted_anywhere()
        return points


def parse_lsblk(text: str) -> list[BlockDevice]:
    """``lsblk --json -o NAME,TYPE,SIZE,MODEL,MOUNTPOINT``."""
    data = parse_json(text, "lsblk output", ParseError)  # deep nesting, huge integers: ParseError
    raw = data.get("blockdevices") if isinstance(data, dict) else None
    if not isinstance(raw, list):
        raise ParseError("lsblk output is not JSON with a 'blockdevices' list")
    return [_block(d, 1) for d in raw]


def _block(raw: Any, depth: int) -> BlockDevice:
    if not isinstance(raw, dict):
        raise ParseError(f"lsblk lists a device that is not an object: {type(raw).__name__}")
    if depth > MAX_BLOCK_DEPTH:
        raise ParseError(f"lsblk devices nest more than {MAX_BLOCK_DEPTH} levels deep")
    children = raw.get("children") or []
    if not isinstance(children, list):
        raise ParseError(f"lsblk 'children' of {_text(raw.get('name'))} is not a list")
    model, mountpoint = raw.get("model"), raw.get("mountpoint")
    return BlockDevice(
        _text(raw.get("name")),
        _text(raw.get("type")),
        model.strip() if isinstance(model, str) else "",
        mountpoint if isinstance(mountpoint, str) else None,
        tuple(_block(c, depth + 1) for c in children),
    )


def _text(value: Any) -> str:
    """A name or type as text; lsblk prints strings, and a 5000-digit number has no str()."""
    return value if isinstance(value, str) else type(value).__name__


def parse_environ(text: str) -> dict[str, str]:
    """``env`` output: KEY=VALUE per line (continuation lines of multi-line values are skipped)."""
    env = {}
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key):
            env[key] = value
    return env


@dataclass(frozen=True)
class ImdsProbe:
    token_ok: bool
    instance_type: str | None
    error: str | None


def parse_imds(text: str) -> ImdsProbe:
    raw = parse_json(text, "imds.json", ParseError)  # deep nesting, huge integers: ParseError
    shape = "imds.json is not {'token_ok': bool, 'instance_type': str|null, 'error': str|null}"
    if not isinstance(raw, dict) or not isinstance(raw.get("token_ok"), bool):
        raise ParseError(shape)
    instance_type, error = raw.get("instance_type"), raw.get("error")
    if not all(v is None or isinstance(v, str) for v in (instance_type, error)):
        raise ParseError(shape)
    return ImdsProbe(raw["token_ok"], instance_type, error)
