"""What a starting child does to itself, between fork and exec (or in the fork server's forked
child): limits, its own network, a PID namespace of its own (`pidns`: the started process stays
outside as a shim that ends as the child does; the namespace's init and job go on), a private
view of the file systems with a fresh /proc and the swarm's data hidden (`fsview.private_view`),
its identity or no capabilities (`isolation` says the whole policy). Nothing here may take a lock
another thread of the evaluator could have held at the fork: no dlopen, no imports.
"""

from __future__ import annotations

import ctypes
import os
import platform
import resource
import signal

from services.evaluator.sandbox import pidns
from services.evaluator.sandbox.fsview import private_view
from shared.process import PR_SET_CHILD_SUBREAPER, PR_SET_DUMPABLE, set_parent_death_signal

CLONE_NEWNET = 0x40000000
CLONE_NEWUSER = 0x10000000
PR_CAPBSET_DROP, PR_SET_NO_NEW_PRIVS = 24, 38
CAPSET_SYSCALL = {"x86_64": 126, "aarch64": 91}.get(platform.machine())  # no wrapper in glibc
CAPABILITY_VERSION_3 = 0x20080522
LAST_CAPABILITY = 63  # beyond the kernel's last one PR_CAPBSET_DROP fails with EINVAL: harmless
LIMITS = {
    resource.RLIMIT_NOFILE: 4096,
    resource.RLIMIT_FSIZE: 64 << 30,  # no file larger than 64 GiB
    resource.RLIMIT_CORE: 0,
}
KEEP_TIGHTER = (resource.RLIMIT_FSIZE,)  # the evaluator's own soft limit, where lower, is kept
NPROC_LIMIT = 4096  # threads count too: torch starts many
OOM_SCORE_ADJ = 1000  # the most: an isolated child is the OOM killer's first choice


def confine(isolate: bool, ids: tuple[int, int] | None, lib: ctypes.CDLL,
             view: tuple[tuple[bytes, bool | None], ...] = (), memory_bytes: int | None = None,
             cgroup_procs: bytes | None = None, pid_namespace: bool = True) -> None:
    """Runs in the child between fork and exec. Every child dies with the evaluator (a SIGKILLed
    evaluator leaves no candidate spinning on its GPU). An isolated one then gets limits, network,
    a PID namespace of its own (where `pid_namespace`; `pidns`: this process stays outside as its
    shim, and what returns from here is the namespace's job), a private view of the file systems
    with a fresh /proc (`view`, `fsview.private_view`; empty: none), identity or no capabilities,
    in that order (the last gives up the privileges the others need). The evaluator has other
    threads, so nothing here may take a lock one of them could have held at the fork: no dlopen
    (`lib` was loaded before), no imports."""
    if isolate:
        if cgroup_procs is not None:  # while /sys/fs/cgroup is writable to it (the view); the shim too
            _join_cgroup(cgroup_procs)
        for limit, value in LIMITS.items():
            set_limit(limit, value)
        if memory_bytes:
            set_limit(resource.RLIMIT_AS, memory_bytes)
        _first_for_the_oom_killer()
        set_parent_death_signal(signal.SIGKILL, lib)  # the shim's, kept: it never changes identity
        namespace = _own_namespaces(view, lib, pid_namespace)
        if os.geteuid() == 0 and ids is not None:
            set_limit(resource.RLIMIT_NPROC, NPROC_LIMIT)
            uid, gid = ids
            os.setgroups([])
            os.setgid(gid)
            os.setuid(uid)
        elif view and not drop_capabilities(lib):
            os.write(2, b"kernelswarm sandbox: capabilities could not be dropped\n")
        if namespace is not None:
            pidns.start_job(namespace, lib)  # init stays; the job returns
        lib.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)  # kept across exec; orphans come back to it
    set_parent_death_signal(signal.SIGKILL, lib)  # the forking thread is `_spawner`'s (init's, in a namespace)


def _own_namespaces(view: tuple[tuple[bytes, bool | None], ...], lib: ctypes.CDLL,
                    pid_namespace: bool) -> pidns.Namespace | None:
    """Network, PID and mount namespaces of its own where this machine allows them (as root; not
    as root, inside a user namespace of its own): returns in the PID namespace's init (None: no PID
    namespace), with the private view (`view`) and its fresh /proc in place."""
    root = os.geteuid() == 0
    if root and lib.unshare(CLONE_NEWNET) != 0:
        os.write(2, b"kernelswarm sandbox: no network namespace here; network stays reachable\n")
    if not root and not (view and enter_user_namespace(lib)):
        if view:
            os.write(2, b"kernelswarm sandbox: no user namespace here; files outside its folders stay writable\n")
        return None
    namespace = pidns.enter(lib) if pid_namespace else None
    if pid_namespace and namespace is None:
        os.write(2, b"kernelswarm sandbox: no PID namespace here; it sees and may signal processes outside\n")
    if view and not private_view(view, lib, fresh_proc=namespace is not None):
        os.write(2, b"kernelswarm sandbox: no private view here; files outside its folders stay writable\n")
    return namespace


def set_limit(limit: int, value: int) -> None:
    """`value` as the child's soft and hard limit; where the evaluator itself runs under a lower
    hard limit that it may not raise (not root), that lower one: a tighter limit is kept, never a
    refusal that would end the child (its workloads then looked like the solution's RUNTIME_ERROR).
    A file size limit the evaluator itself runs under (soft) binds its children too: they write
    no file it could not write (test_evaluator_faults uses one as the stand-in for a full disk)."""
    if limit in KEEP_TIGHTER:
        soft = resource.getrlimit(limit)[0]
        if soft != resource.RLIM_INFINITY:
            value = min(value, soft)
    try:
        resource.setrlimit(limit, (value, value))
    except (ValueError, OSError):
        hard = resource.getrlimit(limit)[1]
        bound = value if hard == resource.RLIM_INFINITY else min(value, hard)
        resource.setrlimit(limit, (bound, bound))


def _join_cgroup(procs: bytes) -> None:
    """This process (and all it starts) into its memory cgroup (`memcap`), by its `cgroup.procs`."""
    if not _write(procs, b"0"):
        os.write(2, b"kernelswarm sandbox: its memory cgroup could not be joined; host memory stays unbounded\n")


def _first_for_the_oom_killer() -> None:
    """The kernel's OOM killer takes this process (and what it starts) before any other: on a GPU
    device its host memory is bounded only where the evaluator can make a cgroup (`memcap`; no
    `memory_limit` there), and a machine out of memory must lose the candidate, not the evaluator or
    a service beside it. Raising one's own score needs no privilege; before the private view, which
    makes /proc read-only."""
    if not _write(b"/proc/self/oom_score_adj", b"%d" % OOM_SCORE_ADJ):
        os.write(2, b"kernelswarm sandbox: the OOM killer's score could not be raised\n")


def _write(path: bytes, data: bytes) -> bool:
    """`data` written to the file at `path` (a kernel interface: one write, no buffering, no
    imports: it runs between fork and exec); False where it could not be."""
    try:
        fd = os.open(path, os.O_WRONLY)
        try:
            os.write(fd, data)
        finally:
            os.close(fd)
    except OSError:
        return False
    return True


def enter_user_namespace(lib: ctypes.CDLL) -> bool:
    """A user namespace of its own in which this process keeps its uid and gid (each mapped to
    itself) and, until it execs or drops them, every capability over its own new namespaces: a
    network namespace (no interface but a downed loopback) made with it, and the mount namespace
    `fsview.private_view` makes next. What an evaluator that is not root can give its candidate."""
    uid, gid = os.getuid(), os.getgid()
    # Inherited from the evaluator (`protect_self`), not dumpable would leave /proc/self/uid_map
    # to root: this process could not write its own map. Its own memory is the candidate's.
    lib.prctl(PR_SET_DUMPABLE, 1, 0, 0, 0)
    if lib.unshare(CLONE_NEWUSER | CLONE_NEWNET) != 0:
        return False
    return all(_write(name, text) for name, text in (
        (b"/proc/self/setgroups", b"deny"), (b"/proc/self/uid_map", b"%d %d 1" % (uid, uid)),
        (b"/proc/self/gid_map", b"%d %d 1" % (gid, gid))))


def drop_capabilities(lib: ctypes.CDLL) -> bool:
    """Every capability gone, for good: the bounding set emptied (no exec gives any back), no new
    privileges, effective, permitted and inheritable sets empty. The uid stays 0."""
    lib.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
    for capability in range(LAST_CAPABILITY + 1):
        lib.prctl(PR_CAPBSET_DROP, capability, 0, 0, 0)
    if CAPSET_SYSCALL is None:
        return False
    header = (ctypes.c_uint32 * 2)(CAPABILITY_VERSION_3, 0)
    data = (ctypes.c_uint32 * 6)()  # two {effective, permitted, inheritable}, all zero
    return lib.syscall(CAPSET_SYSCALL, header, data) == 0
