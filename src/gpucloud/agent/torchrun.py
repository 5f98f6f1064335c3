"""The torchrun command line of one gang member (pure).

A job's command is either a ``torchrun`` invocation written for one node (``torchrun
--nproc-per-node 8 train.py``) or any other program (``python train.py``). The agent adds the
multi-node arguments: ``--nnodes N --node-rank <slot>`` and a static rendezvous on rank 0's
private address. Static, because the slots already fixed every node's rank: node rank 0 hosts the
store, the others connect to it, and no node waits for an elastic membership round.
"""

from __future__ import annotations

import os
import sys

from gpucloud.errors import UserError

LAUNCHERS = ("torchrun",)
MODULE_LAUNCH = ("-m", "torch.distributed.run")
# Flags the agent owns for a gang; a job that sets them would fight the slot assignment.
OWNED_FLAGS = (
    "--nnodes",
    "--node-rank",
    "--node_rank",
    "--rdzv-backend",
    "--rdzv_backend",
    "--rdzv-endpoint",
    "--rdzv_endpoint",
    "--rdzv-id",
    "--rdzv_id",
    "--master-addr",
    "--master_addr",
    "--master-port",
    "--master_port",
)
SINGLE_NODE_FLAGS = ("--standalone",)
BOOLEAN_FLAGS = ("--standalone", "--no-python", "--no_python", "--module", "-m", "--run-path", "--run_path")
DEFAULT_PORT = 29500


def launcher_length(command: list[str]) -> int:
    """How many leading words of ``command`` name torchrun (0: not a torchrun command)."""
    if command and os.path.basename(command[0]) in LAUNCHERS:
        return 1
    if len(command) >= 3 and os.path.basename(command[0]).startswith("python") and tuple(command[1:3]) == MODULE_LAUNCH:
        return 3
    return 0


def gang_argv(
    command: list[str],
    *,
    nnodes: int,
    node_rank: int,
    rendezvous_host: str,
    port: int,
    run_id: str,
    nproc_per_node: int = 1,
    launcher: tuple[str, ...] = (sys.executable, *MODULE_LAUNCH),
) -> list[str]:
    """``command`` as member ``node_rank`` of ``nnodes`` runs it, rendezvous at ``rendezvous_host:port``."""
    if not 0 <= node_rank < nnodes:
        raise ValueError(f"node rank {node_rank} is outside 0..{nnodes - 1}")
    host = f"[{rendezvous_host}]" if ":" in rendezvous_host else rendezvous_host
    ours = [
        f"--nnodes={nnodes}",
        f"--node-rank={node_rank}",
        "--rdzv-backend=static",
        f"--rdzv-endpoint={host}:{port}",
        f"--rdzv-id={run_id}",
    ]
    head = launcher_length(command)
    if head == 0:
        # Not torchrun: torchrun starts it once per local process (--no-python: any program). Through
        # this interpreter, whose environment has torch, rather than whatever `torchrun` PATH finds.
        return [*launcher, *ours, f"--nproc-per-node={nproc_per_node}", "--no-python", *command]
    rest = command[head:]
    script = 0  # where the launcher's options end: at the script (or "--")
    while script < len(rest) and rest[script] != "--" and rest[script].startswith("-"):
        # "--nproc-per-node 8": the value is the next word, not the script
        script += 2 if _takes_value(rest[script]) else 1
    script = min(script, len(rest))
    options, tail = rest[:script], rest[script:]
    for word in options:
        name = word.split("=", 1)[0]
        if name in OWNED_FLAGS:
            raise UserError(
                f"the job's torchrun command sets {name}; for a job of {nnodes} nodes the agent sets "
                f"--nnodes, --node-rank and the rendezvous itself: submit it without {name}"
            )
    kept = [w for w in options if w not in SINGLE_NODE_FLAGS]
    return [*command[:head], *ours, *kept, *tail]


def _takes_value(word: str) -> bool:
    """A launcher flag written as two words (``--nproc-per-node 8``): boolean flags are the exceptions."""
    return word.startswith("-") and "=" not in word and word not in BOOLEAN_FLAGS
