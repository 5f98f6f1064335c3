"""``gpucloud submit``: queue a training job, with the code it runs (``--workdir``) if asked."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import click

from gpucloud.commands.job_format import job_row, size_text
from gpucloud.commands.options import queue_option
from gpucloud.errors import UserError
from gpucloud.output import output_option, print_json

if TYPE_CHECKING:
    from gpucloud.lifecycle.model import CodeRef
    from gpucloud.queue.gang import GangQueue


def _parse_env(pairs: tuple[str, ...]) -> dict[str, str]:
    env: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key or not key.replace("_", "a").isalnum() or key[0].isdigit():
            raise UserError(f"--env {pair!r} is not NAME=VALUE with NAME made of letters, digits and '_'")
        env[key] = value
    return env


@click.command(
    "submit",
    context_settings={"allow_interspersed_args": False},
    epilog="""\b
Examples:
  gpucloud submit -- torchrun --standalone --nproc-per-node 8 train.py
  gpucloud submit --job-id llama-7b --gpus-per-node 8 --checkpoint-uri s3://ckpt/llama -- torchrun ... train.py
  gpucloud submit --nodes 4 --group p4d-spot --fallback-group p4d-od --fallback-after 10 -- torchrun ... train.py
  gpucloud submit --workdir . --setup "pip install -r requirements.txt" -- python train.py
  gpucloud worker          # on each node: take queued jobs and run them under spot-train
""",
)
@click.option("--job-id", help="Id for the job (letters, digits, '.', '_', '-'); default: generated.")
@click.option(
    "--name",
    help="A human name shown by `gpucloud jobs`; `job show/cancel/resume NAME` take it where an id goes "
    "(a name several jobs share is refused with the list of their ids).",
)
@queue_option()
@click.option(
    "--checkpoint-uri",
    metavar="URI",
    help="Durable checkpoint location every attempt can read: s3://bucket/prefix or a shared path (default: on a "
    "cluster's aws:// queue the cluster's bucket, resolved on the node; else $GPUCLOUD_HOME/checkpoints).",
)
@click.option(
    "--workdir",
    metavar="DIR",
    type=click.Path(file_okay=False, exists=True),
    help="Ship DIR with the job: a snapshot of it (.gitignore honoured, never .git/, named by its content hash so "
    "the same tree is stored once) goes next to the queue ($GPUCLOUD_HOME/code) or to the checkpoint bucket's "
    "code/ prefix, and each attempt runs the command in a verified copy of it on its node "
    "(default: no snapshot; the command runs in the worker's directory).",
)
@click.option(
    "--max-workdir-size",
    metavar="SIZE",
    default="100MiB",
    show_default=True,
    help="Largest --workdir content (uncompressed) to ship, e.g. 250MiB; past it submit names the biggest files.",
)
@click.option(
    "--setup",
    metavar="CMD",
    help="Shell command each node runs once before the job's command, in a virtualenv layered on the image's "
    "Python and torch and cached per node and requirements hash, e.g. 'pip install -r requirements.txt'.",
)
@click.option(
    "--env",
    "env_pairs",
    multiple=True,
    metavar="NAME=VALUE",
    help="Extra environment variable for the command (repeatable).",
)
@click.option("--nodes", type=click.IntRange(min=1), default=1, show_default=True, help="Nodes the job runs on.")
@click.option(
    "--gpus-per-node",
    type=click.IntRange(min=0),
    default=0,
    show_default=True,
    help="GPUs per node, for GPU-hour accounting (0 on CPU).",
)
@click.option(
    "--max-attempts",
    type=click.IntRange(min=1),
    default=3,
    show_default=True,
    help="Crashed attempts allowed before FAILED; spot stops never count.",
)
@click.option(
    "--group",
    metavar="NAME",
    help="Node group whose agents run the job (default: the stack's first group; node.env lists them in "
    "GPUCLOUD_NODE_GROUPS).",
)
@click.option(
    "--fallback-group",
    metavar="NAME",
    help="Another node group (on-demand, capacity block) that may also take the job once an attempt has waited "
    "--fallback-after minutes: a spot pool that took a whole gang rarely comes back at once.",
)
@click.option(
    "--fallback-after",
    metavar="MINUTES",
    help="Minutes an attempt waits in the queue before --fallback-group may take it (default: 10).",
)
@output_option()
@click.argument("command", nargs=-1, type=click.UNPROCESSED, metavar="-- COMMAND [ARGS]...")
def submit(
    job_id: str | None,
    name: str | None,
    queue_uri: str | None,
    checkpoint_uri: str | None,
    workdir: str | None,
    max_workdir_size: str,
    setup: str | None,
    env_pairs: tuple[str, ...],
    nodes: int,
    gpus_per_node: int,
    max_attempts: int,
    group: str | None,
    fallback_group: str | None,
    fallback_after: str | None,
    output: str,
    command: tuple[str, ...],
) -> None:
    """Queue COMMAND as a training job; `gpucloud worker` runs it under the spot supervisor."""
    from gpucloud.checkpoint.defaults import checkpoint_uri_to_submit
    from gpucloud.lifecycle.model import spec_from_flags
    from gpucloud.queue.connect import default_queue_uri, open_queue

    if not command:
        raise UserError("missing command after --; e.g. gpucloud submit -- torchrun --nproc-per-node 2 train.py")
    queue_uri = queue_uri or default_queue_uri()
    checkpoint_uri = checkpoint_uri_to_submit(checkpoint_uri, queue_uri=queue_uri, nodes=nodes)
    env = _parse_env(env_pairs)
    if setup is not None and not setup.strip():
        raise UserError("--setup is empty; give a shell command, e.g. --setup 'pip install -r requirements.txt'")
    spec = spec_from_flags(
        command=list(command),
        name=name,
        checkpoint_uri=checkpoint_uri,
        setup=setup,
        env=env,
        nodes=nodes,
        gpus_per_node=gpus_per_node,
        max_attempts=max_attempts,
    )
    queue = open_queue(queue_uri)
    groups = _job_groups(queue, group, fallback_group, fallback_after)
    # Every flag is checked before the snapshot is stored: a refused submit uploads nothing.
    shipped = _ship_workdir(workdir, max_workdir_size, checkpoint_uri=checkpoint_uri, queue_uri=queue_uri)
    code = shipped[0].model_dump() if shipped else None
    spec = spec_from_flags(**{**spec.model_dump(), **groups, "code": code})
    job = queue.submit(spec, job_id=job_id)
    if output == "json":
        print_json({**job_row(job), "code_uploaded": shipped[1] if shipped else None})
    else:
        click.echo(f"submitted {job.id} to {queue.uri}")
        if shipped:
            ref, uploaded = shipped
            click.echo(
                f"code {ref.sha256[:12]}: {ref.files} files, {size_text(ref.size_bytes)} from {workdir}, "
                f"{'uploaded to' if uploaded else 'already stored at'} {ref.uri}"
            )


def _ship_workdir(
    workdir: str | None, max_size: str, *, checkpoint_uri: str | None, queue_uri: str
) -> tuple[CodeRef, bool] | None:
    """Snapshot ``workdir`` and store it where the queue's nodes read it: (CodeRef, uploaded), or None."""
    if workdir is None:
        return None
    import tempfile
    from pathlib import Path

    from gpucloud.jobs.code.snapshot import build, parse_size
    from gpucloud.jobs.code.store import store
    from gpucloud.lifecycle.model import CodeRef

    limit = parse_size(max_size)
    with tempfile.TemporaryDirectory(prefix="gpucloud-snapshot-") as scratch:
        snapshot = build(Path(workdir), Path(scratch), limit=limit)
        stored = store(snapshot, checkpoint_uri=checkpoint_uri, queue_uri=queue_uri)
    ref = CodeRef(uri=stored.uri, sha256=snapshot.sha256, size_bytes=snapshot.size_bytes, files=snapshot.files)
    return ref, stored.uploaded


def _job_groups(
    queue: GangQueue, group: str | None, fallback_group: str | None, fallback_after: str | None
) -> dict[str, Any]:
    """The job's group fields, checked against the cluster's groups (node.env, else the agents' records)."""
    import dataclasses

    from gpucloud.agent.node_groups import NodeGroups, resolve_job_groups

    cluster = NodeGroups.from_env()
    wanted = group is not None or fallback_group is not None
    registered = frozenset(n.group for n in queue.nodes() if n.group) if wanted and not cluster.names else frozenset()
    return dataclasses.asdict(
        resolve_job_groups(group, fallback_group, fallback_after, cluster=cluster, registered=registered)
    )
