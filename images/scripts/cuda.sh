#!/usr/bin/env bash
# Layer 3: CUDA toolkit, cuDNN and NCCL from NVIDIA's apt repository, pinned and held.
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=lib.sh
source "$(dirname "$0")/lib.sh"

CUDA="${GPUCLOUD_CUDA}"
MAJOR="$(cuda_major "${CUDA}")"
DASH="$(cuda_dash "${CUDA}")"
MAJOR_MINOR="${DASH/-/.}"
NCCL_PKG_VERSION="${GPUCLOUD_NCCL}+cuda${MAJOR_MINOR}"

do_install() {
  apt_install "cuda-toolkit-${DASH}=${CUDA}-1" \
    "cudnn9-cuda-${MAJOR}=${GPUCLOUD_CUDNN}*" \
    "libnccl2=${NCCL_PKG_VERSION}" "libnccl-dev=${NCCL_PKG_VERSION}"
  apt_hold "cuda-toolkit-${DASH}" "cudnn9-cuda-${MAJOR}" libnccl2 libnccl-dev
  ln -sfn "/usr/local/cuda-${MAJOR_MINOR}" /usr/local/cuda
  cat >/etc/profile.d/gpucloud-cuda.sh <<'PROFILE'
export PATH=/usr/local/cuda/bin:${PATH}
PROFILE
}

do_validate() {
  local toolkit nccl_version
  # version.json carries the toolkit release (X.Y.Z); nvcc --version prints only the compiler's own.
  toolkit="$(jq -r .cuda.version /usr/local/cuda/version.json)"
  expect_version "CUDA toolkit" "${toolkit}" "${CUDA}"
  /usr/local/cuda/bin/nvcc --version >/dev/null || die "nvcc does not run"
  nccl_version="$(dpkg-query -W -f='${Version}' libnccl2)"
  expect_version "NCCL" "${nccl_version}" "${NCCL_PKG_VERSION}"
  ldconfig -p | grep -q 'libcudnn.so.9' || die "libcudnn.so.9 is not in the linker cache"
}

dispatch "$@"
