"""The training tree dies with its supervisor: a worker killed with -9 must not
leave its command, or torchrun's ranks in sessions of their own, running with parent PID 1 while
another worker starts the next attempt."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from gpucloud.jobs import guard
from gpucloud.jobs.process_group import ProcessGroup
from helpers.waiting import wait_for

pytestmark = pytest.mark.skipif(not guard.available(), reason="PR_SET_PDEATHSIG is Linux only")

# A torchrun stand-in: starts a "rank" in a session of its own, as torchrun does, then waits.
LAUNCHER = textwrap.dedent(
    """
    import os, subprocess, sys, time
    out = sys.argv[1]
    rank = subprocess.Popen([sys.executable, "-c", "import time\\nwhile True: time.sleep(0.05)"], start_new_session=True)
    with open(out + ".tmp", "w") as f:
        f.write(f"{os.getpid()} {rank.pid}")
    os.rename(out + ".tmp", out)
    while True:
        time.sleep(0.05)
    """
)

# The supervisor: runs the launcher in a ProcessGroup as the runner does, then waits to be killed.
SUPERVISOR = textwrap.dedent(
    """
    import os, sys, time
    from gpucloud.jobs.process_group import ProcessGroup
    launcher, out = sys.argv[1], sys.argv[2]
    group = ProcessGroup([sys.executable, launcher, out], env=dict(os.environ), sink=open(os.devnull, "w"))
    while True:
        time.sleep(0.05)
    """
)


def _running(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state != "Z"  # a zombie runs nothing; whoever adopted it reaps it


def _pids(path: Path) -> list[int] | None:
    return [int(p) for p in path.read_text().split()] if path.exists() else None


@pytest.fixture
def tree(tmp_path):
    """(supervisor process, [launcher pid, rank pid]); anything left is killed afterwards."""
    (tmp_path / "launcher.py").write_text(LAUNCHER)
    (tmp_path / "supervisor.py").write_text(SUPERVISOR)
    out = tmp_path / "pids"
    supervisor = subprocess.Popen(
        [sys.executable, str(tmp_path / "supervisor.py"), str(tmp_path / "launcher.py"), str(out)]
    )
    pids: list[int] = []
    try:
        pids = wait_for(lambda: _pids(out), what="the launcher and its rank to start")
        yield supervisor, pids
    finally:
        for pid in [supervisor.pid, *pids]:
            if _running(pid):
                os.kill(pid, signal.SIGKILL)
        supervisor.wait()


def test_killing_the_supervisor_with_sigkill_kills_the_command_and_ranks_in_other_sessions(tree):
    supervisor, (launcher, rank) = tree
    assert os.getsid(rank) != os.getsid(launcher)  # the rank escaped the group, as torchrun's do
    supervisor.send_signal(signal.SIGKILL)
    supervisor.wait()
    wait_for(lambda: not _running(launcher) and not _running(rank), what="the whole tree to die with its supervisor")


def test_ranks_orphaned_by_a_dead_launcher_do_not_outlive_the_supervisor(tree):
    supervisor, (launcher, rank) = tree
    os.kill(launcher, signal.SIGKILL)  # torchrun killed hard: its rank loses its parent
    wait_for(lambda: not _running(launcher), what="the launcher to die")
    supervisor.send_signal(signal.SIGKILL)
    supervisor.wait()
    wait_for(lambda: not _running(rank), what="the orphaned rank to die with the supervisor")


@pytest.mark.parametrize("code", [0, 3])
def test_the_guard_reports_the_commands_exit_code(code, tmp_path):
    with open(tmp_path / "out", "w") as sink:
        group = ProcessGroup([sys.executable, "-c", f"raise SystemExit({code})"], env=dict(os.environ), sink=sink)
        assert group.wait(timeout=60) == code


def test_the_guard_reports_a_signal_death_as_that_signal(tmp_path):
    script = "import os, signal; os.kill(os.getpid(), signal.SIGTERM)"
    with open(tmp_path / "out", "w") as sink:
        group = ProcessGroup([sys.executable, "-c", script], env=dict(os.environ), sink=sink)
        assert group.wait(timeout=60) == -signal.SIGTERM


# A cooperative command, as a training script with a TrainingSession behaves at a step boundary:
# on the preempt flag it acknowledges, commits and exits 75 (this one starts no ranks of its own).
COOPERATIVE = textwrap.dedent(
    """
    import os, sys, time
    from gpucloud import control
    ctl = os.environ["GPUCLOUD_CONTROL_DIR"]
    control.write(ctl, control.RESUMED, {"step": 0})
    step = 0
    while not control.exists(ctl, control.PREEMPT):
        time.sleep(0.01)
        step += 1
    control.write(ctl, control.ACK, {"step": step})
    control.write(ctl, control.COMMITTED, {"step": step})
    sys.exit(75)
    """
)

SAVING_SUPERVISOR = textwrap.dedent(
    """
    import os, sys, time
    from gpucloud.jobs.process_group import ProcessGroup
    command, control_dir = sys.argv[1], sys.argv[2]
    env = {**os.environ, "GPUCLOUD_CONTROL_DIR": control_dir}
    group = ProcessGroup([sys.executable, command], env=env, sink=open(os.devnull, "w"), save_grace=60)
    while True:
        time.sleep(0.05)
    """
)


def test_a_dead_supervisors_command_is_flagged_saves_its_step_and_only_then_goes(tmp_path):
    from gpucloud import control

    (tmp_path / "coop.py").write_text(COOPERATIVE)
    (tmp_path / "supervisor.py").write_text(SAVING_SUPERVISOR)
    control_dir = tmp_path / "control"
    control_dir.mkdir()
    supervisor = subprocess.Popen(
        [sys.executable, str(tmp_path / "supervisor.py"), str(tmp_path / "coop.py"), str(control_dir)]
    )
    try:
        wait_for(lambda: control.exists(control_dir, control.RESUMED), what="the command to start")
        guard_pid = wait_for(lambda: child_of(supervisor.pid), what="the guard to start")
        supervisor.send_signal(signal.SIGKILL)
        supervisor.wait()
        wait_for(lambda: not _running(guard_pid), what="the guard to go once the command saved")
        assert control.read(control_dir, control.PREEMPT)["kind"] == "supervisor-lost"
        committed = control.read(control_dir, control.COMMITTED)
        assert committed is not None and committed["step"] == control.read(control_dir, control.ACK)["step"]
    finally:
        if supervisor.poll() is None:
            supervisor.kill()
            supervisor.wait()


def child_of(pid: int) -> int | None:
    children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    return int(children[0]) if children else None
