"""kill -9 at random points while a job saves: restore always finds a committed, verifying step.

The child process trains a model whose parameters equal the step number (set through
``optimizer.step()``), checkpointing every step asynchronously; the parent kills it with SIGKILL
after a random delay, so kills land in staging, in DCP's writer threads, in the manifest write,
the rename or the LATEST update. Each trial resumes from where the previous one was killed.
"""

from __future__ import annotations

import multiprocessing
import os
import random
import signal
import time

import pytest
import torch

from gpucloud.checkpoint import TrainingSession
from gpucloud.checkpoint.store import CheckpointStore

pytestmark = pytest.mark.slow

TRIALS = 40


def _model_and_optimizer():
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.Linear(64, 8))
    with torch.no_grad():
        for p in model.parameters():
            p.zero_()  # integer-valued weights keep the update below exact in float32
    return model, torch.optim.SGD(model.parameters(), lr=1.0)


def _set_params_to(model, optimizer, value: float) -> None:
    # p <- p - 1.0 * (p - value) == value, through optimizer.step() like real training.
    for p in model.parameters():
        p.grad = p.detach() - value
    optimizer.step()


def _saving_loop(uri: str, local: str, ready) -> None:
    model, optimizer = _model_and_optimizer()
    sess = TrainingSession(
        model,
        optimizer,
        every_steps=1,
        keep_last=2,
        checkpoint_uri=uri,
        job_id="job",
        local_dir=local,
        writer_threads=4,
    )
    step = sess.restore()
    ready.set()
    while True:
        step += 1
        _set_params_to(model, optimizer, float(step))
        sess.step_done(step)


def _restored(uri: str, local: str) -> tuple[int, torch.nn.Module]:
    model, optimizer = _model_and_optimizer()
    sess = TrainingSession(model, optimizer, checkpoint_uri=uri, job_id="job", local_dir=local)
    step = sess.restore()
    sess.finish()
    return step, model


def _wait_for_commit_after(uri: str, local: str, step: int, child, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and child.is_alive():
        resolved = CheckpointStore(uri, "job", local_dir=local).resolve()
        if resolved is not None and resolved.step > step:
            return
        time.sleep(0.005)
    raise AssertionError(f"no checkpoint after step {step} was committed within {timeout:.0f} s")


def test_sigkill_during_saves_always_resumes_from_a_committed_step(tmp_path):
    uri, local = str(tmp_path / "durable"), str(tmp_path / "nvme")
    ctx = multiprocessing.get_context("fork")
    rng = random.Random(20261121)
    previous = 0
    for trial in range(TRIALS):
        ready = ctx.Event()
        child = ctx.Process(target=_saving_loop, args=(uri, local, ready), daemon=True)
        child.start()
        assert ready.wait(60), "child did not start"
        if trial % 2:
            # Every other trial first waits for one new commit, so the suite makes progress even on a
            # loaded machine where a save takes longer than the random window below.
            _wait_for_commit_after(uri, local, previous, child)
        time.sleep(rng.uniform(0.0, 0.25))  # the kill point: random, not a synchronisation
        os.kill(child.pid, signal.SIGKILL)
        child.join(10)
        assert child.exitcode == -signal.SIGKILL

        resolved = CheckpointStore(uri, "job", local_dir=local).resolve()
        step, model = _restored(uri, local)
        assert step >= previous, f"trial {trial}: went back from step {previous} to {step}"
        if resolved is not None:
            assert resolved.step == step and resolved.manifest.step == step
            for p in model.parameters():
                assert torch.all(p == float(step)), f"trial {trial}: step-{step} holds other weights"
        previous = step
    assert previous > 0, "no checkpoint was ever committed: the kills all came too early"
