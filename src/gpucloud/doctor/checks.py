"""Node checks: pure functions from a ``NodeCapture`` and what the stack promised to a result.

One small function per check, each with its own fix text. ``skip`` means the check does not apply
(no EFA on this type, no matrix given); ``warn`` means it works but is not as intended; ``fail``
means training on this node will break or crawl.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Literal, cast

from gpucloud.catalog import InstanceType
from gpucloud.doctor import capture as cap
from gpucloud.doctor import parsers
from gpucloud.doctor.capture import NodeCapture
from gpucloud.image.matrix import VersionMatrix
from gpucloud.image.versions import Version, VersionError

Status = Literal["pass", "warn", "fail", "skip"]
SEVERITY: dict[str, int] = {"pass": 0, "skip": 0, "warn": 1, "fail": 2}

INSTANCE_STORE_MODEL = "Amazon EC2 NVMe Instance Storage"
DLAMI_SCRATCH = "/opt/dlami/nvme"
GPU_MEMORY_TOLERANCE = 0.05  # nvidia-smi reports usable memory (81559 MiB on an 80 GiB H100)


@dataclass(frozen=True)
class Expectations:
    instance_type: InstanceType | None
    matrix: VersionMatrix | None
    fsx_mount: str | None = "/fsx"
    scratch_mount: str | None = "/scratch"
    agent_unit: str = "gpucloud-agent"


@dataclass(frozen=True)
class CheckResult:
    check: str
    status: Status
    observed: str
    expected: str
    fix: str = ""

    def to_dict(self) -> dict[str, str]:
        return asdict(self)


Check = Callable[[NodeCapture, Expectations], CheckResult]


def _missing(check: str, what: str, expected: str, fix: str) -> CheckResult:
    return CheckResult(check, "fail", f"{what} not available", expected, fix)


def _gpus(node: NodeCapture) -> list[parsers.Gpu] | str:
    text = node.get(cap.NVIDIA_SMI_QUERY)
    if text is None:
        return "nvidia-smi not found"
    try:
        return parsers.parse_gpu_query(text)
    except parsers.ParseError as err:
        return str(err)


_DRIVER_FIX = "install the NVIDIA driver from the gpucloud image (images/versions.yaml) or use the DLAMI"


def gpu_count(node: NodeCapture, want: Expectations) -> CheckResult:
    name = "GPU count"
    if want.instance_type is None:
        return CheckResult(name, "skip", "", "", "pass --instance-type (IMDS did not say)")
    expected = f"{want.instance_type.gpus} ({want.instance_type.name})"
    gpus = _gpus(node)
    if isinstance(gpus, str):
        return CheckResult(name, "fail", gpus, expected, _DRIVER_FIX)
    if len(gpus) == want.instance_type.gpus:
        return CheckResult(name, "pass", str(len(gpus)), expected)
    return CheckResult(
        name,
        "fail",
        str(len(gpus)),
        expected,
        "a GPU fell off the bus: check 'dmesg | grep -i xid', then stop/start the instance (a reboot is not enough)",
    )


def gpu_model(node: NodeCapture, want: Expectations) -> CheckResult:
    name = "GPU model and memory"
    if want.instance_type is None:
        return CheckResult(name, "skip", "", "", "pass --instance-type")
    it = want.instance_type
    expected = f"{it.gpu_model}, ~{it.gpu_memory_mib} MiB"
    gpus = _gpus(node)
    if isinstance(gpus, str):
        return CheckResult(name, "fail", gpus, expected, _DRIVER_FIX)
    if not gpus:
        return CheckResult(name, "fail", "no GPUs", expected, _DRIVER_FIX)
    wrong_model = [g for g in gpus if it.gpu_model.split("-")[0] not in g.name]
    short = [g for g in gpus if g.memory_mib < it.gpu_memory_mib * (1 - GPU_MEMORY_TOLERANCE)]
    observed = f"{gpus[0].name}, {gpus[0].memory_mib} MiB"
    if wrong_model:
        return CheckResult(
            name,
            "fail",
            f"GPU {wrong_model[0].index} is {wrong_model[0].name}",
            expected,
            "the node is not the instance type the stack asked for: check the launch template",
        )
    if short:
        return CheckResult(
            name,
            "fail",
            f"GPU {short[0].index} has {short[0].memory_mib} MiB",
            expected,
            "GPU memory is missing (row remapping pending or MIG on): run 'nvidia-smi -q -d ROW_REMAPPER' and reset the GPU",
        )
    return CheckResult(name, "pass", observed, expected)


def gpu_memory_health(node: NodeCapture, want: Expectations) -> CheckResult:
    name = "GPU memory health"
    expected = "no row remapping pending or failed, no uncorrectable DRAM errors"
    text = node.get(cap.NVIDIA_SMI_XML)
    if text is None:
        return CheckResult(name, "skip", "nvidia-smi -q -x not available", expected)
    try:
        gpus = parsers.parse_smi_xml_memory(text)
    except parsers.ParseError as err:
        return CheckResult(name, "fail", str(err), expected, _DRIVER_FIX)
    failed = [g for g in gpus if g.remap_failure]
    if failed:
        return CheckResult(
            name,
            "fail",
            f"row remapping failed on GPU {failed[0].bus_id}",
            expected,
            "the GPU has no spare memory rows left: stop the instance so the group replaces it, and report it to AWS",
        )
    pending = [g for g in gpus if g.remap_pending]
    if pending:
        return CheckResult(
            name,
            "fail",
            f"row remapping pending on GPU {pending[0].bus_id}",
            expected,
            "the remap takes effect at a GPU reset: drain the node, then stop/start the instance",
        )
    errors = [g for g in gpus if g.dram_uncorrectable]
    if errors:
        return CheckResult(
            name,
            "warn",
            f"{errors[0].dram_uncorrectable} uncorrectable DRAM errors on GPU {errors[0].bus_id} since the driver loaded",
            expected,
            "the rows are being remapped (check again after a reset); jobs hit by them fail with XID 48/63",
        )
    return CheckResult(name, "pass", f"{len(gpus)} GPUs, no remapping pending or failed", expected)


def _pinned(want: Expectations, key: str) -> Version | None:
    return want.matrix.v(key) if want.matrix is not None else None


def _version_check(name: str, observed: str | None, pinned: Version | None, fix: str) -> CheckResult:
    if pinned is None:
        return CheckResult(name, "skip", observed or "", "", "pass --matrix images/versions.yaml to compare")
    if observed is None:
        return CheckResult(name, "fail", "not installed", str(pinned), fix)
    try:
        ok = Version.parse(observed) == pinned
    except VersionError:
        return CheckResult(name, "fail", f"unreadable version {observed!r}", str(pinned), fix)
    return CheckResult(name, "pass" if ok else "fail", observed, str(pinned), "" if ok else fix)


def driver_version(node: NodeCapture, want: Expectations) -> CheckResult:
    gpus = _gpus(node)
    observed = gpus[0].driver_version if isinstance(gpus, list) and gpus else None
    return _version_check(
        "NVIDIA driver version",
        observed,
        _pinned(want, "nvidia_driver"),
        "rebuild the image from images/versions.yaml (the driver differs from the pin)",
    )


def driver_supports_toolkit(node: NodeCapture, want: Expectations) -> CheckResult:
    name = "driver supports the CUDA toolkit"
    banner, version_json = node.get(cap.NVIDIA_SMI), node.get(cap.CUDA_VERSION_JSON)
    if banner is None or version_json is None:
        return CheckResult(name, "skip", "nvidia-smi or /usr/local/cuda missing", "")
    try:
        _, driver_cuda = parsers.parse_smi_banner(banner)
        toolkit = parsers.parse_cuda_version_json(version_json)
    except parsers.ParseError as err:
        return CheckResult(name, "fail", str(err), "driver CUDA >= toolkit", _DRIVER_FIX)
    ok = Version.parse(toolkit).major_minor <= Version.parse(driver_cuda).major_minor
    return CheckResult(
        name,
        "pass" if ok else "fail",
        f"driver CUDA {driver_cuda}, toolkit {toolkit}",
        "driver CUDA >= toolkit",
        ""
        if ok
        else "the toolkit is newer than the driver: upgrade the driver or install the CUDA forward-compat package",
    )


def cuda_toolkit_version(node: NodeCapture, want: Expectations) -> CheckResult:
    text = node.get(cap.CUDA_VERSION_JSON)
    try:
        observed = parsers.parse_cuda_version_json(text) if text is not None else None
    except parsers.ParseError as err:
        return CheckResult(
            "CUDA toolkit version",
            "fail",
            str(err),
            str(_pinned(want, "cuda") or ""),
            "reinstall the CUDA toolkit (cuda.sh install)",
        )
    return _version_check(
        "CUDA toolkit version",
        observed,
        _pinned(want, "cuda"),
        "rebuild the image from images/versions.yaml (the CUDA toolkit differs from the pin)",
    )


def nccl_version(node: NodeCapture, want: Expectations) -> CheckResult:
    text = node.get(cap.NCCL_PACKAGE)
    observed = text.strip() if text and text.strip() else None
    return _version_check(
        "NCCL version",
        observed,
        _pinned(want, "nccl"),
        "rebuild the image from images/versions.yaml (libnccl2 differs from the pin)",
    )


def efa_installer_version(node: NodeCapture, want: Expectations) -> CheckResult:
    name = "EFA installer version"
    if want.instance_type is not None and not want.instance_type.efa_supported:
        return CheckResult(name, "skip", "", "", f"{want.instance_type.name} has no EFA")
    text = node.get(cap.EFA_INSTALLED)
    try:
        observed = parsers.parse_efa_installed(text) if text is not None else None
    except parsers.ParseError as err:
        return CheckResult(
            name,
            "fail",
            str(err),
            str(_pinned(want, "efa_installer") or ""),
            "rerun the EFA installer (efa.sh install)",
        )
    return _version_check(
        name,
        observed,
        _pinned(want, "efa_installer"),
        "rebuild the image from images/versions.yaml (the EFA installer differs from the pin)",
    )


def efa_device_count(node: NodeCapture, want: Expectations) -> CheckResult:
    name = "EFA devices"
    it = want.instance_type
    if it is None:
        return CheckResult(name, "skip", "", "", "pass --instance-type")
    if not it.efa_supported or it.max_efa_interfaces == 0:
        return CheckResult(name, "skip", "", "0", f"{it.name} has no EFA")
    expected = f"{it.max_efa_interfaces} ({it.name})"
    fix_layout = (
        "the launch template attaches fewer EFA interfaces than the type supports: one per network "
        "card (gpucloud plan shows the layout); p5en may need a few seconds after boot"
    )
    fi_info, listing = node.get(cap.FI_INFO_EFA), node.get(cap.INFINIBAND)
    try:
        if fi_info is not None:
            devices = parsers.parse_fi_info_domains(fi_info)
        elif listing is not None:
            devices = parsers.parse_infiniband_listing(listing)
        else:
            return _missing(
                name,
                "fi_info and /sys/class/infiniband",
                expected,
                "install the EFA software (efa.sh install) and use an EFA-enabled launch template",
            )
    except parsers.ParseError as err:
        return CheckResult(
            name,
            "fail",
            str(err),
            expected,
            "no EFA device: attach EFA interfaces in the launch template and load the efa kernel module",
        )
    if len(devices) == it.max_efa_interfaces:
        return CheckResult(name, "pass", str(len(devices)), expected)
    return CheckResult(name, "fail", str(len(devices)), expected, fix_layout)


# Variable -> (status when set, why). Source: aws-ofi-nccl doc/efa-env-var.md (modern stack).
HARMFUL_ENV: dict[str, tuple[Status, str]] = {
    "NCCL_PROTO": ("fail", "only for aws-ofi-nccl <= 1.5.0; forcing a protocol costs bandwidth"),
    "FI_EFA_USE_DEVICE_RDMA": ("warn", "not needed with libfabric >= 1.18 and aws-ofi-nccl >= 1.7"),
    "FI_EFA_FORK_SAFE": ("warn", "the aws-ofi-nccl plugin sets it itself"),
    "FI_EFA_ENABLE_SHM_TRANSFER": ("warn", "the plugin disables SHM itself"),
    "FI_EFA_SET_CUDA_SYNC_MEMOPS": ("warn", "only for EFA installer < 1.29.1 with NCCL >= 2.19"),
    "NCCL_MIN_CHANNELS": ("warn", "more channels starve EFA; leave the default"),
    "NCCL_BUFFSIZE": ("warn", "leave the default unless a benchmark says otherwise"),
    "NCCL_SOCKET_NTHREADS": ("warn", "socket transport tuning; not used on EFA"),
    "NCCL_NSOCKS_PERTHREAD": ("warn", "socket transport tuning; not used on EFA"),
}


def nccl_environment(node: NodeCapture, want: Expectations) -> CheckResult:
    name = "NCCL/libfabric environment"
    text = node.get(cap.ENVIRON)
    if text is None:
        return CheckResult(name, "skip", "environment not captured", "")
    env = parsers.parse_environ(text)
    found: list[tuple[Status, str]] = []
    for var, (status, why) in HARMFUL_ENV.items():
        if var in env:
            found.append((status, f"{var}={env[var]} ({why})"))
    for var in sorted(k for k in env if k.startswith("RDMAV_")):
        found.append(("fail", f"{var}={env[var]} (RDMAV_* can break EFA on newer kernels)"))
    if not found:
        return CheckResult(name, "pass", "no obsolete or harmful variables", "none set")
    worst = max((s for s, _ in found), key=SEVERITY.__getitem__)
    names = ", ".join(f.split("=")[0] for _, f in found)
    return CheckResult(
        name,
        worst,
        "; ".join(f for _, f in found),
        "none set",
        f"unset {names} (in /etc/profile.d, the job script or the container image)",
    )


def _mounts(node: NodeCapture) -> list[parsers.Mount] | str:
    text = node.get(cap.MOUNTS)
    if text is None:
        return "/proc/mounts not captured"
    try:
        return parsers.parse_mounts(text)
    except parsers.ParseError as err:
        return str(err)


def fsx_mounted(node: NodeCapture, want: Expectations) -> CheckResult:
    name = "FSx for Lustre mounted"
    if not want.fsx_mount:
        return CheckResult(name, "skip", "", "", "the stack has no FSx file system")
    expected = f"lustre at {want.fsx_mount}"
    fix = (
        f"mount it: 'sudo mount -t lustre -o relatime,flock <fs-dns>@tcp:/<mount-name> {want.fsx_mount}' "
        "(node bootstrap does this; check the security group allows TCP 988)"
    )
    mounts = _mounts(node)
    if isinstance(mounts, str):
        return CheckResult(name, "fail", mounts, expected, fix)
    at_path = [m for m in mounts if m.path == want.fsx_mount]
    if any(m.fstype == "lustre" for m in at_path):
        return CheckResult(name, "pass", next(m.device for m in at_path if m.fstype == "lustre"), expected)
    if any(m.fstype == "autofs" for m in at_path):
        return CheckResult(
            name,
            "warn",
            f"systemd automount armed at {want.fsx_mount}, not yet mounted",
            expected,
            f"run 'ls {want.fsx_mount}' to trigger it; if that hangs, the file system is unreachable",
        )
    if at_path:
        return CheckResult(name, "fail", f"{at_path[-1].fstype} at {want.fsx_mount}", expected, fix)
    return CheckResult(name, "fail", f"nothing mounted at {want.fsx_mount}", expected, fix)


def nvme_scratch(node: NodeCapture, want: Expectations) -> CheckResult:
    name = "NVMe scratch"
    it = want.instance_type
    if it is None or it.nvme_disks == 0 or not want.scratch_mount:
        return CheckResult(name, "skip", "", "", "no instance-store NVMe expected")
    expected = f"{it.nvme_disks} instance-store disks in a volume at {want.scratch_mount}"
    fix = "run the node bootstrap's scratch step (scripts/node-bootstrap.sh) to stripe and mount the disks"
    mounts, text = _mounts(node), node.get(cap.LSBLK)
    if isinstance(mounts, str) or text is None:
        return CheckResult(name, "fail", mounts if isinstance(mounts, str) else "lsblk not captured", expected, fix)
    try:
        disks = [d for d in parsers.parse_lsblk(text) if d.model == INSTANCE_STORE_MODEL]
    except parsers.ParseError as err:
        return CheckResult(name, "fail", str(err), expected, fix)
    paths = {want.scratch_mount, DLAMI_SCRATCH}
    mounted = [m for m in mounts if m.path in paths]
    unused = [d.name for d in disks if not d.mounted_anywhere()]
    observed = f"{len(disks)} disks, {len(disks) - len(unused)} in use, " + (
        f"mounted at {mounted[0].path}" if mounted else "no scratch mount"
    )
    if not mounted:
        return CheckResult(name, "fail", observed, expected, fix)
    if len(disks) < it.nvme_disks:
        return CheckResult(
            name, "warn", observed, expected, "an instance-store disk is missing: stop/start the instance"
        )
    if unused:
        return CheckResult(
            name,
            "warn",
            observed,
            expected,
            f"{', '.join(unused)} not in the scratch volume: rebuild it over all disks (data is scratch)",
        )
    return CheckResult(name, "pass", observed, expected)


def imds_token(node: NodeCapture, want: Expectations) -> CheckResult:
    name = "IMDSv2 reachable"
    text = node.get(cap.IMDS)
    fix = (
        "the launch template needs metadata http-endpoint enabled, http-tokens required and hop limit 2 "
        "(containers are one hop further); spot notices are read from IMDS"
    )
    if text is None:
        return CheckResult(name, "fail", "IMDS not probed", "token issued", fix)
    try:
        probe = parsers.parse_imds(text)
    except parsers.ParseError as err:
        return CheckResult(name, "fail", str(err), "token issued", fix)
    if probe.token_ok:
        return CheckResult(name, "pass", f"token issued; instance type {probe.instance_type}", "token issued")
    return CheckResult(name, "fail", probe.error or "no token", "token issued", fix)


def _unit_state(node: NodeCapture, unit: str) -> str | None:
    text = node.get(cap.unit_key(unit))
    return text.strip().splitlines()[-1] if text and text.strip() else None


def agent_running(node: NodeCapture, want: Expectations) -> CheckResult:
    name = "gpucloud agent running"
    state = _unit_state(node, want.agent_unit)
    if state == "active":
        return CheckResult(name, "pass", f"{want.agent_unit}: active", "active")
    status: Status = "warn" if state == "activating" else "fail"
    return CheckResult(
        name,
        status,
        f"{want.agent_unit}: {state or 'unknown'}",
        "active",
        f"'systemctl status {want.agent_unit}' and 'journalctl -u {want.agent_unit}'; node bootstrap installs it",
    )


def _has_nvswitch(it: InstanceType | None) -> bool:
    # P4d/P4de/P5* connect their 8 GPUs through NVSwitch; CUDA fails (error 802) without Fabric Manager.
    return it is not None and it.family.startswith("p") and it.gpus == 8


def fabric_manager_running(node: NodeCapture, want: Expectations) -> CheckResult:
    name = "NVIDIA Fabric Manager running"
    if not _has_nvswitch(want.instance_type):
        return CheckResult(name, "skip", "", "", "no NVSwitch on this instance type")
    state = _unit_state(node, "nvidia-fabricmanager")
    if state == "active":
        return CheckResult(name, "pass", "active", "active")
    return CheckResult(
        name,
        "fail",
        state or "unknown",
        "active",
        "'sudo systemctl enable --now nvidia-fabricmanager'; its version must equal the driver's",
    )


def dcgm_running(node: NodeCapture, want: Expectations) -> CheckResult:
    name = "DCGM running"
    state = _unit_state(node, "nvidia-dcgm")
    if state == "active":
        return CheckResult(name, "pass", "active", "active")
    return CheckResult(
        name,
        "warn",
        state or "unknown",
        "active",
        "'sudo systemctl enable --now nvidia-dcgm' (GPU health and XID reporting)",
    )


CHECKS: tuple[Check, ...] = (
    gpu_count,
    gpu_model,
    gpu_memory_health,
    driver_version,
    driver_supports_toolkit,
    cuda_toolkit_version,
    nccl_version,
    efa_installer_version,
    efa_device_count,
    nccl_environment,
    fsx_mounted,
    nvme_scratch,
    imds_token,
    agent_running,
    fabric_manager_running,
    dcgm_running,
)

UNITS_CHECKED = ("nvidia-fabricmanager", "nvidia-dcgm")


def run_checks(node: NodeCapture, want: Expectations) -> list[CheckResult]:
    return [check(node, want) for check in CHECKS]


def overall(results: list[CheckResult]) -> Status:
    worst = max((r.status for r in results), key=SEVERITY.__getitem__, default="pass")
    return "pass" if worst == "skip" else cast(Status, worst)
