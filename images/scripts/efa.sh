#!/usr/bin/env bash
# Layer 4: the EFA stack. The EFA installer (kernel module, libfabric, rdma-core, Open MPI), the
# aws-ofi-nccl plugin built against it and CUDA (so NCCL uses EFA instead of TCP sockets), and
# GDRCopy (low-latency GPU memory copies the plugin uses on P4d/P5).
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=lib.sh
source "$(dirname "$0")/lib.sh"

EFA="${GPUCLOUD_EFA_INSTALLER}"
OFI="${GPUCLOUD_AWS_OFI_NCCL}"
GDRCOPY="${GPUCLOUD_GDRCOPY}"
OFI_PREFIX=/opt/aws-ofi-nccl
WORK=/tmp/gpucloud-efa

installed_efa() { sed -n 's/^# EFA installer version: //p' /opt/amazon/efa_installed_packages 2>/dev/null || true; }

install_efa() {
  if [[ "$(installed_efa)" == "${EFA}" ]]; then log "EFA installer ${EFA} already installed"; return; fi
  local tarball="${WORK}/aws-efa-installer-${EFA}.tar.gz"
  download "https://efa-installer.amazonaws.com/aws-efa-installer-${EFA}.tar.gz" "${tarball}"
  download "https://efa-installer.amazonaws.com/aws-efa-installer-${EFA}.tar.gz.sig" "${tarball}.sig"
  download "https://efa-installer.amazonaws.com/aws-efa-installer.key" "${WORK}/aws-efa-installer.key"
  gpg --batch --homedir "${WORK}/gnupg" --import "${WORK}/aws-efa-installer.key"
  gpg --batch --homedir "${WORK}/gnupg" --verify "${tarball}.sig" "${tarball}"
  tar -xzf "${tarball}" -C "${WORK}"
  (cd "${WORK}/aws-efa-installer" && ./efa_installer.sh -y)
}

install_aws_ofi_nccl() {
  if [[ -f "${OFI_PREFIX}/.gpucloud-version" && "$(cat "${OFI_PREFIX}/.gpucloud-version")" == "${OFI}" ]]; then
    log "aws-ofi-nccl ${OFI} already installed"; return
  fi
  local tarball="${WORK}/aws-ofi-nccl-${OFI}.tar.gz"
  download "https://github.com/aws/aws-ofi-nccl/releases/download/v${OFI}/aws-ofi-nccl-${OFI}.tar.gz" "${tarball}"
  tar -xzf "${tarball}" -C "${WORK}"
  (
    cd "${WORK}/aws-ofi-nccl-${OFI}"
    ./configure --prefix="${OFI_PREFIX}" --with-libfabric=/opt/amazon/efa --with-cuda=/usr/local/cuda \
      --enable-platform-aws --disable-tests
    make -j "$(nproc)"
    make install
  )
  echo "${OFI_PREFIX}/lib" >/etc/ld.so.conf.d/000-aws-ofi-nccl.conf
  ldconfig
  echo "${OFI}" >"${OFI_PREFIX}/.gpucloud-version"
}

install_gdrcopy() {
  if dpkg-query -W -f='${Version}' gdrcopy 2>/dev/null | grep -q "^${GDRCOPY}"; then
    log "GDRCopy ${GDRCOPY} already installed"; return
  fi
  local tarball="${WORK}/gdrcopy-${GDRCOPY}.tar.gz"
  download "https://github.com/NVIDIA/gdrcopy/archive/refs/tags/v${GDRCOPY}.tar.gz" "${tarball}"
  tar -xzf "${tarball}" -C "${WORK}"
  (cd "${WORK}/gdrcopy-${GDRCOPY}/packages" && CUDA=/usr/local/cuda ./build-deb-packages.sh)
  dpkg -i "${WORK}/gdrcopy-${GDRCOPY}"/packages/*.deb
  apt-mark hold gdrdrv-dkms libgdrapi gdrcopy gdrcopy-tests >/dev/null
}

do_install() {
  mkdir -p "${WORK}/gnupg"
  chmod 700 "${WORK}/gnupg"
  install_efa
  install_aws_ofi_nccl
  install_gdrcopy
  rm -rf "${WORK}"
}

do_validate() {
  expect_version "EFA installer" "$(installed_efa)" "${EFA}"
  # A build instance without EFA (g5.2xlarge) has no device; the provider library must still load.
  if ! /opt/amazon/efa/bin/fi_info -p efa >/dev/null 2>&1; then
    if compgen -G "/sys/class/infiniband/*" >/dev/null; then
      die "EFA devices exist but 'fi_info -p efa' finds no provider"
    fi
    /opt/amazon/efa/bin/fi_info --version >/dev/null || die "libfabric (fi_info) is not installed"
    log "no EFA device on this instance; libfabric $(/opt/amazon/efa/bin/fi_info --version | sed -n 's/^libfabric: //p') is installed"
  else
    log "fi_info -p efa lists $(/opt/amazon/efa/bin/fi_info -p efa | grep -c 'domain:') EFA endpoint(s)"
  fi
  [[ -e "${OFI_PREFIX}/lib/libnccl-net.so" ]] || die "aws-ofi-nccl plugin ${OFI_PREFIX}/lib/libnccl-net.so is missing"
  expect_version "aws-ofi-nccl" "$(cat "${OFI_PREFIX}/.gpucloud-version")" "${OFI}"
  lsmod | grep -q '^gdrdrv' || die "the gdrdrv kernel module (GDRCopy) is not loaded"
}

dispatch "$@"
