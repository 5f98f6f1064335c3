"""``TrainingSession``: the training-side API that makes a training loop spot-safe.

    sess = TrainingSession(model, optimizer, every_steps=100)
    start = sess.restore()
    for step in range(start, total_steps):
        train_one_step()
        sess.step_done(step + 1)
    sess.finish()

At each step boundary every rank contributes [preempt seen, save wanted] to one all_reduce(MAX),
so all ranks take the same decision at the same step. Periodic and rebalance saves are
asynchronous: small state (RNG, buffers, data-loader position) is copied at once; parameters and
optimizer state are copied by the background thread while the next forward/backward runs (they
only change inside ``optimizer.step()``, which waits for that copy through a pre-hook); DCP then
writes and the commit protocol publishes, all off the training thread. A preempt flag triggers a
synchronous emergency save of the agreed step, a durable commit, and ``SystemExit(75)``.
"""

from __future__ import annotations

import copy
import logging
import os
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import torch
from torch.distributed.checkpoint.api import CheckpointException

from gpucloud import control, jobenv, lifeline
from gpucloud.checkpoint import commit as commit_protocol
from gpucloud.checkpoint import dcp_io, fit, state
from gpucloud.checkpoint.manifest import FileEntry, Manifest, ManifestError, verify_directory
from gpucloud.checkpoint.policy import SaveHistory, SavePolicy, should_save
from gpucloud.checkpoint.ranks import Ranks
from gpucloud.checkpoint.store import CheckpointStore, FencedError, Resolved
from gpucloud.errors import UserError
from gpucloud.training_metrics import SessionMeter

log = logging.getLogger("gpucloud.checkpoint")

_PROGRESS_EVERY_S = 1.0


class CheckpointSaveError(RuntimeError):
    """A save could not be written or committed; LATEST still names the previous checkpoint."""


class CheckpointFencedError(CheckpointSaveError):
    """A newer attempt of this job holds it: this one must stop (it can never commit again)."""


class _PendingSave:
    """One asynchronous save in flight."""

    def __init__(self, step: int, started: float) -> None:
        self.step = step
        self.started = started
        self.staged = threading.Event()
        self.future: Future[Manifest] | None = None
        self.stall = 0.0
        self.committed_at: float | None = None  # when the durable commit returned (the writer thread)


class TrainingSession:
    def __init__(
        self,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer | None,
        *,
        extra_state: dict[str, Any] | None = None,
        every_steps: int | None = None,
        every_seconds: float | None = None,
        auto: bool = False,
        mtbi_hours: float = 6.0,
        keep_last: int = 3,
        checkpoint_uri: str | None = None,
        job_id: str | None = None,
        control_dir: str | None = None,
        local_dir: str | None = None,
        writer_threads: int = dcp_io.DEFAULT_WRITER_THREADS,
        lazy_staging: bool = True,
        data_from_step: bool = False,
    ) -> None:
        checkpoint_uri = checkpoint_uri or os.environ.get(jobenv.CHECKPOINT_URI)
        if not checkpoint_uri:
            raise UserError(
                f"no checkpoint location: pass checkpoint_uri= or set {jobenv.CHECKPOINT_URI} "
                "(gpucloud spot-train sets it)"
            )
        job_id = job_id or os.environ.get(jobenv.JOB_ID)
        if not job_id:
            raise UserError(f"no job id: pass job_id= or set {jobenv.JOB_ID} (gpucloud spot-train sets it)")
        if isinstance(keep_last, bool) or not isinstance(keep_last, int) or keep_last < 1:
            raise UserError(f"keep_last must be a whole number >= 1, got {keep_last!r}")
        if isinstance(writer_threads, bool) or not isinstance(writer_threads, int) or writer_threads < 1:
            raise UserError(f"writer_threads must be a whole number >= 1, got {writer_threads!r}")
        if not (isinstance(mtbi_hours, (int, float)) and not isinstance(mtbi_hours, bool)):
            raise UserError(f"mtbi_hours must be a number of hours > 0, got {mtbi_hours!r}")
        extra = validate_extra_state(extra_state)
        self.model = model
        self.optimizer = optimizer
        self.extra = extra
        # True: the script derives each step's batches from the step itself (nothing to save).
        self.data_from_step = bool(data_from_step)
        self.data_position: str | None = None  # after restore(): what became of the data position
        self.policy = SavePolicy(
            every_steps=every_steps, every_seconds=every_seconds, auto=auto, mtbi_seconds=float(mtbi_hours) * 3600.0
        )
        self.keep_last = keep_last
        self.writer_threads = writer_threads
        self.control_dir = control_dir or os.environ.get(jobenv.CONTROL_DIR) or None
        if os.environ.get(jobenv.GUARD_PID):  # in an attempt's tree: never outlive the launcher (lifeline.py)
            lifeline.die_with_parent()
        # The attempt token (GPUCLOUD_ATTEMPT, set by spot-train) fences commits; without it the
        # session is not fenced and records attempt 0 in manifests.
        self.attempt_token = jobenv.attempt()
        self.attempt = self.attempt_token or 0
        self.store = CheckpointStore(
            checkpoint_uri, job_id, local_dir=local_dir or os.environ.get(jobenv.LOCAL_CHECKPOINT_DIR) or None
        )
        self.ranks = Ranks()
        self.step = 0
        self.restored = False  # step_done() and saves need restore() first: see _require_restored
        self.finished = False
        self.history = SaveHistory()
        self.last_committed: int | None = None
        self.save_count = 0
        self._pending: _PendingSave | None = None
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="gpucloud-checkpoint")
        self._staging_cache = dcp_io.StagingCache()
        self._last_progress = 0.0
        # The last committed save as measured here: {"step", "bytes", "seconds"} (start -> durable
        # commit). Reported to the supervisor, which keeps it with the job and judges a notice by it.
        self.last_save: dict[str, Any] | None = None
        # Step times, saves, stalls and failures for the node's /metrics (the progress file carries them).
        self.meter = SessionMeter()
        self._emergency_save = False  # the save in progress is the notice's (its kind on /metrics)
        self._hook = None
        if optimizer is not None and lazy_staging:
            self._hook = optimizer.register_step_pre_hook(self._before_optimizer_step)
        self._lazy = optimizer is not None and lazy_staging

    # ------------------------------------------------------------------------------ restore
    def restore(self) -> int:
        """Load the newest committed checkpoint that verifies; return its step (0 when none)."""
        failure: Exception | None = None
        resolved = None
        decision: dict[str, Any] = {}
        loaded: list[tuple[int, list[str]]] = []
        load_while_resolving = None
        if not self.ranks.distributed:
            # One process: each candidate is loaded as it is checked, its files hashed as they
            # are read (one pass); a file that does not verify makes the previous step tried.
            def load_while_resolving(candidate: Resolved) -> None:
                verify = None if candidate.data_verified else candidate.manifest.files
                loaded.append(self._load(candidate.directory, verify=verify))

        if self.ranks.rank == 0:
            try:
                if self.attempt_token is not None:
                    self.store.claim(self.attempt_token)  # from now on, older attempts cannot commit
                resolved = self.store.resolve(load=load_while_resolving)
                decision = (
                    {"step": None}
                    if resolved is None
                    else {
                        "step": resolved.step,
                        "tier": resolved.tier,
                        "manifest": resolved.manifest_bytes,
                    }
                )
            except Exception as exc:  # noqa: BLE001 - every rank must learn of it, or they hang
                failure = exc
                decision = {
                    "error": str(exc).splitlines()[0] if str(exc) else type(exc).__name__,
                    "kind": "user" if isinstance(exc, UserError) else "fenced" if isinstance(exc, FencedError) else "",
                }
        decision = self.ranks.broadcast_object(decision)
        if "error" in decision:
            if failure is not None:
                raise failure
            kind = {"user": UserError, "fenced": FencedError}.get(decision["kind"], RuntimeError)
            raise kind(decision["error"])
        source_tier = None
        step = 0
        if decision["step"] is not None:
            manifest = Manifest.parse(decision["manifest"], "broadcast manifest")
            directory = (
                resolved.directory if resolved is not None else self._directory_for(manifest, decision["manifest"])
            )
            if self.store.durable.needs_local_copy and self.ranks.distributed:
                self.ranks.barrier()  # downloads by each node's first rank are complete
            step, missing_extra = loaded[-1] if loaded else self._load(directory)
            self.data_position = self._data_position(missing_extra, manifest.world_size)
            source_tier = decision["tier"]
            self.last_committed = step
            log.info("restored %s from the %s tier (attempt %d)", f"step-{step}", source_tier, self.attempt)
        self.step = step
        self.restored = True
        self.history = SaveHistory(last_step=step, last_time=time.monotonic())
        self.meter.start(time.monotonic(), step)
        if self.ranks.is_node_leader and self.control_dir:
            resumed: dict[str, Any] = {"step": step, "source_tier": source_tier, "attempt": self.attempt}
            if self.data_position is not None:
                # The supervisor keeps every field with the job's "resume" event: `job show` prints it.
                resumed["data_position"] = self.data_position
            control.write(self.control_dir, control.RESUMED, resumed)
        return step

    def _data_position(self, missing_extra: list[str], saved_world_size: int) -> str:
        """Whether the batches after this resume are the ones an uninterrupted run would see."""
        if self.data_from_step:
            return "from the step (data_from_step=True)"
        if not self.extra:
            return (
                "not restored: no extra_state; the batches after this resume are not those of an uninterrupted "
                "run (pass a torchdata StatefulDataLoader in extra_state, see docs/checkpoint.md)"
            )
        if missing_extra:
            return f"not restored: the checkpoint has no state for extra_state {missing_extra}"
        if saved_world_size != self.ranks.world_size:
            return (
                f"not restored exactly: saved by {saved_world_size} ranks, resumed on {self.ranks.world_size}; "
                "ranks without their own entry took rank 0's"
            )
        return "restored"

    def _directory_for(self, manifest: Manifest, manifest_bytes: bytes) -> Path:
        """Where this (non-zero) rank reads the chosen step: a complete local copy, else durable."""
        step = manifest.step
        if self.store.local is not None:
            local = self.store.local.step_path(self.store.job_id, step)
            try:
                verify_directory(local, manifest, checksums=False)
                return local
            except ManifestError:
                pass
        in_place = self.store.durable.step_directory(self.store.job_id, step)
        if in_place is not None:
            return in_place
        assert self.store.local is not None, "a tier read by download always gets a local one"
        local = self.store.local.step_path(self.store.job_id, step)
        if self.ranks.is_node_leader:
            staging = self.store.local.staging_path(self.store.job_id, step, f"download-r{self.ranks.rank}")
            self.store.durable.download_step(self.store.job_id, step, manifest, manifest_bytes, staging)
            verify_directory(staging, manifest, checksums=True)
            self.store.local.commit_staging(self.store.job_id, step, staging, manifest_bytes)
        return local

    def _load(self, directory: Path, *, verify: list[FileEntry] | None = None) -> tuple[int, list[str]]:
        """Load ``directory``; return its step and the extra_state names it had no state for.
        ``verify``: the manifest's entries, checked as the files are read (ManifestError)."""
        keys = dcp_io.saved_keys(directory)
        rank = self.ranks.rank
        source_rank = rank if f"rng.rank{rank}.torch" in keys else 0
        extra_prefix = f"extra.rank{source_rank}."
        present = {k[len(extra_prefix) :].split(".", 1)[0] for k in keys if k.startswith(extra_prefix)}
        restorable = {name: obj for name, obj in self.extra.items() if name in present}
        for name in self.extra.keys() - present:
            log.warning(
                "checkpoint in %s has no state for extra_state[%r]; it keeps its current state", directory, name
            )
        target = state.template(
            self.model, self.optimizer, restorable, source_rank=source_rank, has_extra=bool(restorable)
        )
        check_fits(target, directory, sections=fit.CHECKED_SECTIONS)
        try:
            dcp_io.load(target, directory, process_group=self.ranks.checkpoint_group, verify=verify)
        except CheckpointException as exc:  # a BaseException: `except Exception` misses it
            raise UserError(f"checkpoint {directory} does not fit this model/optimizer: {_root_cause(exc)}") from None
        step = state.apply(target, self.model, self.optimizer, restorable, source_rank=source_rank)
        return step, sorted(self.extra.keys() - present)

    # ------------------------------------------------------------------------------ step boundary
    def step_done(self, step: int) -> None:
        """Call after every completed step (``step`` = number of steps done). See module docs."""
        if isinstance(step, bool) or not isinstance(step, int) or step < 0:
            raise UserError(f"step_done() takes the number of completed steps (int >= 0), got {step!r}")
        self._require_restored(f"step_done({step})")
        if step < self.step:
            # A save of the smaller step would replace LATEST with older weights under a newer name.
            raise UserError(
                f"step_done({step}) after step {self.step}: steps never go backwards; "
                "pass the number of completed steps (step + 1 in `for step in range(start, total)`)"
            )
        self.step = step
        self.meter.step(time.monotonic(), step)
        self._reap_finished()
        preempt = control.exists(self.control_dir, control.PREEMPT)
        rebalance = self._consume_save_request()
        now = time.monotonic()
        periodic = should_save(self.policy, step, now, self._history_including_pending(now))
        preempt_all, save_all = self.ranks.agree_max([int(preempt), int(rebalance or periodic)])
        if preempt_all:
            self._emergency(step)
        if save_all and self.last_committed != step and (self._pending is None or self._pending.step != step):
            self._start_async_save(step)
        self._report_progress(step)

    def _require_restored(self, call: str) -> None:
        """A save before restore() would commit over the job's newer checkpoints; one after finish()
        has no writer thread left."""
        if self.finished:
            raise UserError(f"{call} after finish(): the session is finished; create a new TrainingSession")
        if not self.restored:
            raise UserError(
                f"{call} before restore(): call `start = sess.restore()` first "
                "(it loads the newest committed checkpoint and returns the step to start from, 0 on a fresh job)"
            )

    def _history_including_pending(self, now: float) -> SaveHistory:
        """A save in flight counts as the last save: time-based triggers run from its start,
        and ``auto`` uses its stall so far, instead of firing again while it is persisting."""
        pending = self._pending
        if pending is None:
            return self.history
        return SaveHistory(
            last_step=pending.step,
            last_time=pending.started,
            stall_seconds=pending.stall if self.history.stall_seconds is None else self.history.stall_seconds,
            persist_seconds=max(self.history.persist_seconds or 0.0, now - pending.started),
        )

    def _consume_save_request(self) -> bool:
        # Consumed on read: a rank that sees the file removes it, so it cannot fire twice; the
        # all_reduce spreads the request to the ranks that did not see it.
        if not control.exists(self.control_dir, control.SAVE):
            return False
        control.remove(self.control_dir, control.SAVE)
        return True

    def _report_progress(self, step: int, *, force: bool = False) -> None:
        now = time.monotonic()
        due = force or now - self._last_progress >= _PROGRESS_EVERY_S
        if self.control_dir and self.ranks.is_node_leader and due:
            self._last_progress = now
            payload: dict[str, Any] = {"step": step}
            if self.last_save is not None:
                payload["last_save"] = self.last_save
            payload["metrics"] = self.meter.to_json()
            control.write(self.control_dir, control.PROGRESS, payload)

    def _measured(self, step: int, manifest: Manifest, seconds: float, *, stall: float, kind: str) -> None:
        """Keep the committed save's size and duration, and tell the supervisor at once."""
        self.last_save = {"step": step, "bytes": manifest.total_bytes, "seconds": round(seconds, 3)}
        self.meter.saved(kind, seconds=seconds, stall=stall, size=manifest.total_bytes)
        self._report_progress(self.step, force=True)

    def _save_failed(self, stall: float) -> None:
        self.meter.failed(stall=stall)
        self._report_progress(self.step, force=True)

    # ------------------------------------------------------------------------------ async save
    def _start_async_save(self, step: int) -> None:
        self.wait()  # one save in flight at a time: the commit collectives must not interleave
        started = time.monotonic()
        pending = _PendingSave(step, started)
        live = state.capture(self.model, self.optimizer, self.extra, rank=self.ranks.rank, step=step)
        deferred: list[tuple[torch.Tensor, torch.Tensor]] = []
        lazy_ids = self._lazy_tensor_ids() if self._lazy else set()
        staged = self._stage(live, "", lazy_ids, deferred)
        if not deferred:
            self._staging_cache.synchronize()
            pending.staged.set()
        ctx = commit_protocol.SaveContext(self.store, step, f"a{self.attempt}", self.attempt, self.attempt_token)
        pending.future = self._executor.submit(self._persist, ctx, staged, deferred, pending)
        pending.stall = time.monotonic() - started
        self._pending = pending

    def _lazy_tensor_ids(self) -> set[int]:
        """Storage pointers of tensors that only ``optimizer.step()`` mutates."""
        ptrs = {p.data_ptr() for p in self.model.parameters()}
        assert self.optimizer is not None
        for per_param in self.optimizer.state.values():
            for value in per_param.values():
                if isinstance(value, torch.Tensor):
                    ptrs.add(value.data_ptr())
        return ptrs

    def _stage(self, tree: Any, key: str, lazy_ids: set[int], deferred: list) -> Any:
        if isinstance(tree, dict):
            return {k: self._stage(v, f"{key}.{k}", lazy_ids, deferred) for k, v in tree.items()}
        if isinstance(tree, list):
            return [self._stage(v, f"{key}.{i}", lazy_ids, deferred) for i, v in enumerate(tree)]
        if isinstance(tree, torch.Tensor):
            return self._stage_tensor(tree, key, lazy_ids, deferred)
        return copy.deepcopy(tree)

    def _stage_tensor(self, tensor: torch.Tensor, key: str, lazy_ids: set[int], deferred: list) -> torch.Tensor:
        from torch.distributed.tensor import DTensor

        local = tensor.to_local() if isinstance(tensor, DTensor) else tensor
        if local.data_ptr() in lazy_ids and local.numel() > 0:
            buf = self._staging_cache.copy_later(key, local)
            deferred.append((buf, local))
        else:
            buf = self._staging_cache.copy(key, local)
        if isinstance(tensor, DTensor):
            return DTensor.from_local(
                buf, tensor.device_mesh, tensor.placements, run_check=False, shape=tensor.shape, stride=tensor.stride()
            )
        return buf

    def _into_warm_staging(self, tree: Any, key: str) -> Any:
        """GPU tensors copied into the pinned buffers that periodic saves already hold: one copy at
        PCIe speed, then DCP's writers read host memory (writing straight from GPU memory, each writer
        thread copies its tensors to pageable memory first: an H200 saved 10 GB in 13.2 s that way
        against 8.4 s from pinned buffers). A tensor without a buffer yet is written as it is: pinning
        new memory at a notice would cost more than it saves."""
        if isinstance(tree, dict):
            return {k: self._into_warm_staging(v, f"{key}.{k}") for k, v in tree.items()}
        if isinstance(tree, list):
            return [self._into_warm_staging(v, f"{key}.{i}") for i, v in enumerate(tree)]
        if isinstance(tree, torch.Tensor) and tree.is_cuda:
            from torch.distributed.tensor import DTensor

            local = tree.to_local() if isinstance(tree, DTensor) else tree
            if self._staging_cache.holds(key, local):
                return self._stage_tensor(tree, key, set(), [])
        return tree

    def _before_optimizer_step(self, optimizer, args, kwargs) -> None:
        pending = self._pending
        if pending is not None and not pending.staged.is_set():
            waited = time.monotonic()
            pending.staged.wait()
            pending.stall += time.monotonic() - waited

    def _persist(
        self, ctx: commit_protocol.SaveContext, staged: dict, deferred: list, pending: _PendingSave
    ) -> Manifest:
        try:
            for buf, src in deferred:
                buf.copy_(src.detach(), non_blocking=buf.is_pinned())
            self._staging_cache.synchronize()
        finally:
            pending.staged.set()
        manifest = self._write_and_commit(ctx, staged)
        pending.committed_at = time.monotonic()
        return manifest

    def _write_and_commit(self, ctx: commit_protocol.SaveContext, state_dict: dict) -> Manifest:
        commit_protocol.prepare(ctx, self.ranks)
        try:
            files = dcp_io.save(
                state_dict, ctx.staging, process_group=self.ranks.checkpoint_group, thread_count=self.writer_threads
            )
            manifest = commit_protocol.commit(ctx, files, self.ranks)
        except FencedError as exc:
            commit_protocol.discard(ctx)
            raise CheckpointFencedError(f"checkpoint of step {ctx.step} not committed: {exc}") from None
        except (CheckpointException, Exception) as exc:
            # DCP's CheckpointException is a BaseException carrying every rank's traceback as
            # text. Clean up, keep LATEST as it was, and report the root cause in one line.
            commit_protocol.discard(ctx)
            cause = _root_cause(exc) if isinstance(exc, CheckpointException) else _first_line(exc)
            raise CheckpointSaveError(f"checkpoint of step {ctx.step} failed: {cause}") from exc
        except BaseException:
            commit_protocol.discard(ctx)
            raise
        # Safe to clean staging here: the next save cannot start writing before this rank reaches
        # that save's prepare() barrier.
        self.store.apply_retention(self.keep_last, durable=self.ranks.rank == 0, local=self.ranks.is_node_leader)
        return manifest

    def _reap_finished(self) -> None:
        pending = self._pending
        if pending is not None and pending.future is not None and pending.future.done():
            self._settle(pending)

    def _settle(self, pending: _PendingSave) -> None:
        assert pending.future is not None
        self._pending = None
        try:
            manifest = pending.future.result()
        except CheckpointFencedError as exc:
            # Training on would only burn the GPUs of a job that another attempt now runs.
            self._save_failed(pending.stall)
            log.error("%s; stopping this attempt", exc)
            raise
        except BaseException as exc:
            self._save_failed(pending.stall)
            log.error(
                "checkpoint of step %d failed, the previous checkpoint stays current: %s",
                pending.step,
                _first_line(exc) if not isinstance(exc, CheckpointSaveError) else str(exc),
            )
            log.debug("checkpoint failure detail", exc_info=exc)
            return
        self.last_committed = pending.step
        self.save_count += 1
        self.history = SaveHistory(
            last_step=pending.step,
            last_time=pending.started,
            stall_seconds=pending.stall,
            persist_seconds=time.monotonic() - pending.started,
        )
        committed_at = pending.committed_at if pending.committed_at is not None else time.monotonic()
        self._measured(pending.step, manifest, committed_at - pending.started, stall=pending.stall, kind="periodic")

    def wait(self) -> None:
        """Block until the save in flight (if any) is committed or has failed."""
        pending = self._pending
        if pending is not None and pending.future is not None:
            try:
                pending.future.result()
            except BaseException:  # noqa: BLE001 - reported by _settle
                pass
            self._settle(pending)

    def save_now(self, step: int | None = None) -> Manifest | None:
        """Synchronously save and commit ``step`` (default: the last completed step), e.g. a
        final checkpoint after the loop. A collective: call it on every rank."""
        step = self.step if step is None else step
        self._require_restored("save_now()")
        entered = time.monotonic()  # the loop is blocked from here, the wait for a save in flight included
        self.wait()
        if self.last_committed == step:
            return None
        started = time.monotonic()
        live = state.capture(self.model, self.optimizer, self.extra, rank=self.ranks.rank, step=step)
        live = self._into_warm_staging(live, "")
        self._staging_cache.synchronize()
        ctx = commit_protocol.SaveContext(self.store, step, f"a{self.attempt}", self.attempt, self.attempt_token)
        try:
            manifest = self._write_and_commit(ctx, live)
        except CheckpointSaveError:
            self._save_failed(time.monotonic() - entered)
            raise
        elapsed = time.monotonic() - started
        self.last_committed = step
        self.save_count += 1
        self.history = SaveHistory(last_step=step, last_time=started, stall_seconds=elapsed, persist_seconds=elapsed)
        kind = "emergency" if self._emergency_save else "periodic"
        self._measured(step, manifest, elapsed, stall=time.monotonic() - entered, kind=kind)
        return manifest

    # ------------------------------------------------------------------------------ emergency
    def _emergency(self, step: int) -> None:
        notice = control.read(self.control_dir, control.PREEMPT) or {}
        if self.ranks.is_node_leader and self.control_dir:
            control.write(self.control_dir, control.ACK, {"step": step, "notice_kind": notice.get("kind")})
        self._emergency_save = True
        self.save_now(step)  # waits for an async save in flight first; no-op if it was this step
        if self.ranks.is_node_leader and self.control_dir:
            control.write(
                self.control_dir,
                control.COMMITTED,
                {"step": step, "uri": self.store.durable_description(step), "last_save": self.last_save},
            )
        log.warning(
            "preempted: step %d committed to %s; exiting %d for requeue",
            step,
            self.store.durable_description(step),
            jobenv.EXIT_REQUEUED,
        )
        self._shutdown()
        raise SystemExit(jobenv.EXIT_REQUEUED)

    # ------------------------------------------------------------------------------ finish
    def finish(self, *, save: bool = False) -> None:
        """Wait for the save in flight, then record that the loop finished at ``self.step``.

        ``save=True`` first commits ``self.step`` (a collective: every rank), so the final weights
        are a committed checkpoint that ``gpucloud.checkpoint.load`` can read for evaluation."""
        if self.finished:
            return
        if save:
            self.save_now(self.step)
        self.wait()
        self._report_progress(self.step, force=True)  # the last second's steps, for /metrics
        if self.ranks.is_node_leader and self.control_dir:
            control.write(self.control_dir, control.FINISHED, {"step": self.step})
        self.finished = True
        self._shutdown()

    def _shutdown(self) -> None:
        if self._hook is not None:
            self._hook.remove()
            self._hook = None
        self._executor.shutdown(wait=True)


def validate_extra_state(extra_state: dict[str, Any] | None) -> dict[str, Any]:
    """The extra_state objects, checked: names usable as DCP keys, each with state_dict()/load_state_dict()."""
    extra = dict(extra_state or {})
    for name, obj in extra.items():
        if not isinstance(name, str) or not name or "." in name:
            raise UserError(f"extra_state key {name!r} is not usable; use a non-empty name without '.'")
        _refuse_unresumable_loader(name, obj)
        if not (callable(getattr(obj, "state_dict", None)) and callable(getattr(obj, "load_state_dict", None))):
            raise UserError(
                f"extra_state[{name!r}] ({type(obj).__name__}) has no state_dict()/load_state_dict(); "
                "pass objects such as a sampler, data-loader position or LR scheduler"
            )
    return extra


def _refuse_unresumable_loader(name: str, obj: Any) -> None:
    """A data loader whose position cannot come back the same is refused here, not found out
    after a resume that replayed other batches."""
    from torch.utils.data import DataLoader

    stateful = hasattr(obj, "state_dict") and hasattr(obj, "load_state_dict")
    if isinstance(obj, DataLoader) and not stateful:
        raise UserError(
            f"extra_state[{name!r}] is a torch DataLoader, which cannot save its position; use "
            "torchdata's StatefulDataLoader (same arguments; pip install 'gpucloud[train]'), see docs/checkpoint.md"
        )
    if any(c.__name__.endswith("DataLoaderIter") for c in type(obj).__mro__):
        raise UserError(
            f"extra_state[{name!r}] is a data-loader iterator; pass the StatefulDataLoader itself "
            "(its state_dict() covers the iterator in use)"
        )
    if isinstance(obj, DataLoader) and obj.generator is not None and _shuffles(obj):
        # torchdata 0.11 restores the sampler's generator but not the loader's draws from the
        # same generator, so epochs after the resumed one are shuffled differently (tested).
        raise UserError(
            f"extra_state[{name!r}]: a StatefulDataLoader built with generator= and shuffle=True does not "
            "resume later epochs' order; drop generator= and call torch.manual_seed(seed) before building it"
        )


def _shuffles(loader: Any) -> bool:
    from torch.utils.data import RandomSampler

    sampler = getattr(loader, "sampler", None)
    return isinstance(sampler, RandomSampler) or type(sampler).__name__ == "RandomSampler"


def check_fits(target: dict[str, Any], directory: Path, *, sections: tuple[str, ...]) -> None:
    """UserError (one line, naming what differs) when the checkpoint's keys or shapes under
    ``sections`` are not the live state's."""
    diffs = fit.differences(target, dcp_io.read_metadata(directory), sections=sections)
    if diffs:
        raise UserError(f"checkpoint {directory} does not fit this model/optimizer: {fit.summary(diffs)}")


def _root_cause(exc: BaseException) -> str:
    """The last "SomeError: message" line of DCP's aggregated per-rank traceback text."""
    lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
    errors = [ln for ln in lines if ln.split(":", 1)[0].endswith(("Error", "Exception")) and ":" in ln]
    return errors[-1] if errors else (lines[0] if lines else type(exc).__name__)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"
