#!/usr/bin/env bash
# Layer 5: NVIDIA DCGM (GPU health, XID errors, diagnostics) built for the image's CUDA major, and
# dcgm-exporter (NVIDIA's datacenter-gpu-manager-exporter package, from the same CUDA repository).
# The exporter is installed, not started: scripts/node-bootstrap.sh starts it with gpucloud's
# counters file when the stack has monitoring.
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=lib.sh
source "$(dirname "$0")/lib.sh"

MAJOR="$(cuda_major "${GPUCLOUD_CUDA}")"
PACKAGE="datacenter-gpu-manager-4-cuda${MAJOR}"
EXPORTER_PACKAGE="datacenter-gpu-manager-exporter"
# NVIDIA tags dcgm-exporter <DCGM>-<exporter>; the package carries the exporter release only.
EXPORTER_RELEASE="${GPUCLOUD_DCGM_EXPORTER#*-}"

installed_dcgm() { dpkg-query -W -f='${Version}' datacenter-gpu-manager-4-core 2>/dev/null | sed 's/^[0-9]*://; s/-.*//'; }
installed_exporter() { dpkg-query -W -f='${Version}' "${EXPORTER_PACKAGE}" 2>/dev/null | sed 's/^[0-9]*://; s/-[^-]*$//'; }

# The repository's full version string (epoch and build suffix included) of the exporter release.
exporter_candidate() {
  apt-cache madison "${EXPORTER_PACKAGE}" | awk -F'|' -v want="${EXPORTER_RELEASE}" '{
    full = $2; gsub(/ /, "", full); bare = full; sub(/^[0-9]+:/, "", bare); sub(/-[^-]*$/, "", bare)
    if (bare == want) { print full; exit }
  }'
}

do_install() {
  # DCGM 4 packages carry an epoch ("1:"); the glob pins the release whatever its build suffix.
  apt_install "${PACKAGE}=1:${GPUCLOUD_DCGM}*" "datacenter-gpu-manager-4-core=1:${GPUCLOUD_DCGM}*"
  apt_hold "${PACKAGE}" datacenter-gpu-manager-4-core
  systemctl enable --now nvidia-dcgm.service
  local candidate
  candidate="$(exporter_candidate)"
  [[ -n "${candidate}" ]] || die "${EXPORTER_PACKAGE} ${EXPORTER_RELEASE} is not in the CUDA repository"
  apt_install "${EXPORTER_PACKAGE}=${candidate}"
  apt_hold "${EXPORTER_PACKAGE}"
  # the package may ship a unit of its own: the bootstrap decides whether the exporter runs
  systemctl disable nvidia-dcgm-exporter.service 2>/dev/null || true
}

do_validate() {
  expect_version "DCGM" "$(installed_dcgm)" "${GPUCLOUD_DCGM}"
  systemctl is-active --quiet nvidia-dcgm.service || die "nvidia-dcgm.service is not running"
  dcgmi discovery -l >/dev/null || die "dcgmi cannot reach the DCGM host engine"
  expect_version "dcgm-exporter" "$(installed_exporter)" "${EXPORTER_RELEASE}"
  command -v dcgm-exporter >/dev/null || die "dcgm-exporter is not on PATH"
}

dispatch "$@"
