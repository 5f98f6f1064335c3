"""Fuzzer (keep it found): random damage to a committed checkpoint directory.

Restore either returns a committed step whose state is bitwise what was saved at that step (or
step 0, untouched, when no LATEST is left), or raises a one-line UserError. Never corrupt
weights, never another exception.
"""

from __future__ import annotations

import logging
import os
import shutil
from pathlib import Path

import pytest
from hypothesis import event, given
from hypothesis import strategies as st
from test_manifest_completeness import fingerprint, identical

from fuzzing import fuzz_settings
from gpucloud.checkpoint.latest import LatestRecord
from gpucloud.errors import UserError

STEPS = (0, 2, 4)


class States(dict):
    """The saved states by step (a short repr: hypothesis prints the arguments of a failure)."""

    def __repr__(self) -> str:
        return f"States(steps={sorted(self)})"


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """A pristine job directory (steps 2 and 4 committed) and the state saved at each step."""
    from helpers.tiny_job import TinyJob

    base = tmp_path_factory.mktemp("fuzz")
    job = TinyJob(str(base / "ck"), every_steps=2, keep_last=5)
    states = States({0: fingerprint(job)})
    job.session.restore()
    for step in range(4):
        job.train_step()
        job.session.step_done(step + 1)
        if step + 1 in STEPS:  # what the save of this step captures, at the step boundary
            states[step + 1] = fingerprint(job)
    job.session.finish()
    return base / "ck" / "job", states


def _targets(job_dir: Path) -> list[Path]:
    """Every file and directory of the job, in a stable order (LATEST, steps, their files)."""
    return sorted(job_dir.rglob("*"), key=str)


def _flip(path: Path, where: int, mask: int) -> None:
    data = bytearray(path.read_bytes())
    if data:
        data[where % len(data)] ^= mask
        path.write_bytes(bytes(data))


def _truncate(path: Path, where: int, _: int) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: where % (len(data) + 1)])


def _append(path: Path, where: int, mask: int) -> None:
    with open(path, "ab") as fh:
        fh.write(bytes([mask]) * (1 + where % 64))


def _delete(path: Path, *_: int) -> None:
    path.unlink()


def _to_directory(path: Path, *_: int) -> None:
    path.unlink()
    path.mkdir()


def _symlink_loop(path: Path, *_: int) -> None:
    path.unlink()
    path.symlink_to(path.name)


def _rename_over_sibling(path: Path, where: int, _: int) -> None:
    siblings = sorted(p for p in path.parent.iterdir() if p != path)
    if siblings:
        target = siblings[where % len(siblings)]
        if target.is_dir() and not target.is_symlink():
            shutil.rmtree(target)
        else:
            target.unlink()
        os.replace(path, target)


def _extra_file(path: Path, where: int, mask: int) -> None:
    (path.parent / f"extra-{where % 5}").write_bytes(bytes([mask]) * (where % 100))


FILE_DAMAGE = [_flip, _truncate, _append, _delete, _to_directory, _symlink_loop, _rename_over_sibling, _extra_file]


def _damage_dir(path: Path, where: int, mask: int) -> None:
    """Damage a step directory as a whole: remove it, rename it to another step, or add a file."""
    choice = where % 3
    if choice == 0:
        shutil.rmtree(path)
    elif choice == 1:
        _rename_over_sibling(path, mask, 0)
    else:
        (path / f"extra-{mask}").write_bytes(b"x")


damage = st.lists(
    st.tuples(st.integers(0, 10_000), st.sampled_from(FILE_DAMAGE), st.integers(0, 2**20), st.integers(1, 255)),
    min_size=1,
    max_size=4,
)
latest_text = st.one_of(
    st.none(),
    st.sampled_from([*(LatestRecord(step=s).render() for s in (2, 4, 6, None)), "step-4\n", "step-4\nattempt 1\n"]),
    st.binary(max_size=40),
)


@fuzz_settings(40)
@given(ops=damage, latest=latest_text)
def test_damaged_checkpoint_restores_a_saved_step_or_says_why(saved, tmp_path_factory, ops, latest):
    from helpers.tiny_job import TinyJob

    pristine, states = saved
    root = tmp_path_factory.mktemp("case")
    job_dir = root / "ck" / "job"
    shutil.copytree(pristine, job_dir, symlinks=True)
    for index, op, where, mask in ops:
        targets = _targets(job_dir)
        if not targets:
            break
        target = targets[index % len(targets)]
        if target.is_symlink() or not target.exists():
            continue
        if target.is_dir():
            _damage_dir(target, where, mask)
        else:
            op(target, where, mask)
    pointer = job_dir / "LATEST"
    if latest is not None and job_dir.is_dir() and (pointer.is_symlink() or not pointer.is_dir()):
        pointer.unlink(missing_ok=True)
        pointer.write_bytes(latest.encode() if isinstance(latest, str) else latest)

    logging.disable(logging.WARNING)
    try:
        job = TinyJob(str(root / "ck"))
        step = job.session.restore()
    except UserError as exc:
        assert "\n" not in str(exc), str(exc)
        event(f"UserError: {str(exc).split(' ', 1)[0].split('/')[-1][:30]}")
        return
    finally:
        logging.disable(logging.NOTSET)
        shutil.rmtree(root, ignore_errors=True)
    event(f"restored step {step}")
    assert step in states, step
    assert identical(fingerprint(job), states[step]), f"step {step} restored with state that was not saved"
