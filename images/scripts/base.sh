#!/usr/bin/env bash
# Layer 1: OS preparation. Kernel headers for DKMS, build tools, nouveau off, no automatic upgrades
# (a kernel that moves under the image breaks the NVIDIA, EFA and Lustre kernel modules).
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=lib.sh
source "$(dirname "$0")/lib.sh"

do_install() {
  retry apt-get update -q
  retry apt-get -y -q -o Dpkg::Options::=--force-confold upgrade
  apt_install build-essential dkms "linux-headers-$(uname -r)" linux-headers-aws pciutils jq curl \
    ca-certificates gnupg python3-venv python3-dev autoconf automake libtool libhwloc-dev
  printf 'blacklist nouveau\noptions nouveau modeset=0\n' >/etc/modprobe.d/blacklist-nouveau.conf
  update-initramfs -u
  systemctl disable --now unattended-upgrades.service apt-daily-upgrade.timer 2>/dev/null || true
}

do_validate() {
  if lsmod | grep -q '^nouveau'; then die "the nouveau driver is loaded; it must be blacklisted"; fi
  local python
  python="$(python3 -c 'import sys; print("%d.%d" % sys.version_info[:2])')"
  expect_version "system Python" "${python}" "${GPUCLOUD_PYTHON}"
}

dispatch "$@"
