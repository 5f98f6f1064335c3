"""The guard: a tiny process between the supervisor and the training command, so that the whole
process tree dies with its supervisor.

Why: a supervisor killed with -9 (or dead of an error) used to leave its training running with
parent PID 1; after the lease expired a second worker started attempt k+1 while attempt k still
trained on the same checkpoint. ``PR_SET_PDEATHSIG`` on the command alone is not enough: it is
not inherited, and torchrun starts each rank in a session of its own, so the ranks would outlive
torchrun. The guard therefore

* asks the kernel for a signal when its parent (the supervisor) dies (``PR_SET_PDEATHSIG``),
* is a child subreaper (``PR_SET_CHILD_SUBREAPER``): every process below it that loses its parent
  (a rank whose torchrun died) is re-parented to the guard, not to init, so the guard can always
  find the whole tree by walking ``/proc``,
* runs the command as its child, in its own process group (the supervisor's ``killpg`` reaches
  both), and exits with the command's status (a signal death is mirrored by dying of the signal)
  once nothing the command started is left (stragglers get SIGTERM, then SIGKILL);
* sets ``PR_SET_PDEATHSIG`` (SIGTERM) on the command, so that if the guard itself is killed with
  -9 the kernel stops the command (torchrun stops its ranks on SIGTERM; each rank's training
  session also asks for SIGKILL when its launcher dies: ``lifeline.py``),
* when the supervisor dies: first asks the command to save (the ``preempt`` flag in the attempt's
  control directory, exactly as for a spot notice) and gives it ``--save-grace`` seconds to commit
  and exit, then SIGKILLs every descendant, repeatedly until none is left, and exits.

Why save first: an agent or worker that dies leaves a healthy node and healthy ranks. Flagged, they
save the step they are at (in a gang, the ranks' collective makes every member's ranks save that
same step), so the next attempt loses at most one step. The runner sets the grace to half the job
lease, so the tree is gone before the lease runs out and another worker may start the next attempt
(and a late commit is refused anyway: the checkpoint commit is fenced by attempt).

See prctl(2): PR_SET_PDEATHSIG, PR_SET_CHILD_SUBREAPER. Linux only; elsewhere the command runs
without a guard (``available()``).
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import time
from types import FrameType

from gpucloud import control, jobenv, lifeline
from gpucloud.jobs.proc import descendants, state

PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36
PARENT_DIED = signal.SIGUSR2  # catchable, unlike SIGKILL: the guard must clean up before it goes
NOT_STARTED = 127  # the shell's "command not found", as the runner reports it
LINGER_S = 10.0  # what processes left behind by the command get between SIGTERM and SIGKILL
_SWEEPS = 50  # kill passes over the tree: a process forking while it is killed is caught next pass


def available() -> bool:
    return sys.platform.startswith("linux")


def _prctl(option: int, value: int) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(option, value, 0, 0, 0) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"prctl({option}) failed: {os.strerror(err)}")


def kill_tree(root: int) -> None:
    """SIGKILL every live descendant of ``root`` until none is left (a subreaper's orphans included)."""
    for _ in range(_SWEEPS):
        alive = [pid for pid in descendants(root) if state(pid) not in (None, "Z")]
        if not alive:
            return
        for pid in alive:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        _reap_all()


def _reap_all() -> None:
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def _settle(root: int) -> None:
    """The command is gone but processes it started may linger (ranks of a torchrun that died):
    they are ours (subreaper). Ask them to stop, give them ``LINGER_S``, then kill what is left,
    so the guard's exit means the whole tree is gone."""
    deadline = time.monotonic() + LINGER_S
    asked = False
    while time.monotonic() < deadline:
        _reap_all()
        alive = [pid for pid in descendants(root) if state(pid) not in (None, "Z")]
        if not alive:
            return
        if not asked:
            asked = True
            for pid in alive:
                try:
                    os.kill(pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
        time.sleep(0.05)  # polling /proc: there is no way to wait on a process we did not start
    kill_tree(root)


def _save_then_stop(command: int, save_grace: float) -> None:
    """Flag the command's ranks to save and exit, as a notice does; wait for the command to end,
    at most ``save_grace`` seconds. Without a control directory (not a gpucloud job) or a grace,
    nothing is asked."""
    control_dir = os.environ.get(jobenv.CONTROL_DIR)
    if not control_dir or save_grace <= 0:
        return
    now = time.time()
    flag = {"kind": "supervisor-lost", "source": "guard", "deadline": now + save_grace, "received_at": now}
    try:
        control.write(control_dir, control.PREEMPT, flag)
    except OSError as err:
        print(f"gpucloud guard: cannot flag the ranks in {control_dir}: {err.strerror}", file=sys.stderr)
        return
    deadline = time.monotonic() + save_grace
    while time.monotonic() < deadline:
        try:
            pid, _ = os.waitpid(command, os.WNOHANG)
        except ChildProcessError:
            return  # already reaped
        if pid == command:
            return
        time.sleep(0.05)  # polling our own child: nothing else to wait on inside a signal handler


def _on_parent_death(supervisor: int, command: list[int], save_grace: float) -> None:
    def handler(signum: int, frame: FrameType | None) -> None:
        if os.getppid() == supervisor:
            return  # not from the kernel: the supervisor is alive (someone sent the signal by hand)
        try:
            if command:
                _save_then_stop(command[0], save_grace)
            kill_tree(os.getpid())
        finally:
            os._exit(128 + signal.SIGKILL)

    signal.signal(PARENT_DIED, handler)


def _ignore(signum: int, frame: FrameType | None) -> None:
    """The supervisor's SIGTERM/SIGINT reach the command through its group; the guard stays to
    report the command's exit. A handler, not SIG_IGN: ignored signals would be inherited."""


def _exit_like(status: int) -> None:
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        signal.signal(sig, signal.SIG_DFL)
        os.kill(os.getpid(), sig)
        os._exit(128 + sig)  # a signal that does not end a process by default
    os._exit(os.waitstatus_to_exitcode(status))


def main(argv: list[str]) -> None:
    """``python -m gpucloud.jobs.guard SUPERVISOR_PID [--save-grace SECONDS] -- COMMAND...``"""
    supervisor, options = int(argv[0]), argv[1 : argv.index("--")]
    command = argv[argv.index("--") + 1 :]
    save_grace = float(options[1]) if options[:1] == ["--save-grace"] else 0.0
    started: list[int] = []  # the command's pid, once forked (the handler may run before)
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, _ignore)
    _on_parent_death(supervisor, started, save_grace)
    _prctl(PR_SET_CHILD_SUBREAPER, 1)
    _prctl(PR_SET_PDEATHSIG, PARENT_DIED)
    if os.getppid() != supervisor:  # it died before the request above took effect
        os._exit(128 + signal.SIGKILL)
    try:
        child = os.fork()
    except OSError as err:
        print(f"gpucloud guard: cannot start {command[0]!r}: {err.strerror}", file=sys.stderr)
        os._exit(NOT_STARTED)
    if child == 0:
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, PARENT_DIED):
            signal.signal(sig, signal.SIG_DFL)
        # If the guard is killed too (kill -9 of supervisor and guard at once), nobody is left to
        # end the command: the kernel does (lifeline.py says why this and not a cgroup).
        lifeline.die_with_parent(signal.SIGTERM)
        os.environ[jobenv.GUARD_PID] = str(os.getppid())
        try:
            os.execvp(command[0], command)
        except OSError as err:
            print(f"gpucloud guard: cannot start {command[0]!r}: {err.strerror}", file=sys.stderr)
        os._exit(NOT_STARTED)
    started.append(child)
    while True:  # reap everything re-parented to us; leave with the command's own status
        try:
            pid, status = os.waitpid(-1, 0)
        except ChildProcessError:
            os._exit(NOT_STARTED)
        if pid == child:
            _settle(os.getpid())
            _exit_like(status)


if __name__ == "__main__":
    main(sys.argv[1:])
