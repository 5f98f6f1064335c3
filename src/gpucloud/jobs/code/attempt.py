"""What the supervisor does before it starts an attempt's command: its code and its environment.

A job submitted with ``--workdir`` runs in ``<attempt dir>/workdir``, a copy of its verified
snapshot (``unpack.py``); with ``--setup``, in its cached venv (``setup_env.py``). Either way the
interpreter running gpucloud comes first on ``PATH`` (docs/code-shipping.md says why). Failures
are one line (``CodeNotReady``); the runner ends the attempt FAILED with it as the reason.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Protocol, TypeVar

from gpucloud.jobs.code.prune import PrunePolicy, hold, prune
from gpucloud.jobs.code.setup_env import PRIVATE as PRIVATE_ENV
from gpucloud.jobs.code.setup_env import SetupFailed, ensure_env, with_interpreter_first
from gpucloud.jobs.code.store import CodeUnavailable
from gpucloud.jobs.code.unpack import cached_tree, copy_tree
from gpucloud.lifecycle.model import Job

WORKDIR = "workdir"
CACHE_POLICY = PrunePolicy()  # a week unused, or a tenth of the disk free (prune.py)
log = logging.getLogger("gpucloud.jobs")


class CodeNotReady(Exception):
    """The attempt's code or environment could not be prepared; ``str`` is one line."""


class _Log(Protocol):
    """What ``prepare`` writes to: the attempt's log (``jobs.logs.AttemptLog``)."""

    def write(self, text: str, /) -> int: ...
    def flush(self) -> None: ...
    def supervisor(self, text: str, at: float | None = None) -> None: ...


@dataclasses.dataclass(frozen=True)
class Prepared:
    cwd: str | None
    env: dict[str, str]


@contextlib.contextmanager
def lease_kept(renew: Callable[[], object], every: float) -> Iterator[None]:
    """Call ``renew`` every ``every`` seconds from a thread while the body runs: a download or a
    ``pip install`` can outlast the attempt's lease, which the supervision loop renews only once the
    command runs, and another worker would take the job over as lost."""
    stop = threading.Event()

    def run() -> None:
        while not stop.wait(every):
            try:
                renew()
            except Exception as err:  # noqa: BLE001 - retried next round; the lease has slack
                log.warning("renewing the lease while preparing the attempt failed: %s", err)

    thread = threading.Thread(target=run, name="lease-while-preparing", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(timeout=30)


def node_cache_dir(run_root: Path | None) -> Path:
    """This node's cache of snapshots and envs, beside its run directory (``/var/lib/gpucloud/cache``
    for the agent on a cluster node; ``$GPUCLOUD_HOME/cache`` by default)."""
    from gpucloud.home import gpucloud_home

    return (run_root.parent if run_root is not None else gpucloud_home()) / "cache"


def prepare(
    job: Job,
    *,
    attempt_dir: Path,
    cache: Path,
    env: dict[str, str],
    log: _Log,
    holds: contextlib.ExitStack | None = None,
) -> Prepared:
    """The command's working directory and environment for this attempt; ``CodeNotReady`` if not possible.

    The cache is pruned first (``prune.py``); the entries this attempt prepares are held in use
    until ``holds`` closes (the runner closes it when the attempt ends), so no pruner removes them."""
    spec = job.spec
    try:
        said = prune(cache, CACHE_POLICY).describe(cache, CACHE_POLICY)
    except OSError as err:  # never the attempt's failure: its own preparation meets a bad disk itself
        said = f"node cache {cache}: not pruned ({err.strerror or err})"
    if said is not None:
        log.supervisor(said)
    if spec.code is None and spec.setup is None:
        return Prepared(spec.workdir, env)
    holds = holds if holds is not None else contextlib.ExitStack()  # without one: held while preparing only
    cwd = spec.workdir
    try:
        if spec.code is not None:
            code = spec.code
            tree, cached = _held(
                lambda: cached_tree(code.uri, code.sha256, code.size_bytes, cache), lambda got: got[0].parent, holds
            )
            workdir = attempt_dir / WORKDIR
            copy_tree(tree, workdir)
            cwd = str(workdir)
            how = "cached on this node" if cached else f"fetched from {spec.code.uri} and verified"
            log.supervisor(f"code {spec.code.sha256[:12]} ({spec.code.files} files, {how}) in {workdir}")
        if spec.setup is None:
            return Prepared(cwd, with_interpreter_first(env))
        # The attempt runs in its own copy of the cached env (no hold needed while it runs); the copy is
        # checked byte for byte against the cached env's manifest, so a prune racing it fails the copy.
        venv, cached = ensure_env(
            spec.setup,
            workdir=Path(cwd) if cwd is not None else Path.cwd(),
            cache=cache,
            code_sha256=spec.code.sha256 if spec.code is not None else None,
            env=env,
            sink=log,
            into=attempt_dir / PRIVATE_ENV,
        )
        how = "cached on this node, setup not run again" if cached else "set up"
        log.supervisor(f"setup env {venv} ({how}; a private copy of the node's sealed env)")
        return Prepared(cwd, with_interpreter_first(env, venv))
    except (CodeUnavailable, SetupFailed) as err:
        raise CodeNotReady(str(err)) from None
    except OSError as err:  # the node's disk: full, read-only, no permission
        where = f" ({err.filename})" if err.filename else ""
        raise CodeNotReady(f"cannot prepare the job's code on this node: {err.strerror}{where}") from None


_T = TypeVar("_T")


def _held(make: Callable[[], _T], entry_of: Callable[[_T], Path], holds: contextlib.ExitStack) -> _T:
    """``make()``'s cache entry, held in use in ``holds``; made again if a pruner took it in between."""
    for _ in range(3):
        got = make()
        if hold(entry_of(got), holds):
            return got
    raise CodeNotReady(f"the node cache entry {entry_of(got)} was pruned three times while this attempt prepared it")
