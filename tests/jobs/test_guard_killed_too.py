"""The supervisor and its guard killed with -9 together: the kernel still ends the attempt's
command and its ranks (PR_SET_PDEATHSIG, lifeline.py), instead of leaving them training with
nobody supervising them."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from gpucloud import lifeline
from gpucloud.jobs import guard
from helpers.waiting import wait_for

from .test_guard import SUPERVISOR, _pids, _running

pytestmark = pytest.mark.skipif(not guard.available(), reason="PR_SET_PDEATHSIG is Linux only")

# A torchrun stand-in whose rank (in a session of its own) opens a gpucloud training session.
LAUNCHER = textwrap.dedent(
    """
    import os, subprocess, sys, time
    out, rank_script = sys.argv[1], sys.argv[2]
    rank = subprocess.Popen([sys.executable, rank_script, out + ".rank"], start_new_session=True)
    while not os.path.exists(out + ".rank"):
        time.sleep(0.05)
    with open(out + ".tmp", "w") as f:
        f.write(f"{os.getpid()} {rank.pid}")
    os.rename(out + ".tmp", out)
    while True:
        time.sleep(0.05)
    """
)
RANK = textwrap.dedent(
    """
    import os, sys, time, torch
    from gpucloud.checkpoint import TrainingSession
    model = torch.nn.Linear(2, 2)
    ck = os.path.join(os.path.dirname(sys.argv[1]), "ck")
    TrainingSession(model, None, checkpoint_uri=ck, job_id="j", every_steps=1000)
    open(sys.argv[1], "w").write("training")
    while True:
        time.sleep(0.05)
    """
)


@pytest.mark.parametrize("first", ["supervisor", "guard"])
def test_killing_supervisor_and_guard_together_ends_the_command_and_its_ranks(tmp_path: Path, first: str) -> None:
    (tmp_path / "launcher.py").write_text(LAUNCHER)
    (tmp_path / "rank.py").write_text(RANK)
    (tmp_path / "supervisor.py").write_text(
        SUPERVISOR.replace(
            "[sys.executable, launcher, out]",
            "[sys.executable, launcher, out, launcher.replace('launcher.py', 'rank.py')]",
        )
    )
    out = tmp_path / "pids"
    supervisor = subprocess.Popen(
        [sys.executable, str(tmp_path / "supervisor.py"), str(tmp_path / "launcher.py"), str(out)],
        env={**os.environ, "GPUCLOUD_CONTROL_DIR": str(tmp_path / "ctl"), "PYTHONPATH": os.pathsep.join(sys.path)},
    )
    pids: list[int] = []
    try:
        pids = wait_for(lambda: _pids(out), timeout=120, what="the launcher and its rank's session to start")
        launcher, rank = pids
        guard_pid = int(Path(f"/proc/{launcher}/stat").read_text().rsplit(")", 1)[1].split()[1])
        order = [supervisor.pid, guard_pid] if first == "supervisor" else [guard_pid, supervisor.pid]
        for pid in order:
            os.kill(pid, signal.SIGKILL)
        supervisor.wait()
        wait_for(lambda: not _running(launcher), timeout=20, what="the command to end with its guard")
        wait_for(lambda: not _running(rank), timeout=20, what="the rank to end with its launcher")
    finally:
        for pid in [supervisor.pid, *pids]:
            if _running(pid):
                os.kill(pid, signal.SIGKILL)


def test_a_session_outside_an_attempts_tree_asks_for_nothing() -> None:
    code = "from gpucloud import lifeline; print(lifeline.parent_death_signal())"
    env = {k: v for k, v in os.environ.items() if k != "GPUCLOUD_GUARD_PID"}
    shown = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    assert shown.stdout.strip() == "0"
    assert lifeline.available()
