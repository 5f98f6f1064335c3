"""Real multi-process jobs (gloo): agreement on the preempt step, bitwise resume, resharding."""

from pathlib import Path

import pytest
import torch
import trainer

from conftest import run_ranks
from gpucloud import control, jobenv
from gpucloud.checkpoint import TrainingSession
from gpucloud.checkpoint.store import latest_committed

pytestmark = pytest.mark.slow


def _args(tmp: Path, name: str, steps: int = 12, **extra) -> list[str]:
    args = ["--steps", str(steps), "--uri", str(tmp / "ck" / name), "--control", str(tmp / "ctl" / name)]
    for key, value in extra.items():
        args += [f"--{key.replace('_', '-')}", str(value)]
    return args


def _codes(results) -> list[int]:
    return [r.returncode for r in results]


def _explain(results) -> str:
    return "\n".join(f"--- rank {i} rc={r.returncode}\n{r.stdout[-3000:]}" for i, r in enumerate(results))


def _load(path: Path) -> dict:
    return torch.load(path, weights_only=False)


def test_flag_on_one_rank_both_save_same_step_exit_75_then_bitwise_resume(tmp_path):
    ctl = tmp_path / "ctl" / "run"
    interrupted = run_ranks(2, _args(tmp_path, "run", every_steps=4, preempt_at=6, preempt_rank=1))
    assert _codes(interrupted) == [jobenv.EXIT_REQUEUED] * 2, _explain(interrupted)
    # Only node1 saw the flag; both nodes acknowledged and saw the commit of the same step.
    assert not control.exists(ctl / "node0", control.PREEMPT)
    for node in ("node0", "node1"):
        assert control.read(ctl / node, control.ACK)["step"] == 6
        assert control.read(ctl / node, control.COMMITTED)["step"] == 6
    assert latest_committed(str(tmp_path / "ck" / "run"), "job") == 6

    control.clear(ctl / "node1")
    resumed = run_ranks(2, _args(tmp_path, "run", every_steps=4, out=tmp_path / "resumed.pt"))
    assert _codes(resumed) == [0, 0], _explain(resumed)
    assert control.read(ctl / "node0", control.RESUMED)["step"] == 6
    assert control.read(ctl / "node1", control.FINISHED)["step"] == 12

    straight = run_ranks(2, _args(tmp_path, "straight", every_steps=4, out=tmp_path / "straight.pt"))
    assert _codes(straight) == [0, 0], _explain(straight)
    a, b = _load(tmp_path / "resumed.pt"), _load(tmp_path / "straight.pt")
    assert all(torch.equal(a[k], b[k]) for k in a), "resumed weights differ from the uninterrupted run"


def _restore_in_process(uri: Path, save_at: int | None = None) -> tuple[int, dict]:
    """World size 1, in this process: restore (and optionally train to and save ``save_at``
    through the preempt path); return (restored step, weights)."""
    model = trainer.build_model()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    data = trainer.DataPosition(0)
    sess = TrainingSession(
        model,
        optimizer,
        extra_state={"data": data},
        checkpoint_uri=str(uri),
        job_id="job",
        control_dir=str(uri) + "-ctl",
    )
    start = sess.restore()
    if save_at is not None:
        with pytest.raises(SystemExit):
            for step in range(start, save_at):
                x, y = data.batch()
                loss = torch.nn.functional.mse_loss(model(x), y)
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
                if step + 1 == save_at:
                    control.write(str(uri) + "-ctl", control.PREEMPT, {"kind": "spot-interruption"})
                sess.step_done(step + 1)
    else:
        sess.finish()
        assert data.index == start
    return start, {k: v.detach().clone() for k, v in model.state_dict().items()}


def test_resume_with_a_different_world_size(tmp_path):
    # 2 ranks checkpoint step 5; one process restores it.
    two = run_ranks(2, _args(tmp_path, "two", preempt_at=5, preempt_rank=0, out=tmp_path / "two.pt"))
    assert _codes(two) == [75, 75], _explain(two)
    step, weights = _restore_in_process(tmp_path / "ck" / "two")
    saved = _load(tmp_path / "two.pt")
    assert step == 5
    assert all(torch.equal(saved[k], weights[k]) for k in saved)

    # One process checkpoints step 4; 2 ranks restore it.
    step, weights = _restore_in_process(tmp_path / "ck" / "one", save_at=4)
    assert step == 0
    pair = run_ranks(2, _args(tmp_path, "one", steps=4, dump_restored=tmp_path / "one_at_two.pt"))
    assert _codes(pair) == [0, 0], _explain(pair)
    got = _load(tmp_path / "one_at_two.pt")
    assert got["step"] == 4 and got["data_index"] == 4
    assert all(torch.equal(weights[k], got["weights"][k]) for k in weights)


def test_two_ranks_commit_to_s3_and_resume_on_new_nodes(tmp_path, moto_s3, monkeypatch):
    # Each rank uploads its own files (5 MiB parts), rank 0 puts the manifest and LATEST last.
    monkeypatch.setenv("GPUCLOUD_S3_PART_SIZE_MB", "5")
    uri = "s3://ckpt-bucket/mp"
    base = ["--uri", uri, "--control", str(tmp_path / "ctl")]
    first = run_ranks(
        2,
        [
            "--steps",
            "12",
            *base,
            "--local",
            str(tmp_path / "nvme-old"),
            "--every-steps",
            "2",
            "--preempt-at",
            "5",
            "--preempt-rank",
            "1",
            "--out",
            str(tmp_path / "saved.pt"),
        ],
    )
    assert _codes(first) == [75, 75], _explain(first)
    assert latest_committed(uri, "job") == 5
    control.clear(tmp_path / "ctl" / "node1")
    second = run_ranks(
        2,
        [
            "--steps",
            "5",
            *base,
            "--local",
            str(tmp_path / "nvme-new"),
            "--dump-restored",
            str(tmp_path / "restored.pt"),
        ],
    )
    assert _codes(second) == [0, 0], _explain(second)
    for node in ("node0", "node1"):
        assert control.read(tmp_path / "ctl" / node, control.RESUMED)["source_tier"] == "durable"
    saved, restored = _load(tmp_path / "saved.pt"), _load(tmp_path / "restored.pt")
    assert restored["step"] == 5
    assert all(torch.equal(saved[k], restored["weights"][k]) for k in saved)
