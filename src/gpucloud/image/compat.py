"""Published compatibility facts the rules check against (data only, no logic).

Sources: NVIDIA CUDA Toolkit release notes, "CUDA Toolkit and Corresponding Driver Versions"
(Table 3, Linux x86_64) and "CUDA minor version compatibility"; cuDNN support matrix; NCCL
release notes (per-CUDA builds); PyTorch "Previous versions" install matrix and release notes
(CUDA wheels and Python range per release); aws-ofi-nccl ``doc/efa-env-var.md`` (P5 minimums);
the aws-samples nvcr-pytorch-aws Dockerfile (EFA installer >= 1.29.1 for NCCL >= 2.19); FSx for
Lustre client repository (Lustre 2.15 for Ubuntu 22.04/24.04); Ubuntu release notes (system Python).
When a version is newer than these tables the rules say "unknown" (a warning), never guess.
"""

from __future__ import annotations

from gpucloud.image.versions import Version, v

# CUDA toolkit release -> minimum Linux x86_64 driver ("toolkit driver version", full functionality).
CUDA_MIN_DRIVER: dict[Version, Version] = {
    v("11.8.0"): v("520.61.05"),
    v("12.0.0"): v("525.60.13"),
    v("12.0.1"): v("525.85.12"),
    v("12.1.0"): v("530.30.02"),
    v("12.1.1"): v("530.30.02"),
    v("12.2.0"): v("535.54.03"),
    v("12.2.1"): v("535.86.09"),
    v("12.2.2"): v("535.104.05"),
    v("12.3.0"): v("545.23.06"),
    v("12.3.1"): v("545.23.08"),
    v("12.3.2"): v("545.23.08"),
    v("12.4.0"): v("550.54.14"),
    v("12.4.1"): v("550.54.15"),
    v("12.5.0"): v("555.42.02"),
    v("12.5.1"): v("555.42.06"),
    v("12.6.0"): v("560.28.03"),
    v("12.6.1"): v("560.35.03"),
    v("12.6.2"): v("560.35.03"),
    v("12.6.3"): v("560.35.05"),
    v("12.8.0"): v("570.26"),
    v("12.8.1"): v("570.124.06"),
    v("12.9.0"): v("575.51.03"),
    v("12.9.1"): v("575.57.08"),
    v("13.0.0"): v("580.65.06"),
    v("13.0.1"): v("580.82.07"),
    v("13.0.2"): v("580.95.05"),
}

# GPU architecture of each target family -> first driver branch that supports it.
GPU_FAMILY_MIN_DRIVER: dict[str, tuple[str, Version]] = {
    "p4d": ("A100", v("450.80.02")),
    "p4de": ("A100 80GB", v("450.80.02")),
    "p5": ("H100", v("525.60.13")),
    "p5e": ("H200", v("550.54.14")),
    "p5en": ("H200", v("550.54.14")),
}

# PyTorch release (major.minor) -> CUDA builds published on download.pytorch.org.
PYTORCH_CUDA_BUILDS: dict[Version, tuple[Version, ...]] = {
    v("2.4"): (v("11.8"), v("12.1"), v("12.4")),
    v("2.5"): (v("11.8"), v("12.1"), v("12.4")),
    v("2.6"): (v("11.8"), v("12.4"), v("12.6")),
    v("2.7"): (v("11.8"), v("12.6"), v("12.8")),
    v("2.8"): (v("12.6"), v("12.8"), v("12.9")),
    v("2.9"): (v("12.6"), v("12.8"), v("13.0")),
}

# PyTorch release (major.minor) -> (oldest, newest) Python it publishes wheels for.
PYTORCH_PYTHON_RANGE: dict[Version, tuple[Version, Version]] = {
    v("2.4"): (v("3.8"), v("3.12")),
    v("2.5"): (v("3.9"), v("3.13")),
    v("2.6"): (v("3.9"), v("3.13")),
    v("2.7"): (v("3.9"), v("3.13")),
    v("2.8"): (v("3.9"), v("3.13")),
    v("2.9"): (v("3.10"), v("3.14")),
}

# CUDA major -> oldest cuDNN release built for it.
CUDNN_MIN_FOR_CUDA_MAJOR: dict[int, Version] = {11: v("8.0"), 12: v("8.9"), 13: v("9.13")}

# CUDA major -> oldest NCCL release built for it (NCCL packages are per CUDA major.minor).
NCCL_MIN_FOR_CUDA_MAJOR: dict[int, Version] = {11: v("2.7"), 12: v("2.16"), 13: v("2.27.7")}

# Ubuntu release -> (system Python the image's virtualenv is built on, oldest CUDA with a repo for it,
# Lustre client series in the FSx client repository).
UBUNTU: dict[str, tuple[Version, Version, Version]] = {
    "22.04": (v("3.10"), v("11.7"), v("2.15")),
    "24.04": (v("3.12"), v("12.5"), v("2.15")),
}

# P5-class minimums (aws-ofi-nccl doc/efa-env-var.md; EFA installer per the issue and the AWS samples).
P5_MIN_CUDA = v("12.0")
P5_MIN_NCCL = v("2.18.5")
P5_MIN_AWS_OFI_NCCL = v("1.7.3")
P5_MIN_EFA_INSTALLER = v("1.29.0")

# NCCL >= 2.19 with an older EFA installer fails with libfabric "Unable to register memory" errors.
NCCL_NEEDS_NEWER_EFA = v("2.19.0")
EFA_FOR_NCCL_2_19 = v("1.29.1")
