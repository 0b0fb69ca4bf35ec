"""A PID namespace of its own for an isolated child (`confine.confine` calls `enter`, then `start_job`).

Three processes stand where one started:

- the *shim*, the process the evaluator started (Popen's or the fork server's pid: `kill_group`,
  the memory cgroup and the exit code all name it). It unshares a PID namespace, forks, closes
  every descriptor but its log (it holds no pipe: Popen's exec-error pipe, the job's stdin, the
  outer clock's channel), waits, and exits the way the job did: the same exit code, or killed by
  the same signal (an OOM kill still reads `returncode == -9`).
- the namespace's *init* (pid 1 in it): it mounts a fresh /proc (`fsview.private_view`), takes the
  job's identity, forks the job and reaps what ends in the namespace; when the job ends, it tells
  the shim how (a pipe) and exits, and the kernel kills everything left in the namespace: daemons in
  sessions of their own included. It dies with the shim (parent-death signal), and the shim with
  the evaluator, so the whole tree ends when the evaluator does.
- the *job* (pid 2), which goes on to exec or to run the harness. Processes outside its
  namespace have no pid in it: it can neither see them in its /proc nor signal them.

The job is not pid 1 itself: the kernel drops signals a namespace's init has no handler for, even
its own (a job that kills itself must die of it), and init reaps orphans a job would not.
Runs between fork and exec: no imports, no locks (`os.fork` is Python's: the fork server's job
goes on running Python).
"""

from __future__ import annotations

import ctypes
import os
import signal

from shared.process import set_parent_death_signal

CLONE_NEWPID = 0x20000000
KEPT = (1, 2)  # the log: the shim's and init's messages go where the job's go
STATUS_BYTES = 4
_CATCHABLE = set(signal.Signals) - {signal.SIGKILL, signal.SIGSTOP}


class Namespace:
    """What init holds: its end of the pipe that reports the job's end to the shim, and the end of
    the pipe through which it notices the shim is gone (EOF: the shim held the other end)."""

    def __init__(self, status_w: int, shim_r: int) -> None:
        self.status_w, self.shim_r = status_w, shim_r


def enter(lib: ctypes.CDLL) -> Namespace | None:
    """A PID namespace: returns in its init (the caller's process stays outside as the shim and never
    returns); None where the machine refuses one (a container without CAP_SYS_ADMIN)."""
    if lib.unshare(CLONE_NEWPID) != 0:
        return None
    status_r, status_w = os.pipe()
    shim_r, shim_w = os.pipe()
    pid = os.fork()
    if pid != 0:
        _shim(pid, status_r, shim_w)
    os.close(status_r)
    os.close(shim_w)
    namespace = Namespace(status_w, shim_r)
    _die_with_shim(namespace, lib)
    return namespace


def start_job(namespace: Namespace, lib: ctypes.CDLL) -> None:
    """In init, once it is confined: fork the job, which returns; init reaps until the job ends."""
    _die_with_shim(namespace, lib)  # a change of identity cleared it
    job = os.fork()
    if job == 0:
        os.close(namespace.status_w)
        os.close(namespace.shim_r)
        return
    _close_all_but((*KEPT, namespace.status_w))
    signal.pthread_sigmask(signal.SIG_BLOCK, _CATCHABLE)  # the job's signals stay the job's
    while True:
        try:
            pid, status = os.waitpid(-1, 0)
        except ChildProcessError:
            os._exit(1)
        if pid == job:
            os.write(namespace.status_w, status.to_bytes(STATUS_BYTES, "little"))
            os._exit(0)  # the kernel kills what is left in the namespace


def _die_with_shim(namespace: Namespace, lib: ctypes.CDLL) -> None:
    """SIGKILL when the shim ends; gone at once where it already has (its pipe reads EOF)."""
    set_parent_death_signal(signal.SIGKILL, lib)
    os.set_blocking(namespace.shim_r, False)
    try:
        gone = os.read(namespace.shim_r, 1) == b""
    except BlockingIOError:
        gone = False
    if gone:
        os._exit(1)


def _shim(init: int, status_r: int, shim_w: int) -> None:
    """Outside the namespace: wait for its init, then end as the job did; never returns."""
    _close_all_but((*KEPT, status_r, shim_w))
    signal.pthread_sigmask(signal.SIG_BLOCK, _CATCHABLE)  # it ends only as the job did, or killed
    status = None
    try:
        _, status = os.waitpid(init, 0)
        reported = b""
        while chunk := os.read(status_r, STATUS_BYTES - len(reported)):
            reported += chunk
            if len(reported) == STATUS_BYTES:
                status = int.from_bytes(reported, "little")
                break
    finally:
        _end_as(status)


def _end_as(status: int | None) -> None:
    """Exit with the wait `status`'s exit code, or die of its signal; never returns."""
    if status is None:
        os._exit(1)
    code = os.waitstatus_to_exitcode(status)
    if code >= 0:
        os._exit(code)
    sig = -code
    try:
        signal.signal(sig, signal.SIG_DFL)
    except (OSError, ValueError, RuntimeError):
        pass  # SIGKILL and SIGSTOP have no handler to reset
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {sig})
    os.kill(os.getpid(), sig)
    os._exit(128 + sig)  # a signal whose default is to carry on


def _close_all_but(keep: tuple[int, ...]) -> None:
    """Every descriptor closed but `keep`'s."""
    start = 0
    for fd in sorted(set(keep)):
        os.closerange(start, fd)
        start = fd + 1
    os.closerange(start, min(os.sysconf("SC_OPEN_MAX"), 1 << 20))
