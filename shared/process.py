"""Child processes that do not outlive the process that started them.

On Linux a child can ask the kernel for a signal when its parent dies (`PR_SET_PDEATHSIG`): a
launcher killed with SIGKILL then leaves no worker running, an evaluator killed so leaves no
candidate spinning. The signal is tied to the thread that forked the child, not to the process,
so the caller forks from a thread that lives as long as it does (the main thread, or a spawner).
"""

from __future__ import annotations

import ctypes
import functools
import signal
import sys
from collections.abc import Callable

PR_SET_PDEATHSIG = 1


@functools.cache
def libc() -> ctypes.CDLL:
    """The C library, its functions resolved here: a forked child must not dlopen (another thread
    may have held the loader's lock at the fork)."""
    lib = ctypes.CDLL(None, use_errno=True)
    _ = lib.prctl, lib.unshare
    return lib


def set_parent_death_signal(sig: int, lib: ctypes.CDLL) -> None:
    """In a forked child before exec: `sig` when the forking thread ends. After any change of
    identity, which clears it; exec keeps it."""
    lib.prctl(PR_SET_PDEATHSIG, sig, 0, 0, 0)


def die_with_parent(sig: int = signal.SIGTERM) -> Callable[[], None] | None:
    """A `preexec_fn` for `subprocess.Popen` (None where the kernel has no such signal)."""
    if not sys.platform.startswith("linux"):
        return None
    return functools.partial(set_parent_death_signal, sig, libc())
