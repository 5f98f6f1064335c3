#!/usr/bin/env bash
# Layer 5b: node_exporter (with the infiniband collector the bootstrap turns on: EFA device counters)
# and Prometheus (agent mode on nodes of a managed-monitoring stack), from the Prometheus project's
# release tarballs, each checked against its release's sha256sums.txt. Installed, not started:
# scripts/node-bootstrap.sh starts what the stack's monitoring mode needs.
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=lib.sh
source "$(dirname "$0")/lib.sh"

BIN=/usr/local/bin

# The version a Prometheus-project binary reports: "node_exporter, version X.Y.Z (branch: ...".
reported_version() { "$1" --version 2>&1 | awk 'NR == 1 { print $3 }'; }

install_release() {
  local name="$1" version="$2" dir base tarball
  dir="$(mktemp -d)"
  base="https://github.com/prometheus/${name}/releases/download/v${version}"
  tarball="${name}-${version}.linux-amd64.tar.gz"
  download "${base}/${tarball}" "${dir}/${tarball}"
  download "${base}/sha256sums.txt" "${dir}/sha256sums.txt"
  (cd "${dir}" && grep " ${tarball}\$" sha256sums.txt | sha256sum -c --status) || die "${tarball}: checksum mismatch"
  tar -xzf "${dir}/${tarball}" -C "${dir}"
  install -m 0755 "${dir}/${name}-${version}.linux-amd64/${name}" "${BIN}/${name}"
  rm -rf "${dir}"
  log "${name} ${version} installed in ${BIN}"
}

do_install() {
  install_release node_exporter "${GPUCLOUD_NODE_EXPORTER}"
  install_release prometheus "${GPUCLOUD_PROMETHEUS}"
}

do_validate() {
  expect_version "node_exporter" "$(reported_version "${BIN}/node_exporter")" "${GPUCLOUD_NODE_EXPORTER}"
  expect_version "prometheus" "$(reported_version "${BIN}/prometheus")" "${GPUCLOUD_PROMETHEUS}"
}

dispatch "$@"
