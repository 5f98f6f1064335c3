"""Compatibility rules over the version matrix: one small pure function per rule.

Each rule returns a ``RuleResult``; a failure's ``detail`` names the two versions that clash and
why, so ``gpucloud image check`` can print it as one line. ``warn`` means the tables in
``compat.py`` do not know a version (newer than our sources): checked by a person, not guessed.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Literal

from gpucloud.image import compat
from gpucloud.image.matrix import VersionMatrix
from gpucloud.image.versions import Version

Status = Literal["pass", "warn", "fail"]


@dataclass(frozen=True)
class RuleResult:
    rule: str
    status: Status
    detail: str

    def to_dict(self) -> dict[str, str]:
        return asdict(self)


Rule = Callable[[VersionMatrix], RuleResult]


def _result(rule: str, ok: bool, passed: str, failed: str) -> RuleResult:
    return RuleResult(rule, "pass" if ok else "fail", passed if ok else failed)


def _cuda_min_driver(cuda: Version) -> Version | None:
    """Minimum driver for a CUDA release; an unlisted patch takes the newest listed one before it."""
    same_series = [k for k in compat.CUDA_MIN_DRIVER if k.major_minor == cuda.major_minor and k <= cuda]
    return compat.CUDA_MIN_DRIVER[max(same_series)] if same_series else None


def _targets_p5(matrix: VersionMatrix) -> list[str]:
    return [t for t in matrix.targets if t.split(".")[0].startswith("p5")]


def driver_meets_cuda_toolkit(m: VersionMatrix) -> RuleResult:
    name = "driver meets the CUDA toolkit's minimum driver"
    driver, cuda = m.v("nvidia_driver"), m.v("cuda")
    needed = _cuda_min_driver(cuda)
    if needed is None:
        return RuleResult(
            name, "warn", f"CUDA {cuda} is not in the known toolkit/driver table; check its release notes"
        )
    return _result(
        name,
        driver >= needed,
        f"driver {driver} >= {needed} required by CUDA {cuda}",
        f"driver {driver} is older than {needed}, the minimum driver for CUDA toolkit {cuda}",
    )


def pytorch_cuda_supported_by_driver(m: VersionMatrix) -> RuleResult:
    name = "PyTorch's CUDA build is supported by the driver"
    driver, torch_cuda = m.v("nvidia_driver"), m.v("pytorch_cuda")
    needed = _cuda_min_driver(Version(torch_cuda.major_minor.release + (0,)))
    if needed is None:
        return RuleResult(name, "warn", f"CUDA {torch_cuda} is not in the known toolkit/driver table")
    return _result(
        name,
        driver >= needed,
        f"driver {driver} >= {needed} required by the cu{torch_cuda.major}{torch_cuda.minor} wheel",
        f"driver {driver} cannot run PyTorch built for CUDA {torch_cuda} (needs driver >= {needed})",
    )


def pytorch_build_published(m: VersionMatrix) -> RuleResult:
    name = "PyTorch is published for that CUDA build"
    torch, torch_cuda = m.v("pytorch"), m.v("pytorch_cuda")
    builds = compat.PYTORCH_CUDA_BUILDS.get(torch.major_minor)
    if builds is None:
        return RuleResult(
            name, "warn", f"PyTorch {torch} is newer than the known build table; check download.pytorch.org"
        )
    known = ", ".join(str(b) for b in builds)
    return _result(
        name,
        torch_cuda.major_minor in builds,
        f"PyTorch {torch} has a CUDA {torch_cuda} wheel",
        f"PyTorch {torch} has no CUDA {torch_cuda} wheel (published: {known})",
    )


def pytorch_cuda_matches_toolkit(m: VersionMatrix) -> RuleResult:
    name = "PyTorch's CUDA major equals the toolkit's"
    torch_cuda, cuda = m.v("pytorch_cuda"), m.v("cuda")
    return _result(
        name,
        torch_cuda.major == cuda.major and torch_cuda.major_minor <= cuda.major_minor,
        f"PyTorch built for CUDA {torch_cuda} and toolkit {cuda} share CUDA {cuda.major}",
        f"PyTorch built for CUDA {torch_cuda} and toolkit CUDA {cuda} differ: custom CUDA extensions "
        f"(torch.utils.cpp_extension) need the same major and a toolkit at least as new",
    )


def python_supported_by_pytorch(m: VersionMatrix) -> RuleResult:
    name = "Python is one PyTorch publishes wheels for"
    python, torch = m.v("python"), m.v("pytorch")
    span = compat.PYTORCH_PYTHON_RANGE.get(torch.major_minor)
    if span is None:
        return RuleResult(name, "warn", f"PyTorch {torch} is newer than the known Python table")
    low, high = span
    return _result(
        name,
        low <= python.major_minor <= high,
        f"Python {python} is within {low}..{high} for PyTorch {torch}",
        f"Python {python} has no PyTorch {torch} wheel (supported: {low}..{high})",
    )


def python_is_base_os_python(m: VersionMatrix) -> RuleResult:
    name = "Python is the base OS's system Python"
    python, os_version = m.v("python"), m.base_os.version
    system = compat.UBUNTU[os_version][0]
    return _result(
        name,
        python.major_minor == system,
        f"Ubuntu {os_version} ships Python {system}",
        f"Python {python} is pinned but Ubuntu {os_version} ships Python {system}; the image's virtualenv "
        f"is built on the system interpreter",
    )


def cuda_available_for_base_os(m: VersionMatrix) -> RuleResult:
    name = "CUDA has a package repository for the base OS"
    cuda, os_version = m.v("cuda"), m.base_os.version
    oldest = compat.UBUNTU[os_version][1]
    return _result(
        name,
        cuda.major_minor >= oldest,
        f"CUDA {cuda} is packaged for Ubuntu {os_version}",
        f"CUDA {cuda} has no package for Ubuntu {os_version} (first packaged in CUDA {oldest})",
    )


def _library_built_for_cuda(m: VersionMatrix, key: str, label: str, table: dict) -> RuleResult:
    """A CUDA library (cuDNN, NCCL) is published for the matrix's CUDA major from some version on."""
    name = f"{label} is built for the CUDA major"
    library, cuda = m.v(key), m.v("cuda")
    oldest = table.get(cuda.major)
    if oldest is None:
        return RuleResult(name, "warn", f"CUDA {cuda.major} is not in the known {label} table")
    return _result(
        name,
        library >= oldest,
        f"{label} {library} has a CUDA {cuda.major} build",
        f"{label} {library} has no build for CUDA {cuda} (first: {label} {oldest})",
    )


def cudnn_built_for_cuda(m: VersionMatrix) -> RuleResult:
    return _library_built_for_cuda(m, "cudnn", "cuDNN", compat.CUDNN_MIN_FOR_CUDA_MAJOR)


def nccl_built_for_cuda(m: VersionMatrix) -> RuleResult:
    return _library_built_for_cuda(m, "nccl", "NCCL", compat.NCCL_MIN_FOR_CUDA_MAJOR)


def efa_installer_for_nccl(m: VersionMatrix) -> RuleResult:
    name = "EFA installer is new enough for NCCL"
    nccl, efa = m.v("nccl"), m.v("efa_installer")
    ok = nccl < compat.NCCL_NEEDS_NEWER_EFA or efa >= compat.EFA_FOR_NCCL_2_19
    return _result(
        name,
        ok,
        f"EFA installer {efa} works with NCCL {nccl}",
        f"NCCL {nccl} needs EFA installer >= {compat.EFA_FOR_NCCL_2_19} (pinned {efa}): older libfabric "
        f"fails NCCL >= 2.19 with 'Unable to register memory'",
    )


def dcgm_exporter_matches_dcgm(m: VersionMatrix) -> RuleResult:
    """dcgm-exporter is tagged ``<DCGM it is built on>-<exporter release>`` and links the host
    engine's libdcgm of that major (NVIDIA's packages depend on datacenter-gpu-manager-<major>-core):
    https://github.com/NVIDIA/dcgm-exporter/blob/main/RELEASE.md"""
    name = "dcgm-exporter is built for the image's DCGM major"
    dcgm, exporter = m.v("dcgm"), m.v("dcgm_exporter")
    if not exporter.suffix.startswith("-") or len(exporter.suffix) < 2:
        return RuleResult(
            name, "fail", f"dcgm-exporter {exporter} is not NVIDIA's <DCGM>-<exporter> tag, e.g. 4.4.2-4.7.1"
        )
    if exporter.major != dcgm.major:
        return RuleResult(
            name,
            "fail",
            f"dcgm-exporter {exporter} is built on DCGM {exporter.major} but the image installs DCGM {dcgm}: "
            f"pick a {dcgm.major}.x-* tag",
        )
    if exporter > dcgm:
        return RuleResult(
            name, "warn", f"dcgm-exporter {exporter} is built on a newer DCGM than the image's {dcgm}; check its fields"
        )
    return RuleResult(name, "pass", f"dcgm-exporter {exporter} is built on DCGM {dcgm.major} like the image's {dcgm}")


def driver_supports_target_gpus(m: VersionMatrix) -> RuleResult:
    name = "driver supports every target GPU"
    driver = m.v("nvidia_driver")
    for target in m.targets:
        family = target.split(".")[0]
        if family in compat.GPU_FAMILY_MIN_DRIVER:
            gpu, needed = compat.GPU_FAMILY_MIN_DRIVER[family]
            if driver < needed:
                return RuleResult(name, "fail", f"driver {driver} predates {gpu} ({target}); needs >= {needed}")
    return RuleResult(name, "pass", f"driver {driver} supports {', '.join(m.targets)}")


def lustre_client_for_base_os(m: VersionMatrix) -> RuleResult:
    name = "Lustre client is packaged for the base OS"
    lustre, os_version = m.v("lustre_client"), m.base_os.version
    series = compat.UBUNTU[os_version][2]
    return _result(
        name,
        lustre.startswith(series),
        f"Lustre {lustre} client is in the FSx repository for Ubuntu {os_version}",
        f"Lustre client {lustre} is not packaged for Ubuntu {os_version} (FSx repository ships {series})",
    )


def _p5_minimum(rule: str, key: str, label: str, minimum: Version) -> Rule:
    def check(m: VersionMatrix) -> RuleResult:
        p5 = _targets_p5(m)
        pinned = m.v(key)
        if not p5:
            return RuleResult(rule, "pass", "no P5-class target")
        return _result(
            rule,
            pinned >= minimum,
            f"{label} {pinned} >= {minimum} for {p5[0]}",
            f"{label} {pinned} is below {minimum}, the minimum for {p5[0]} (P5-class EFA/NCCL stack)",
        )

    check.__name__ = f"p5_minimum_{key}"
    return check


p5_minimum_cuda = _p5_minimum("P5: CUDA >= 12.0", "cuda", "CUDA", compat.P5_MIN_CUDA)
p5_minimum_nccl = _p5_minimum("P5: NCCL >= 2.18.5", "nccl", "NCCL", compat.P5_MIN_NCCL)
p5_minimum_aws_ofi_nccl = _p5_minimum(
    "P5: aws-ofi-nccl >= 1.7.3", "aws_ofi_nccl", "aws-ofi-nccl", compat.P5_MIN_AWS_OFI_NCCL
)
p5_minimum_efa_installer = _p5_minimum(
    "P5: EFA installer >= 1.29", "efa_installer", "EFA installer", compat.P5_MIN_EFA_INSTALLER
)


def gpucloud_matches_this_package(m: VersionMatrix) -> RuleResult:
    from gpucloud import __version__

    name = "gpucloud pin equals the package being built"
    pinned = m.v("gpucloud")
    return _result(
        name,
        pinned == Version.parse(__version__),
        f"gpucloud {pinned} is this checkout's version",
        f"gpucloud {pinned} is pinned but this checkout is gpucloud {__version__}; the image installs the "
        f"wheel built from this checkout",
    )


RULES: tuple[Rule, ...] = (
    driver_meets_cuda_toolkit,
    pytorch_cuda_supported_by_driver,
    pytorch_build_published,
    pytorch_cuda_matches_toolkit,
    python_supported_by_pytorch,
    python_is_base_os_python,
    cuda_available_for_base_os,
    cudnn_built_for_cuda,
    nccl_built_for_cuda,
    efa_installer_for_nccl,
    dcgm_exporter_matches_dcgm,
    driver_supports_target_gpus,
    lustre_client_for_base_os,
    p5_minimum_cuda,
    p5_minimum_nccl,
    p5_minimum_aws_ofi_nccl,
    p5_minimum_efa_installer,
    gpucloud_matches_this_package,
)


def check_matrix(matrix: VersionMatrix) -> list[RuleResult]:
    return [rule(matrix) for rule in RULES]


def failed(results: list[RuleResult]) -> list[RuleResult]:
    return [r for r in results if r.status == "fail"]
