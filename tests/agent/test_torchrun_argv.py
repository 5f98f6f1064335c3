"""The gang member's torchrun command line."""

from __future__ import annotations

import sys

import pytest

from gpucloud.agent.torchrun import gang_argv
from gpucloud.errors import UserError

GANG = dict(nnodes=2, node_rank=1, rendezvous_host="10.0.0.5", port=29500, run_id="j-1-3")
OURS = ["--nnodes=2", "--node-rank=1", "--rdzv-backend=static", "--rdzv-endpoint=10.0.0.5:29500", "--rdzv-id=j-1-3"]


def test_a_single_node_torchrun_command_becomes_a_member_of_the_gang():
    argv = gang_argv(["torchrun", "--standalone", "--nproc-per-node", "8", "train.py", "--standalone"], **GANG)
    # --standalone goes (it means one node); the script's own arguments are left alone
    assert argv == ["torchrun", *OURS, "--nproc-per-node", "8", "train.py", "--standalone"]


def test_the_python_module_form_of_torchrun_is_recognised():
    argv = gang_argv(["python3", "-m", "torch.distributed.run", "--nproc-per-node=2", "train.py"], **GANG)
    assert argv == ["python3", "-m", "torch.distributed.run", *OURS, "--nproc-per-node=2", "train.py"]


def test_any_other_command_is_started_by_torchrun_once_per_local_process():
    argv = gang_argv(["python", "train.py", "--lr", "1e-3"], nproc_per_node=8, **GANG)
    assert argv == [
        sys.executable,
        "-m",
        "torch.distributed.run",
        *OURS,
        "--nproc-per-node=8",
        "--no-python",
        "python",
        "train.py",
        "--lr",
        "1e-3",
    ]


def test_an_ipv6_rendezvous_address_is_bracketed():
    argv = gang_argv(["python", "t.py"], **{**GANG, "rendezvous_host": "fd00::5"})
    assert "--rdzv-endpoint=[fd00::5]:29500" in argv


@pytest.mark.parametrize("flag", ["--nnodes=4", "--node-rank", "--rdzv-endpoint=x:1", "--master-addr"])
def test_a_job_that_sets_the_gang_flags_itself_is_refused_with_the_flag_named(flag):
    with pytest.raises(UserError, match=flag.split("=")[0] + ".*submit it without"):
        gang_argv(["torchrun", flag, "train.py"], **GANG)


def test_flags_after_the_script_belong_to_the_script():
    argv = gang_argv(["torchrun", "train.py", "--nnodes", "3"], **GANG)
    assert argv[-3:] == ["train.py", "--nnodes", "3"]


def test_an_owned_flag_given_as_two_words_is_found_past_its_value():
    with pytest.raises(UserError, match="--rdzv-id"):
        gang_argv(["torchrun", "--nproc-per-node", "8", "--rdzv-id", "x", "train.py"], **GANG)


def test_a_node_rank_outside_the_gang_is_a_bug():
    with pytest.raises(ValueError, match="outside 0..1"):
        gang_argv(["torchrun", "t.py"], **{**GANG, "node_rank": 2})
