"""`gpucloud job resume` end to end: a real training script under the supervisor is
cancelled, saves its step through the training API, and its resumed attempt (same job id) restores
that committed step and finishes; `job show` counts the cancel as an interruption that lost 0 steps."""

from __future__ import annotations

import json
import sys
import textwrap
import threading
from pathlib import Path

from gpucloud.cost.timeline import build_timeline
from gpucloud.jobs.runner import supervise_job
from gpucloud.jobs.supervisor import EXIT_CANCELLED, SupervisorConfig
from gpucloud.lifecycle.model import AttemptState, JobSpec, JobState
from gpucloud.queue.sqlite import SqliteQueue
from helpers.notices import Inbox
from helpers.waiting import wait_for

from .test_cli import run

CONFIG = SupervisorConfig(ack_timeout=20.0, stop_margin=1.0, exit_grace=20.0, kill_after=5.0, stop_poll=0.1)

TRAIN = """
    import json, os, sys, time
    import torch
    from gpucloud.checkpoint import TrainingSession
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    session = TrainingSession(model, optimizer)
    start = session.restore()
    attempt = int(os.environ["GPUCLOUD_ATTEMPT"])
    with open(sys.argv[1], "a") as log:
        log.write(json.dumps({"attempt": attempt, "restored": start}) + "\\n")
    end = start + 3 if attempt > 1 else 10**9  # attempt 1 trains until it is cancelled
    for step in range(start, end):
        time.sleep(0.02)
        model(torch.ones(1, 4)).sum().backward()
        optimizer.step()
        optimizer.zero_grad()
        session.step_done(step + 1)  # at the cancel's stop request: saves this step, exits 75
    session.finish()
"""


def test_a_cancelled_job_resumes_from_its_committed_step_under_its_id(tmp_path: Path, capsys):
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(TRAIN))
    starts = tmp_path / "starts.jsonl"
    queue_uri = f"sqlite:///{tmp_path / 'q.db'}"
    supervisor, user = SqliteQueue(tmp_path / "q.db"), SqliteQueue(tmp_path / "q.db")
    job = user.submit(
        JobSpec(command=[sys.executable, str(script), str(starts)], checkpoint_uri=str(tmp_path / "ckpt"))
    )
    result: dict = {}
    thread = threading.Thread(
        target=lambda: result.setdefault("r", supervise_job(supervisor, job.id, notices=Inbox(), config=CONFIG))
    )
    thread.start()
    try:
        wait_for(lambda: any(e.kind == "resume" for e in user.events(job.id)), timeout=120, what="training to start")
        code, out, _ = run(capsys, "job", "cancel", job.id, "--queue", queue_uri)
        assert code == 0 and out.startswith(f"cancelling {job.id}")
    finally:
        thread.join(timeout=120)
    assert result["r"].exit_code == EXIT_CANCELLED
    [first] = user.attempts(job.id)
    assert first.state is AttemptState.CANCELLED and first.committed_step is not None and first.committed_step > 0

    code, out, _ = run(capsys, "job", "resume", job.id, "--queue", queue_uri, "--output", "json")
    row = json.loads(out)
    assert code == 0 and (row["job_id"], row["state"], row["attempt"]) == (job.id, "queued", 2)
    assert row["from_step"] == first.committed_step and row["from_step_unknown"] is None

    assert supervise_job(supervisor, job.id, notices=Inbox(), config=CONFIG).exit_code == 0
    assert user.get(job.id).state is JobState.FINISHED
    restored = [json.loads(line) for line in starts.read_text().splitlines()]
    assert restored == [{"attempt": 1, "restored": 0}, {"attempt": 2, "restored": first.committed_step}]
    report = build_timeline(user.get(job.id), user.attempts(job.id), user.events(job.id))
    [interruption] = report.interruptions
    assert (interruption.cause, interruption.steps_lost) == ("cancel", 0)
    supervisor.close()
    user.close()
