#!/usr/bin/env bash
# Layer 5: NVIDIA DCGM (GPU health, XID errors, diagnostics) built for the image's CUDA major.
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=lib.sh
source "$(dirname "$0")/lib.sh"

MAJOR="$(cuda_major "${GPUCLOUD_CUDA}")"
PACKAGE="datacenter-gpu-manager-4-cuda${MAJOR}"

installed_dcgm() { dpkg-query -W -f='${Version}' datacenter-gpu-manager-4-core 2>/dev/null | sed 's/^[0-9]*://; s/-.*//'; }

do_install() {
  # DCGM 4 packages carry an epoch ("1:"); the glob pins the release whatever its build suffix.
  apt_install "${PACKAGE}=1:${GPUCLOUD_DCGM}*" "datacenter-gpu-manager-4-core=1:${GPUCLOUD_DCGM}*"
  apt_hold "${PACKAGE}" datacenter-gpu-manager-4-core
  systemctl enable --now nvidia-dcgm.service
}

do_validate() {
  expect_version "DCGM" "$(installed_dcgm)" "${GPUCLOUD_DCGM}"
  systemctl is-active --quiet nvidia-dcgm.service || die "nvidia-dcgm.service is not running"
  dcgmi discovery -l >/dev/null || die "dcgmi cannot reach the DCGM host engine"
}

dispatch "$@"
