#!/usr/bin/env bash
# Layer 7: the training environment. A virtualenv on the system Python with the pinned PyTorch CUDA
# build, and the gpucloud package (the node agent and spot-train) from the wheel the pipeline
# downloads. Validation proves PyTorch sees CUDA and that NCCL loads the aws-ofi-nccl plugin.
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=lib.sh
source "$(dirname "$0")/lib.sh"

VENV=/opt/gpucloud/venv
WHEEL_DIR="${GPUCLOUD_IMAGE_DIR}/wheels"
TORCH_INDEX="https://download.pytorch.org/whl/cu$(cuda_tag "${GPUCLOUD_PYTORCH_CUDA}")"

do_install() {
  [[ -x "${VENV}/bin/python" ]] || python3 -m venv "${VENV}"
  retry "${VENV}/bin/pip" install --quiet --upgrade pip
  retry "${VENV}/bin/pip" install --quiet --index-url "${TORCH_INDEX}" "torch==${GPUCLOUD_PYTORCH}"
  retry "${VENV}/bin/pip" install --quiet --find-links "${WHEEL_DIR}" "gpucloud==${GPUCLOUD_GPUCLOUD}"
  ln -sfn "${VENV}/bin/gpucloud" /usr/local/bin/gpucloud
}

do_validate() {
  local report
  report="$("${VENV}/bin/python" - <<'PY'
import torch
print(torch.__version__.split("+")[0], torch.version.cuda, int(torch.cuda.is_available()), torch.cuda.device_count())
PY
)"
  read -r torch_version torch_cuda available devices <<<"${report}"
  expect_version "PyTorch" "${torch_version}" "${GPUCLOUD_PYTORCH}"
  expect_version "PyTorch CUDA build" "${torch_cuda}" "${GPUCLOUD_PYTORCH_CUDA}"
  [[ "${available}" == "1" ]] || die "PyTorch does not see CUDA (torch.cuda.is_available() is False)"
  log "PyTorch sees ${devices} GPU(s)"
  expect_version "gpucloud" "$("${VENV}/bin/gpucloud" --version | awk '{print $NF}')" "${GPUCLOUD_GPUCLOUD}"
  check_nccl_plugin
}

# One-rank NCCL all-reduce with NCCL_DEBUG=INFO: NCCL logs which network plugin it loaded.
check_nccl_plugin() {
  local log_file=/tmp/gpucloud-nccl-check.log
  NCCL_DEBUG=INFO MASTER_ADDR=127.0.0.1 MASTER_PORT=29511 "${VENV}/bin/python" - >"${log_file}" 2>&1 <<'PY'
import torch
import torch.distributed as dist
dist.init_process_group("nccl", rank=0, world_size=1)
t = torch.ones(1, device="cuda")
dist.all_reduce(t)
torch.cuda.synchronize()
dist.destroy_process_group()
PY
  if ! grep -Eq 'NET/OFI|aws-ofi-nccl' "${log_file}"; then
    tail -n 20 "${log_file}" >&2
    die "NCCL did not load the aws-ofi-nccl plugin (no NET/OFI line in NCCL_DEBUG=INFO output)"
  fi
  log "NCCL loads the aws-ofi-nccl plugin"
}

dispatch "$@"
