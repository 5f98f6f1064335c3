"""`gpucloud demo --device`: the CUDA variant's command line, and its refusal where no GPU is visible."""

import pytest
import torch
from tests.cli_run import one_line_error, run_cli

from gpucloud.offline.demo import DemoOptions, training_command


def test_cuda_runs_the_example_with_nccl_and_one_rank_per_gpu(tmp_path):
    argv = training_command(steps=4, seed=0, step_seconds=0.0, out=tmp_path / "w.pt", nproc=1, device="cuda")
    assert argv[-2:] == ["--device", "cuda"] and "--nproc-per-node=1" in argv
    cpu = training_command(steps=4, seed=0, step_seconds=0.0, out=tmp_path / "w.pt")
    assert "--device" not in cpu and "--nproc-per-node=2" in cpu


@pytest.mark.skipif(torch.cuda.is_available(), reason="this host has a GPU: the refusal cannot be shown here")
def test_cuda_without_a_gpu_is_refused_in_one_line_before_anything_runs(capsys, tmp_path):
    workdir = tmp_path / "demo"
    code, out, err = run_cli(capsys, "demo", "--device", "cuda", "--workdir", str(workdir))
    assert code == 2 and out == ""
    line = one_line_error(err)
    assert "--device cuda" in line and "--device cpu" in line
    assert not workdir.exists()  # nothing started, nothing written


def test_an_unknown_device_is_refused():
    with pytest.raises(Exception, match="--device must be cpu or cuda"):
        DemoOptions(device="tpu").validate()
