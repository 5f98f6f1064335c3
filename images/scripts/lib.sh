#!/usr/bin/env bash
# Shared helpers for the image layer scripts. Sourced, never run.
# Every version comes from versions.env, rendered from images/versions.yaml by the image pipeline.
set -euo pipefail

GPUCLOUD_IMAGE_DIR="${GPUCLOUD_IMAGE_DIR:-/opt/gpucloud/image}"
VERSIONS_ENV="${GPUCLOUD_IMAGE_DIR}/versions.env"
if [[ ! -r "${VERSIONS_ENV}" ]]; then
  echo "gpucloud-image: ${VERSIONS_ENV} is missing; the scripts component must run first" >&2
  exit 1
fi
# shellcheck source=/dev/null
source "${VERSIONS_ENV}"
export DEBIAN_FRONTEND=noninteractive

log() { echo "gpucloud-image: $*" >&2; }
die() { log "FAIL: $*"; exit 1; }

# Runs a command up to 5 times (downloads and apt mirrors fail transiently on fresh instances).
retry() {
  local attempt
  for attempt in 1 2 3 4 5; do
    if "$@"; then return 0; fi
    log "attempt ${attempt} of '$*' failed; retrying"
    sleep $((attempt * 5))
  done
  die "'$*' failed 5 times"
}

apt_install() {
  retry apt-get update -q
  retry apt-get install -y -q --no-install-recommends --allow-downgrades "$@"
}

# Holds packages so unattended upgrades cannot move the image off its pinned versions.
apt_hold() { apt-mark hold "$@" >/dev/null; }

download() {
  local url="$1" dest="$2"
  retry curl -fsSL --retry 3 -o "${dest}" "${url}"
}

# CUDA X.Y.Z -> "X" (major), "X-Y" (apt package suffix), "XY" (PyTorch wheel tag).
cuda_major() { echo "${1%%.*}"; }
cuda_dash() { local major minor rest; major="${1%%.*}"; rest="${1#*.}"; minor="${rest%%.*}"; echo "${major}-${minor}"; }
cuda_tag() { local major minor rest; major="${1%%.*}"; rest="${1#*.}"; minor="${rest%%.*}"; echo "${major}${minor}"; }

# Fails unless the observed version equals the pinned one.
expect_version() {
  local what="$1" observed="$2" pinned="$3"
  if [[ "${observed}" != "${pinned}" ]]; then
    die "${what} is ${observed:-missing}, the matrix pins ${pinned}"
  fi
  log "${what} ${observed} matches the matrix"
}

# Runs the subcommand named by the script's first argument (install | validate).
dispatch() {
  local action="${1:-}"
  case "${action}" in
    install) do_install ;;
    validate) do_validate ;;
    *) die "usage: $(basename "$0") install|validate (got '${action}')" ;;
  esac
}
