"""A process that must not outlive its parent asks the kernel to end it (``PR_SET_PDEATHSIG``).

Why this and not a cgroup or a subreaper: the guard (``jobs/guard.py``) is already the attempt's
subreaper, and what is left to cover is the guard itself being killed with -9 together with its
supervisor. Then no process of ours is left to act: a subreaper dies with it, and a cgroup is only
ended by someone writing ``cgroup.kill`` (and needs a delegated cgroup v2 subtree, which a laptop
or a CI container rarely has). ``PR_SET_PDEATHSIG`` is kept by the kernel for each process, needs
no privilege, and fires however the parent died. It is not inherited across ``fork``, so each
process that matters sets it: the guard's command (SIGTERM, which torchrun answers by stopping
its ranks), and each rank's training session (SIGKILL when its launcher is gone).

Caveat (prctl(2)): the signal follows the *thread* that forked the process, not the whole
parent. torchrun and ``torch.multiprocessing.spawn`` start ranks from their main thread.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys

PR_SET_PDEATHSIG = 1
PR_GET_PDEATHSIG = 2


def available() -> bool:
    return sys.platform.startswith("linux")


def die_with_parent(sig: int = signal.SIGKILL) -> bool:
    """Have the kernel send ``sig`` to this process when its parent dies; True when set. A parent
    that died already (before the request took effect) is answered at once, the same way."""
    if not available():
        return False
    parent = os.getppid()
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0) != 0:
        return False
    if os.getppid() != parent:  # re-parented between the two calls: the parent is gone
        os.kill(os.getpid(), sig)
    return True


def parent_death_signal() -> int:
    """The signal set for this process (0: none)."""
    if not available():
        return 0
    value = ctypes.c_int(0)
    ctypes.CDLL(None, use_errno=True).prctl(PR_GET_PDEATHSIG, ctypes.byref(value), 0, 0, 0)
    return value.value
