#!/usr/bin/env bash
# Create the project virtualenv (.venv, the one Pulumi.yaml names) and install gpucloud into it.
#   scripts/setup.sh          runtime + training + deploy extras (`gpucloud demo`, `gpucloud plan`, `pulumi up`)
#   scripts/setup.sh --test   the same plus the test tools (pytest, moto server) and the s3, frameworks and ray extras the tests exercise
# Nodes install gpucloud without extras (scripts/node-bootstrap.sh): no Pulumi there.
# Only python3 is required. torch is pinned to the CPU build so no CUDA packages are pulled.
set -euo pipefail
cd "$(dirname "$0")/.."
extras="train,deploy,report"
if [[ "${1:-}" == "--test" ]]; then extras="train,deploy,test,s3,frameworks,ray,report"; fi
# One line on stderr per step, so that the silent minutes of pip are not taken for a hang.
step() { echo "setup: $*" >&2; }
if [[ ! -x .venv/bin/python ]]; then
  step "creating the virtualenv .venv with $(command -v python3)"
  python3 -m venv .venv
fi
# This workplace's pip config lists mirror folders that may be absent; hide those warnings only.
# Byte-compiled at install (pip's default), on purpose: where PYTHONDONTWRITEBYTECODE is set (this
# workplace sets it) nothing is cached later, and every process would compile torch from source.
pip_install() { .venv/bin/python -m pip install --quiet "$@" 2> >(grep -v "^WARNING: Location" >&2); }
step "installing torch 2.13.0 (CPU build) and gpucloud[${extras}] with pip (about 3 minutes the first time, quiet meanwhile)"
pip_install "torch==2.13.0" -e ".[${extras}]"
# The real tools the tests run (promtool, amtool, a Prometheus server, node_exporter; headless Chromium for
# the HTML report): Debian's packages.
# Installed only where apt-get can (root, as in CI); elsewhere the tests that need them say so and skip.
test_tools_missing() { ! command -v promtool || ! command -v amtool || ! command -v prometheus-node-exporter || ! command -v chromium; } >/dev/null
if [[ "${1:-}" == "--test" ]] && test_tools_missing; then
  if [[ $(id -u) == 0 ]] && command -v apt-get >/dev/null; then
    step "installing Prometheus, Alertmanager, node_exporter and Chromium (Debian packages) for the tests"
    apt-get update -qq >/dev/null
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus prometheus-alertmanager prometheus-node-exporter chromium >/dev/null
  else
    step "promtool, amtool, node_exporter or chromium not found and apt-get unavailable (not root?): the tests that need them will be skipped"
  fi
fi
step "gpucloud installed in .venv ($(.venv/bin/python -c 'import gpucloud; print(gpucloud.__version__)'))"
