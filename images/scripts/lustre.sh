#!/usr/bin/env bash
# Layer 6: the FSx for Lustre client from AWS's repository. Its kernel module is built for the
# running kernel, which is why base.sh turns automatic kernel upgrades off.
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=lib.sh
source "$(dirname "$0")/lib.sh"

KEY_URL=https://fsx-lustre-client-repo-public-keys.s3.amazonaws.com/fsx-ubuntu-public-key.asc
REPO_URL=https://fsx-lustre-client-repo.s3.amazonaws.com/ubuntu
KEYRING=/usr/share/keyrings/fsx-lustre-client.gpg

installed_lustre() { dpkg-query -W -f='${Version}' lustre-client-modules-aws 2>/dev/null || true; }

do_install() {
  if [[ ! -s "${KEYRING}" ]]; then
    download "${KEY_URL}" /tmp/fsx-ubuntu-public-key.asc
    gpg --batch --yes --dearmor -o "${KEYRING}" /tmp/fsx-ubuntu-public-key.asc
  fi
  local codename
  codename="$(. /etc/os-release && echo "${VERSION_CODENAME}")"
  echo "deb [signed-by=${KEYRING}] ${REPO_URL} ${codename} main" >/etc/apt/sources.list.d/fsxlustreclientrepo.list
  apt_install "lustre-client-modules-$(uname -r)" lustre-client-modules-aws
  apt_hold "lustre-client-modules-$(uname -r)" lustre-client-modules-aws
}

do_validate() {
  local installed
  installed="$(installed_lustre)"
  [[ "${installed}" == "${GPUCLOUD_LUSTRE_CLIENT}"* ]] \
    || die "Lustre client is ${installed:-missing}, the matrix pins ${GPUCLOUD_LUSTRE_CLIENT}"
  modprobe lnet || die "the lnet kernel module does not load"
  log "Lustre client ${installed} loads"
}

dispatch "$@"
