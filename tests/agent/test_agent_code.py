"""The node agent runs a shipped job in its snapshot: each node unpacks the tree once
into its own cache, beside its run directory, and every gang member runs in its attempt's copy."""

from __future__ import annotations

import sys
import threading
from pathlib import Path

import pytest

from gpucloud.jobs.code.snapshot import build
from gpucloud.lifecycle.model import CodeRef, JobSpec, JobState
from gpucloud.queue.sqlite import SqliteQueue

from .test_agent_loop import free_port, make_agent

SCRIPT = """\
import os, pathlib, sys
rank = os.environ.get("RANK", "0")
pathlib.Path(sys.argv[1], rank).write_text(os.getcwd() + "|" + pathlib.Path("message.txt").read_text())
"""


def shipped_spec(tmp_path: Path, out: Path, **fields: object) -> JobSpec:
    work = tmp_path / "project"
    work.mkdir()
    (work / "job.py").write_text(SCRIPT)
    (work / "message.txt").write_text("from the snapshot")
    snap = build(work, tmp_path / "store")
    code = CodeRef(uri=str(snap.archive), sha256=snap.sha256, size_bytes=snap.size_bytes, files=snap.files)
    return JobSpec(command=[sys.executable, "job.py", str(out)], code=code, **fields)


def test_an_agent_runs_a_shipped_job_in_the_attempts_copy(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    q = SqliteQueue(tmp_path / "queue.db")
    job = q.submit(shipped_spec(tmp_path, out))
    summary = make_agent(tmp_path, "a").run()
    assert summary.exit_code == 0 and q.get(job.id).state is JobState.FINISHED
    cwd, message = (out / "0").read_text().split("|")
    assert Path(cwd) == tmp_path / "a" / "run" / job.id / "attempt-1" / "workdir" and message == "from the snapshot"
    assert (tmp_path / "a" / "cache" / "code" / job.spec.code.sha256 / "ready").exists()  # type: ignore[union-attr]


@pytest.mark.slow
def test_each_gang_member_runs_in_its_own_nodes_copy(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    q = SqliteQueue(tmp_path / "queue.db")
    job = q.submit(shipped_spec(tmp_path, out, nodes=2))
    port = free_port()
    agents = [make_agent(tmp_path, name, rendezvous_port=port, idle_exit=1.5) for name in ("a", "b")]
    threads = [threading.Thread(target=a.run) for a in agents]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert q.get(job.id).state is JobState.FINISHED
    seen = sorted((out / rank).read_text() for rank in ("0", "1"))
    nodes = sorted(str(tmp_path / n / "run" / job.id / "attempt-1" / "workdir") for n in ("a", "b"))
    assert seen == [f"{node}|from the snapshot" for node in nodes]  # one rank per node, each in its node's copy
