"""Child processes that do not outlive the process that started them.

On Linux a child can ask the kernel for a signal when its parent dies (`PR_SET_PDEATHSIG`): a
launcher killed with SIGKILL then leaves no worker running, an evaluator killed so leaves no
candidate spinning. The signal is tied to the thread that forked the child, not to the process,
so the caller forks from a thread that lives as long as it does (the main thread, or a spawner).
"""

from __future__ import annotations

import ctypes
import functools
import os
import signal
import sys
from collections.abc import Callable

PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36
PR_SET_DUMPABLE = 4


@functools.cache
def libc() -> ctypes.CDLL:
    """The C library, its functions resolved here: a forked child must not dlopen (another thread
    may have held the loader's lock at the fork)."""
    lib = ctypes.CDLL(None, use_errno=True)
    _ = lib.prctl, lib.unshare, lib.mount, lib.syscall
    return lib


@functools.cache
def protect_self() -> None:
    """This process is not dumpable from now on: a process of the same user without CAP_SYS_PTRACE
    (a candidate that could not become `nobody`) cannot read its /proc/<pid>/mem or environ, nor
    attach to it. Children it forks inherit it; what they exec does not."""
    libc().prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)


def set_parent_death_signal(sig: int, lib: ctypes.CDLL) -> None:
    """In a forked child before exec: `sig` when the forking thread ends. After any change of
    identity, which clears it; exec keeps it."""
    lib.prctl(PR_SET_PDEATHSIG, sig, 0, 0, 0)


def _stat_fields(pid: int) -> list[str] | None:
    """/proc/<pid>/stat from field 3 (the state) on; None when there is no such process."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()  # the name, in parentheses, may hold spaces
    except (OSError, IndexError):
        return None


def state_and_parent(pid: int) -> tuple[str, int] | None:
    """The process's state letter (`Z`: a zombie waiting to be reaped) and its parent's pid, from
    /proc; None when there is no such process."""
    fields = _stat_fields(pid)
    try:
        return (fields[0], int(fields[1])) if fields else None
    except (IndexError, ValueError):
        return None


def start_time(pid: int) -> int | None:
    """When the process started, in clock ticks since boot (with the pid, it names one process:
    pids are reused, start times are not); None when there is no such process."""
    fields = _stat_fields(pid)
    try:
        return int(fields[19]) if fields else None  # field 22 of the stat line
    except (IndexError, ValueError):
        return None


def running(pid: int) -> bool:
    """Alive and not a zombie."""
    found = state_and_parent(pid)
    return found is not None and found[0] != "Z"


def children_of(pid: int) -> list[int]:
    """The processes whose parent is `pid`."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            known = state_and_parent(int(entry))
            if known is not None and known[1] == pid:
                found.append(int(entry))
    return found


def die_with_parent(sig: int = signal.SIGTERM) -> Callable[[], None] | None:
    """A `preexec_fn` for `subprocess.Popen` (None where the kernel has no such signal)."""
    if not sys.platform.startswith("linux"):
        return None
    return functools.partial(set_parent_death_signal, sig, libc())
