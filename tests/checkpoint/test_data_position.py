"""The data position survives a resume: the StatefulDataLoader recipe of
examples/train_data.py replays exactly the uninterrupted run's batches; loaders that cannot are
refused in one line; the resumed control file (kept with the job's "resume" event, shown by
`job show`) says whether the position came back."""

from __future__ import annotations

import argparse
import importlib.util
import json

import pytest
import torch
from torch.utils.data import DataLoader
from torchdata.stateful_dataloader import StatefulDataLoader  # the train extra: setup.sh installs it

from conftest import REPO
from gpucloud import control, jobenv
from gpucloud.checkpoint import TrainingSession
from gpucloud.errors import UserError
from helpers.tiny_job import Counter

# torchdata 0.11 calls an API torch 2.13 deprecated, once per loader (examples/train_data.py filters it too)
pytestmark = pytest.mark.filterwarnings("ignore:'set_vital' is deprecated:UserWarning")


def _example():
    spec = importlib.util.spec_from_file_location("train_data", REPO / "examples" / "train_data.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _args(example, uri: str, **overrides) -> argparse.Namespace:
    args = example.parser().parse_args(["--checkpoint-uri", uri, "--job-id", "data-job", "--steps", "30"])
    for key, value in overrides.items():
        setattr(args, key, value)
    return args


def _run(example, args, control_dir, *, preempt_at: int | None = None) -> tuple[list[list[int]], int | None]:
    """Train; return the batches seen and the exit code (None: finished)."""
    seen: list[list[int]] = []

    def on_step(step: int, indices: list[int]) -> None:
        seen.append(indices)
        if step == preempt_at:
            control.write(control_dir, control.PREEMPT, {"kind": "spot-interruption"})

    try:
        example.train(args, on_step)
    except SystemExit as stop:
        return seen, stop.code
    return seen, None


# 100 samples in batches of 8: 13 steps an epoch (the last one of 4), 30 steps cross two epoch ends.
@pytest.mark.parametrize(
    ("preempt_at", "workers"),
    [(5, 0), (13, 0), (14, 0), (20, 2)],
    ids=["mid-epoch", "last-batch-of-epoch", "first-batch-of-epoch", "mid-epoch-2-workers"],
)
def test_resumed_batches_are_the_uninterrupted_runs_batch_for_batch(tmp_path, monkeypatch, preempt_at, workers):
    example = _example()
    monkeypatch.delenv(jobenv.ATTEMPT, raising=False)
    monkeypatch.setenv(jobenv.CONTROL_DIR, str(tmp_path / "ctl-ref"))
    reference, code = _run(example, _args(example, str(tmp_path / "ref"), workers=workers), tmp_path / "ctl-ref")
    assert code is None and len(reference) == 30

    uri = str(tmp_path / "ck")
    monkeypatch.setenv(jobenv.CONTROL_DIR, str(tmp_path / "ctl-1"))
    first, code = _run(example, _args(example, uri, workers=workers), tmp_path / "ctl-1", preempt_at=preempt_at)
    assert code == jobenv.EXIT_REQUEUED and len(first) == preempt_at
    torch.manual_seed(12345)  # whatever the global RNG holds at the restart, the order must come back
    monkeypatch.setenv(jobenv.CONTROL_DIR, str(tmp_path / "ctl-2"))
    second, code = _run(example, _args(example, uri, workers=workers), tmp_path / "ctl-2")
    assert code is None
    assert control.read(tmp_path / "ctl-2", control.RESUMED)["data_position"] == "restored"
    resumed = first + second
    mismatch = next((i for i, (a, b) in enumerate(zip(resumed, reference, strict=True)) if a != b), None)
    assert mismatch is None, f"step {mismatch + 1}: {resumed[mismatch]} != {reference[mismatch]}"


def test_final_weights_equal_an_uninterrupted_run(tmp_path, monkeypatch):
    example = _example()
    monkeypatch.delenv(jobenv.ATTEMPT, raising=False)
    monkeypatch.setenv(jobenv.CONTROL_DIR, str(tmp_path / "ctl-ref"))
    reference = example.train(_args(example, str(tmp_path / "ref")))
    monkeypatch.setenv(jobenv.CONTROL_DIR, str(tmp_path / "ctl-1"))
    _, code = _run(example, _args(example, str(tmp_path / "ck")), tmp_path / "ctl-1", preempt_at=17)
    assert code == jobenv.EXIT_REQUEUED
    monkeypatch.setenv(jobenv.CONTROL_DIR, str(tmp_path / "ctl-2"))
    resumed = example.train(_args(example, str(tmp_path / "ck")))
    for (name, a), b in zip(reference.state_dict().items(), resumed.state_dict().values(), strict=True):
        assert torch.equal(a, b), name


def _session(tmp_path, **kwargs) -> TrainingSession:
    model = torch.nn.Linear(1, 1)
    return TrainingSession(
        model, torch.optim.SGD(model.parameters(), lr=0.1), checkpoint_uri=str(tmp_path), job_id="j", **kwargs
    )


def test_a_plain_dataloader_is_refused_with_what_to_use(tmp_path):
    data = list(range(10))
    with pytest.raises(
        UserError,
        match=r"extra_state\['data'\] is a torch DataLoader, which cannot save its position; use torchdata's StatefulDataLoader",
    ) as info:
        _session(tmp_path, extra_state={"data": DataLoader(data, batch_size=2)})
    assert "\n" not in str(info.value)
    with pytest.raises(
        UserError, match=r"extra_state\['data'\] is a data-loader iterator; pass the StatefulDataLoader itself"
    ):
        _session(tmp_path, extra_state={"data": iter(StatefulDataLoader(data, batch_size=2))})
    with pytest.raises(
        UserError, match=r"built with generator= and shuffle=True does not resume later epochs' order; drop generator="
    ):
        _session(tmp_path, extra_state={"data": StatefulDataLoader(data, shuffle=True, generator=torch.Generator())})
    # Without shuffling, generator= only seeds workers: accepted.
    _session(tmp_path, extra_state={"data": StatefulDataLoader(data, generator=torch.Generator())}).finish()


def _resume_position(tmp_path, *, saved_extra: dict, extra: dict, **kwargs) -> str:
    first = _session(tmp_path / "ck", extra_state=saved_extra)
    first.restore()
    first.finish(save=False)
    first = _session(tmp_path / "ck", extra_state=saved_extra)
    first.restore()
    first.step_done(1)
    first.finish(save=True)
    ctl = tmp_path / "ctl"
    again = _session(tmp_path / "ck", extra_state=extra, control_dir=str(ctl), **kwargs)
    again.restore()
    again.finish()
    return control.read(ctl, control.RESUMED)["data_position"]


def test_resumed_says_when_the_data_position_did_not_come_back(tmp_path):
    assert _resume_position(tmp_path / "a", saved_extra={"data": Counter()}, extra={"data": Counter()}) == "restored"
    no_extra = _resume_position(tmp_path / "b", saved_extra={}, extra={})
    assert no_extra.startswith("not restored: no extra_state; the batches after this resume are not those")
    missing = _resume_position(tmp_path / "c", saved_extra={}, extra={"data": Counter()})
    assert missing == "not restored: the checkpoint has no state for extra_state ['data']"
    by_step = _resume_position(tmp_path / "d", saved_extra={}, extra={}, data_from_step=True)
    assert by_step == "from the step (data_from_step=True)"


def test_a_fresh_start_says_nothing_about_the_data_position(tmp_path):
    ctl = tmp_path / "ctl"
    sess = _session(tmp_path / "ck", control_dir=str(ctl))
    assert sess.restore() == 0
    sess.finish()
    assert "data_position" not in control.read(ctl, control.RESUMED)
    assert json.dumps(control.read(ctl, control.RESUMED))


def test_the_example_run_by_hand_says_what_it_does(tmp_path):
    """Run as its docstring prints it (no spot-train): it says where it starts, how it goes, and that it ended."""
    import subprocess
    import sys

    command = [sys.executable, str(REPO / "examples" / "train_data.py"), "--checkpoint-uri", str(tmp_path / "ck")]
    done = subprocess.run(
        [*command, "--job-id", "by-hand", "--steps", "20"], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == "starting at step 0 of 20"
    assert [line.split()[:2] for line in lines[1:-1]] == [["step", "10"], ["step", "20"]]
    assert lines[-1].startswith("finished: 20 steps")
    again = subprocess.run(
        [*command, "--job-id", "by-hand", "--steps", "25", "--log-every", "0"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    resumed = again.stdout.splitlines()
    assert again.returncode == 0 and resumed[0] == "resumed at step 20 of 25"
    assert [line.split()[:2] for line in resumed[1:-1]] == [["step", "25"]]
