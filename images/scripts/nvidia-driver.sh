#!/usr/bin/env bash
# Layer 2: NVIDIA data-center driver (open kernel modules, required on H100/H200 and fine on A100),
# Fabric Manager at the same version (NVSwitch systems such as P4d/P5 need it to run CUDA at all),
# and the persistence daemon.
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=lib.sh
source "$(dirname "$0")/lib.sh"

DRIVER="${GPUCLOUD_NVIDIA_DRIVER}"
BRANCH="${DRIVER%%.*}"

installed_driver() { cat /sys/module/nvidia/version 2>/dev/null || modinfo -F version nvidia 2>/dev/null || true; }

add_cuda_repo() {
  local os_tag keyring=/tmp/cuda-keyring.deb
  os_tag="$(echo "${GPUCLOUD_BASE_OS}" | tr -d '.-')"  # ubuntu-24.04 -> ubuntu2404
  if ! dpkg -s cuda-keyring >/dev/null 2>&1; then
    download "https://developer.download.nvidia.com/compute/cuda/repos/${os_tag}/x86_64/cuda-keyring_1.1-1_all.deb" "${keyring}"
    dpkg -i "${keyring}"
  fi
}

do_install() {
  if [[ "$(installed_driver)" != "${DRIVER}" ]]; then
    local run="/tmp/NVIDIA-Linux-x86_64-${DRIVER}.run"
    download "https://us.download.nvidia.com/tesla/${DRIVER}/NVIDIA-Linux-x86_64-${DRIVER}.run" "${run}"
    sh "${run}" --silent --dkms --kernel-module-type=open --no-questions --ui=none
    rm -f "${run}"
  else
    log "driver ${DRIVER} already installed"
  fi
  add_cuda_repo
  apt_install "nvidia-fabricmanager-${BRANCH}=${DRIVER}-1"
  apt_hold "nvidia-fabricmanager-${BRANCH}"
  systemctl enable nvidia-fabricmanager.service nvidia-persistenced.service
}

do_validate() {
  command -v nvidia-smi >/dev/null || die "nvidia-smi is not installed"
  local gpus driver
  gpus="$(nvidia-smi --query-gpu=name --format=csv,noheader | wc -l)"
  [[ "${gpus}" -ge 1 ]] || die "nvidia-smi sees no GPU on the build instance"
  log "${gpus} GPU(s) visible"
  driver="$(nvidia-smi --query-gpu=driver_version --format=csv,noheader | head -n1)"
  expect_version "NVIDIA driver" "${driver}" "${DRIVER}"
  # Fabric Manager only starts on NVSwitch systems; elsewhere it exits, so check only that it is enabled.
  systemctl is-enabled --quiet nvidia-fabricmanager.service || die "nvidia-fabricmanager is not enabled"
}

dispatch "$@"
