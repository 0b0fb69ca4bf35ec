"""Run a child process with a scrubbed environment, its own session and a hard timeout.

The child gets only what it needs (PATH, a private HOME and TMPDIR, the import path of this
package, the GPU it may use); the parent kills the whole process group when time runs out.

An untrusted child (`isolate=True`) is also confined, as far as the evaluator's privileges allow:
limits on open files, file size, processes and core dumps always, on its address space on a CPU
device (`memory_limit`), on its host memory by a cgroup of its own where the evaluator can make one
(`memcap`, on any device); it is the OOM killer's first choice on any device, and the subreaper of its
descendants (a double-forked daemon stays its child, where the guards see it). When the evaluator
runs as root: a network namespace of its own (no interface but a downed loopback), and a private
view of the file systems (`candidate_view`, `fsview.private_view`): every mount read-only but its own
folders (its home and its output folder), its attempt's folder visible read-only, /tmp and /dev/shm
empty ones of its own, so that it sees no other attempt's or spare's folder and can write no file
outside its own (on a CUDA device the entries of processes in /proc stay writable:
`SHARED_ON_CUDA`); then the identity of `nobody`, so that it can read neither the
evaluator's environment (/proc/<pid>/environ) nor files it was not given, or, where `nobody` cannot
run the interpreter (Python under a root-only home), root's uid without any capability. Where the
evaluator is not root, the candidate enters a user namespace of its own where the machine allows
one (keeping its uid): a network namespace, the same private view, then no capabilities.
Either way (root, or inside that user namespace) it also gets a PID namespace of its own (`pidns`;
on a CPU device: `own_pid_namespace` says why not on a CUDA one yet):
its /proc, mounted afresh in its view, lists only its own processes, it can signal no process
outside (the evaluator, `up`, another attempt, a service of the same uid), and when it ends,
or its evaluator dies, the kernel ends everything it started (daemons in sessions of their own
too); the process the evaluator holds (`StartedChild.process`) is the namespace's shim outside,
which ends as the child did. Its view never shows the swarm's own data (`hidden`: the home with
the DB, the local store and the logs; the DB's and the store's folders where they lie elsewhere),
even where it keeps uid 0. The
processes that start children (the evaluator, the fork server) make themselves not dumpable
(`protect_self`), so a candidate of the same user and without CAP_SYS_PTRACE cannot read their
/proc/<pid>/mem or environ. `isolation()` says what is applied on this machine.
"""

from __future__ import annotations

import functools
import logging
import os
import pwd
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from services.evaluator.sandbox import hidden, memcap
from services.evaluator.sandbox.fsview import SCRATCH_MOUNTS, encoded_view
from services.evaluator.sandbox.forkserver import CLOCK_FD, ForkServer, ServerGone
from services.evaluator.sandbox.confine import CLONE_NEWNET, confine
from services.evaluator.sandbox.pidns import CLONE_NEWPID
from shared.process import die_with_parent, libc, protect_self

PACKAGE_ROOT = Path(__file__).resolve().parents[3]
CHILD_MODULE = "services.evaluator.harness"
log = logging.getLogger(__name__)
PASS_THROUGH = ("CUDA_VISIBLE_DEVICES", "LD_LIBRARY_PATH", "CUDA_HOME", "OMP_NUM_THREADS", "LANG")
LOG_TAIL_CHARS = 8000
# On a CUDA device the entries of processes in /proc stay writable (`fsview._per_process_proc`):
# CUDA's driver writes to its own at cuInit (a read-only /proc fails it, CUDA error 304, measured on
# the H200: bench/sandbox_cuda_probe.py). Its /dev/shm is private as on a CPU (the output sets' CUDA
# IPC to the checker needs no file there, measured on the H200), so nothing it leaves there
# outlives the attempt.
SHARED_ON_CUDA = ("/proc",)
# Folders (separated by ':') an isolated candidate may write besides its own: for tests that need a
# way out of the attempt (the hack suite's drop folder), never set in a deployment.
WRITABLE_ENV = "KERNELSWARM_SANDBOX_WRITABLE"
UNPRIVILEGED_USER = "nobody"
# The reference (a problem's code: untrusted too, issue 25) runs as a user of its own, neither the
# candidate's `nobody` nor the evaluator's root: it cannot read a candidate's folders, nor a
# candidate its secret (its seed, its timed sets), nor either of them the services' environments.
# A uid no account and no process uses (no entry in /etc/passwd is needed: HOME and USER are set).
REFERENCE_UID = 65533  # the default of the setting `reference_uid` (KERNELSWARM_REFERENCE_UID)
_reference_uid = REFERENCE_UID  # this process's, set from its settings (`use_reference_uid`)
REFERENCE_USER = "kernelswarm-reference"


@dataclass(frozen=True)
class ChildRun:
    exit_code: int | None
    timed_out: bool
    elapsed_s: float
    log: str
    stalled: bool = False  # killed for making no progress (a per-step timeout), not for the total
    memory_exceeded_bytes: int | None = None  # the host-memory bound its cgroup's OOM kill enforced


def scrubbed_env(home: Path) -> dict[str, str]:
    # The import path: this package, then where the parent's own PYTHONPATH found its libraries.
    python_path = os.pathsep.join([str(PACKAGE_ROOT), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))])
    env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": str(home), "TMPDIR": str(home),
           "PYTHONPATH": python_path, "PYTHONDONTWRITEBYTECODE": "1", "PYTHONHASHSEED": "0"}
    env.update({k: os.environ[k] for k in PASS_THROUGH if k in os.environ})
    return env


def isolation() -> dict[str, bool]:
    """What confinement an untrusted child gets here: rlimits always; a private network and the
    `nobody` identity when the evaluator runs as root (the latter also needs an interpreter and
    libraries that `nobody` may read); as root, a view of every file system read-only but for its
    own folders (`read_only_root`), and, where it keeps root's uid, no capabilities; not as root, a
    user namespace of its own where the machine allows one, which gives it a private network, the
    same read-only view and no capabilities; as root where a memory cgroup can be made, a bound on
    its host memory on any device (`host_memory_cgroup`, `memcap`); as root, or inside its user
    namespace, a PID namespace of its own with a fresh /proc (`pid_namespace`, `pidns`)."""
    root = os.geteuid() == 0
    nobody = unprivileged_ids() is not None
    keeps_root = root and not nobody
    user_namespace = not root and _can_shield("user_namespace")
    return {"limits": True, "network_namespace": (root and _can_unshare_net()) or user_namespace,
            "unprivileged_user": nobody, "user_namespace": user_namespace,
            "read_only_root": (root and _can_shield("mount")) or user_namespace,
            "no_capabilities": (keeps_root and _can_shield("capabilities")) or user_namespace,
            "host_memory_cgroup": memcap.find() is not None,
            "pid_namespace": (root or user_namespace) and _can_unshare_pid()}


def candidate_view(own: tuple[Path, ...], shared: tuple[str, ...] = (), visible: tuple[Path, ...] = (),
                   parents: bool = True, hide: tuple[Path, ...] | None = None) -> tuple[tuple[str, bool | None], ...]:
    """What an isolated child sees of the scratch folders, as (folder, writable) pairs
    (`fsview.private_view`, which binds them back in this order): `shared` (on a CUDA device /proc's
    entries of processes: `SHARED_ON_CUDA`; a scratch mount named there would stay the real one,
    writable), its code where that lies in /tmp or /dev/shm (`_code_in_scratch`) and the folder
    holding its `own` (its attempt's: inputs, solution) read-only, its own (its home, its output
    folder) and those of `WRITABLE_ENV` writable; all else read-only, and /tmp and /dev/shm empty
    folders of its own (where not `shared`); `visible` folders read-only too (the reference's problem
    folder where it lies in a scratch mount); `hide` (default: the swarm's data, `hidden.hidden()`)
    not at all (None: covered, its own folders below them bound back in). Empty where this
    evaluator cannot confine its children's writes (neither root nor allowed a user namespace)."""
    if os.geteuid() != 0 and not _can_shield("user_namespace"):
        return ()
    own_paths = [os.path.realpath(p) for p in own]
    extra = [os.path.realpath(p) for p in os.environ.get(WRITABLE_ENV, "").split(":") if p]
    held = sorted({os.path.dirname(p) for p in own_paths} - set(own_paths)) if parents else []
    seen = [r for r in (os.path.realpath(p) for p in visible if os.path.isdir(p))
            if not any(o.startswith(r + os.sep) for o in own_paths)]  # never one that shows its attempt's neighbours
    mine = [*own_paths, *seen]
    covered = [p for p in dict.fromkeys(os.path.realpath(h) for h in (hidden.hidden() if hide is None else hide))
               if not any(p == m or p.startswith(m + os.sep) for m in mine)]  # never a folder of its own
    return (*((p, None) for p in covered),
            *((p, True) for p in shared if os.path.isdir(p)), *((p, False) for p in _code_in_scratch(own_paths)),
            *((p, False) for p in seen), *((p, False) for p in held), *((p, True) for p in (*own_paths, *extra)))


def _code_in_scratch(own_paths: list[str]) -> list[str]:
    """The folders of the candidate's code (this package, its import path, the interpreter's
    prefix) that lie below a scratch mount, which its private view replaces with an empty one: they
    are bound back in, read-only. Never one that holds a folder of its own (it would show the
    attempts beside it)."""
    scratch = [os.fsdecode(m) + os.sep for m in SCRATCH_MOUNTS]
    found: list[str] = []
    for path in (str(PACKAGE_ROOT), *os.environ.get("PYTHONPATH", "").split(os.pathsep), sys.prefix, sys.base_prefix):
        real = os.path.realpath(path) if path else ""
        if (os.path.isdir(real) and real not in found and any(real.startswith(m) for m in scratch)
                and not any(p.startswith(real + os.sep) for p in own_paths)):
            found.append(real)
    return found


def shared_folders(device: str) -> tuple[str, ...]:
    """The real folders a candidate on `device` keeps in its view, writable (`candidate_view`): on a
    CUDA device /proc, of which only the entries of processes stay writable."""
    return SHARED_ON_CUDA if device.startswith("cuda") else ()


def own_pid_namespace(device: str) -> bool:
    """Whether the evaluator's children on `device` (candidate, reference and checker, `cuda`
    timer) each get a PID namespace of their own: not on a CUDA device, where the candidate's
    output sets reach the checker by CUDA IPC (`harness.gpu_handover`), whose legacy handles name
    the exporting process by its pid and cannot be opened from another PID namespace. There a
    candidate runs as `nobody` (`unprivileged_ids`), which may signal no process of the evaluator's
    or the reference's uid."""
    return not device.startswith("cuda")


def unprivileged_ids(role: str = "candidate") -> tuple[int, int] | None:
    """(uid, gid) the role's child runs as (the candidate's and the `cuda` timer's `nobody`, the
    reference's `REFERENCE_UID`), or None when the evaluator cannot switch: not root, or Python
    itself or this package lies where others may not read (a root-only home directory)."""
    if os.geteuid() != 0 or not all(_world_usable(Path(p)) for p in _needed_paths()):
        return None
    if role == "reference":
        uid = reference_uid()
        return uid, uid
    user = pwd.getpwnam(UNPRIVILEGED_USER)
    return user.pw_uid, user.pw_gid


def use_reference_uid(uid: int) -> None:
    """The reference's uid from now on in this process: the setting `reference_uid`, already
    validated there (a uid of its own), given by the entry point that built the settings."""
    global _reference_uid
    if uid <= 0 or uid == pwd.getpwnam(UNPRIVILEGED_USER).pw_uid:
        raise ValueError(f"reference uid {uid}: the reference needs a uid of its own, neither root's nor "
                         f"{UNPRIVILEGED_USER}'s (the candidate's)")
    _reference_uid = uid


def reference_uid() -> int:
    """The uid set by `use_reference_uid` (the setting `reference_uid`), else `REFERENCE_UID`."""
    return _reference_uid


def readable_by_others(path: Path) -> bool:
    """Whether a user with no rights of its own (the reference's) can read `path`: every folder on
    the way enterable by others, the path readable, and, for a folder, every file below it."""
    try:
        if not _world_usable(path):
            return False
        if path.is_dir():
            for below in path.rglob("*"):
                mode = below.stat().st_mode
                if not mode & 0o004 or (below.is_dir() and not mode & 0o001):
                    return False
    except OSError:
        return False
    return True


def _needed_paths() -> list[str]:
    import torch

    return [os.path.realpath(sys.executable), os.path.dirname(os.__file__), str(PACKAGE_ROOT),
            os.path.dirname(torch.__file__)]


def _world_usable(path: Path) -> bool:
    """Every folder on the way is enterable by others, and the path itself readable."""
    for part in [path, *path.parents]:
        mode = part.stat().st_mode
        if part != path and not mode & 0o001:
            return False
    return bool(path.stat().st_mode & 0o004)


@dataclass
class StartedChild:
    """A child started ahead of its job: it imports what it needs, then waits for one line on
    stdin, the path of its job (`harness/main.py`), and only then does anything the job asks. `channel`
    is the evaluator's end of a private socket pair whose other end the child holds as descriptor
    `channel_fd` (the outer clock's, `outer_clock`)."""
    process: subprocess.Popen
    workdir: Path
    log_path: Path
    channel: socket.socket
    channel_fd: int
    cgroup: memcap.Cgroup | None = None  # its host-memory bound, where one could be made

    def alive(self) -> bool:
        return self.process.poll() is None

    def kill(self) -> None:
        kill_group(self.process)
        if self.cgroup is not None:
            self.cgroup.remove()
        self.channel.close()
        if self.process.stdin is not None and not self.process.stdin.closed:
            try:
                self.process.stdin.close()
            except OSError:
                pass  # the pipe's reader is gone


def memory_limit(device: str) -> int | None:
    """The address space an isolated child may map: on a CPU device, half of this machine's memory
    (at least 4 GiB), so that a solution allocating without end fails alone (MemoryError) instead of
    calling the kernel's OOM killer onto the evaluator. None on a GPU: its driver reserves address
    space far beyond the host's memory (there its host memory is bounded by a cgroup, `memcap`,
    where the evaluator can make one)."""
    return None if device.startswith("cuda") else memcap.bound_bytes()


def start_child(args: list[str], workdir: Path, log_path: Path, isolate: bool = False,
                fork_server: bool = True, memory_bytes: int | None = None,
                own_folders: tuple[Path, ...] = (), shared_folders: tuple[str, ...] = (),
                host_memory_bytes: int | None = None, ids: tuple[int, int] | None | str = "candidate",
                visible_folders: tuple[Path, ...] = (), parents: bool = True,
                pid_namespace: bool = True) -> StartedChild:
    """`python -m <args>` in `workdir`, stdout and stderr to `log_path`, stdin a pipe for its job.
    With `isolate`, the child is confined (see the module docstring); the folders it must write
    are the caller's to hand over (`unprivileged_ids`). The evaluator's own child
    (`-m services.evaluator.harness`) is forked by this process's fork server, with torch already
    imported (unless `fork_server` is False: KERNELSWARM_FORK_SERVER); where that server cannot run,
    and for anything else, the child is a new interpreter. Either way it inherits one end of a
    private socket pair (`StartedChild.channel`). `memory_bytes`: the isolated child's address space
    (`memory_limit`). `own_folders`: the only folders the isolated child may write (default: its
    `workdir`), all else read-only to it where this machine allows (`candidate_view`), but
    `shared_folders` (`SHARED_ON_CUDA`). `host_memory_bytes`: the isolated child's host memory, by
    a cgroup of its own where this evaluator can make one (`memcap`; on any device). `ids`: the
    identity the isolated child takes, a role's (`unprivileged_ids(role)`, "candidate" by default)
    or given (None: the evaluator's own uid, without capabilities where it is root).
    `visible_folders`: folders below a scratch mount it may read (its view shows them read-only);
    `parents`: whether it sees the folders that hold its own (the candidate's attempt folder);
    `pid_namespace`: whether the isolated child gets a PID namespace of its own (`own_pid_namespace`)."""
    cgroup = memcap.new(host_memory_bytes) if isolate and host_memory_bytes else None  # or EvaluatorFault
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        process, channel_fd = _start(args, workdir, log_path, isolate, fork_server, theirs.fileno(),
                                     memory_bytes if isolate else None, own_folders, shared_folders,
                                     cgroup.procs if cgroup is not None else None,
                                     unprivileged_ids(ids) if isinstance(ids, str) else ids, visible_folders, parents,
                                     pid_namespace)
        return StartedChild(process, workdir, log_path, ours, channel_fd, cgroup)
    except BaseException:
        ours.close()
        if cgroup is not None:
            cgroup.remove(0)
        raise
    finally:
        theirs.close()


def _start(args: list[str], workdir: Path, log_path: Path, isolate: bool, fork_server: bool,
           channel: int, memory_bytes: int | None = None, own_folders: tuple[Path, ...] = (),
           shared_folders: tuple[str, ...] = (), cgroup_procs: bytes | None = None,
           ids: tuple[int, int] | None = None, visible_folders: tuple[Path, ...] = (),
           parents: bool = True, pid_namespace: bool = True) -> tuple[subprocess.Popen, int]:
    """The child's process and the number of its channel's descriptor."""
    protect_self()
    ids = ids if isolate else None
    view = candidate_view(own_folders or (workdir,), shared_folders, visible_folders, parents) if isolate else ()
    env = scrubbed_env(workdir)
    if ids is not None and ids[0] == reference_uid():  # no account of its own: who it is, for getpass
        env.update(USER=REFERENCE_USER, LOGNAME=REFERENCE_USER)
    if fork_server and args[:2] == ["-m", CHILD_MODULE]:
        try:
            server = ForkServer.get(scrubbed_env(Path(tempfile.gettempdir())), _start_server)
            forked = server.start(args[2:], workdir, log_path, env, isolate, ids, channel, view,
                                  memory_bytes, cgroup_procs, pid_namespace)
            return forked, CLOCK_FD
        except ServerGone:
            log.exception("no fork server: starting the child as a new interpreter")
    # Decided before the fork, per call (attempts may start children from several threads at once):
    # between fork and exec the hook only calls what was resolved here.
    confine_child = functools.partial(confine, isolate, ids, libc(), encoded_view(view), memory_bytes, cgroup_procs,
                                      pid_namespace)

    def spawn() -> subprocess.Popen:
        with open(log_path, "wb") as log_file:
            return subprocess.Popen([sys.executable, *args], cwd=workdir, env=env,
                                    stdin=subprocess.PIPE, stdout=log_file, stderr=subprocess.STDOUT,
                                    start_new_session=True, preexec_fn=confine_child, pass_fds=(channel,))

    return _spawner().submit(spawn).result(), channel  # pass_fds keeps its number


@dataclass(frozen=True)
class ProgramRun:
    """What `run_confined` saw: the program's exit code (None: stopped at its timeout), its output
    (stdout and stderr together, the first `PROGRAM_OUTPUT_BYTES`), its wall time."""
    exit_code: int | None
    output: str
    seconds: float

    @property
    def timed_out(self) -> bool:
        return self.exit_code is None


PROGRAM_OUTPUT_BYTES = 1 << 20


def run_confined(command: list[str], workdir: Path, timeout_s: float, env: dict[str, str] | None = None,
                 visible: tuple[Path, ...] = ()) -> ProgramRun:
    """Run an arbitrary program (a compiler, a disassembler, a build's interpreter) on untrusted
    input, confined as a candidate is (`confine`): rlimits, the OOM killer's first choice, a memory
    cgroup where one can be made, a network namespace, a private view in which only `workdir` is
    writable and none of the scratch folders beside it is seen (`visible`: folders below a scratch
    mount it may read), the candidate's identity (`nobody`) or, where it cannot take it, no
    capabilities; a scrubbed environment (`scrubbed_env`, HOME and TMPDIR its `workdir`) with `env`
    over it; its own session, whose process group (and cgroup) is killed when it ends or at
    `timeout_s`. `workdir` (and what lies in it) becomes the identity's own."""
    ids = unprivileged_ids()
    _hand_over(workdir, ids)
    view = encoded_view(candidate_view((workdir,), (), visible, parents=False))
    cgroup = memcap.new(memcap.bound_bytes())  # or EvaluatorFault
    hook = functools.partial(confine, True, ids, libc(), view, None, cgroup.procs if cgroup is not None else None)
    started = time.monotonic()
    with tempfile.TemporaryFile() as out:
        process = _spawner().submit(lambda: subprocess.Popen(
            command, cwd=workdir, env={**scrubbed_env(workdir), **(env or {})}, stdin=subprocess.DEVNULL,
            stdout=out, stderr=subprocess.STDOUT, start_new_session=True, preexec_fn=hook)).result()
        try:
            code: int | None = process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            code = None
        finally:
            kill_group(process)
            if cgroup is not None:
                cgroup.remove()
        out.seek(0)
        text = out.read(PROGRAM_OUTPUT_BYTES).decode(errors="replace")
    return ProgramRun(code, text, time.monotonic() - started)


def _hand_over(workdir: Path, ids: tuple[int, int] | None) -> None:
    """`workdir` and what lies in it made `ids`' own, the folder above it enterable (where the
    confined program takes an identity of its own)."""
    if ids is None:
        return
    workdir.parent.chmod(workdir.parent.stat().st_mode | 0o111)
    for path in (workdir, *workdir.rglob("*")):
        os.chown(path, *ids, follow_symlinks=False)


def _start_server(argv: list[str], env: dict[str, str], control_fd: int) -> subprocess.Popen:
    """The fork server, from the spawner thread: it dies with this process, and its children with it."""
    return _spawner().submit(lambda: subprocess.Popen(
        argv, env=env, cwd=tempfile.gettempdir(), pass_fds=(control_fd,), stdin=subprocess.DEVNULL,
        start_new_session=True, preexec_fn=die_with_parent(signal.SIGKILL))).result()


_SPAWNERS: dict[int, ThreadPoolExecutor] = {}


def _spawner() -> ThreadPoolExecutor:
    """The one thread of this process that starts children. A child's parent-death signal fires
    when the thread that forked it ends, and the thread of an attempt may end before its spares do;
    this one lasts as long as the process. Keyed by pid: a forked evaluator needs its own."""
    pid = os.getpid()
    if pid not in _SPAWNERS:
        _SPAWNERS[pid] = ThreadPoolExecutor(max_workers=1, thread_name_prefix="sandbox-spawner")
    return _SPAWNERS[pid]


def finish_child(child: StartedChild, job: str, timeout_s: float, progress: Path | None = None,
                 stall_s: float | None = None, until: threading.Event | None = None) -> ChildRun:
    """Hand `child` its job line and wait for it: killed, with its process group, after `timeout_s`,
    or after `stall_s` without `progress` (a file the child rewrites after each step) changing.
    Where `until` is set first (the reference became the checker), the child is left running:
    the returned exit code is None and its caller kills it later (`StartedChild.kill`)."""
    started = time.monotonic()
    try:
        child.process.stdin.write(job.encode() + b"\n")
        child.process.stdin.close()
    except (BrokenPipeError, OSError):
        pass  # it died while waiting: its exit code and log say why
    timed_out = stalled = kept = False
    deadline, last_change, last_seen = started + timeout_s, started, _mtime(progress)
    poll_s = 0.25 if stall_s is not None else None
    try:
        while True:
            now = time.monotonic()
            if stall_s is not None:
                seen = _mtime(progress)
                if seen != last_seen:
                    last_change, last_seen = now, seen
                stalled = now - last_change > stall_s
            if stalled or now >= deadline:
                timed_out = True
                break
            wait_s = deadline - now if poll_s is None else min(deadline - now, poll_s)
            if until is not None:
                if until.wait(min(wait_s, 0.02)):
                    kept = child.process.poll() is None
                    break
                if child.process.poll() is not None:
                    break
                continue
            try:
                child.process.wait(timeout=wait_s)
                break
            except subprocess.TimeoutExpired:
                continue
    finally:
        if not kept:
            kill_group(child.process)
    exceeded = None
    if not kept and child.cgroup is not None:
        exceeded = child.cgroup.limit_bytes if child.cgroup.oom_killed() else None
        child.cgroup.remove()
    return ChildRun(child.process.returncode, timed_out, time.monotonic() - started, _tail(child.log_path), stalled,
                    exceeded)


def _mtime(path: Path | None) -> int | None:
    try:
        return path.stat().st_mtime_ns if path is not None else None
    except OSError:
        return None


def kill_group(process: subprocess.Popen) -> None:
    """Kill the child and anything it started; reap it."""
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    process.wait()


def _tail(path: Path) -> str:
    data = path.read_bytes()[-LOG_TAIL_CHARS:]
    return data.decode(errors="replace")


@functools.cache
def _can_shield(part: str) -> bool:
    """Whether a child here can mount read-only in a namespace of its own (`part` "mount":
    containers without CAP_SYS_ADMIN cannot), drop its capabilities ("capabilities"), or, not
    being root, do both inside a user namespace of its own ("user_namespace": kernels or security
    modules may forbid those to unprivileged users): tried in a child, on a folder of its own."""
    with tempfile.TemporaryDirectory() as folder:
        own, other = os.path.join(folder, "own"), os.path.join(folder, "other")
        os.mkdir(own)
        os.mkdir(other)
        view = ((folder.encode(), False), (own.encode(), True))
        read_only = (f"private_view({view!r}, lib) and os.access({own!r}, os.W_OK) "
                     f"and not os.access({other!r}, os.W_OK)")
        test = {"mount": read_only, "capabilities": "drop_capabilities(lib)",
                "user_namespace": f"enter_user_namespace(lib) and {read_only} and drop_capabilities(lib)"}[part]
        code = (f"import ctypes, os, sys; sys.path.insert(0, {str(PACKAGE_ROOT)!r}); "
                "from services.evaluator.sandbox.fsview import private_view; "
                "from services.evaluator.sandbox.confine import drop_capabilities, enter_user_namespace; "
                f"lib = ctypes.CDLL(None, use_errno=True); sys.exit(0 if {test} else 1)")
        try:
            return subprocess.run([sys.executable, "-c", code], capture_output=True).returncode == 0
        except OSError:  # this user cannot run the interpreter at all
            return False


@functools.cache
def _can_unshare_pid() -> bool:
    """Whether a child here gets a PID namespace of its own (inside a user namespace where the
    evaluator is not root): its first child there is pid 1."""
    enter = "" if os.geteuid() == 0 else "enter_user_namespace(lib); "
    code = (f"import ctypes, os, sys; sys.path.insert(0, {str(PACKAGE_ROOT)!r}); "
            "from services.evaluator.sandbox.confine import enter_user_namespace; "
            f"lib = ctypes.CDLL(None, use_errno=True); {enter}"
            f"lib.unshare({CLONE_NEWPID}) == 0 or sys.exit(1); pid = os.fork(); "
            "os._exit(os.getpid() != 1) if pid == 0 else sys.exit(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]))")
    try:
        return subprocess.run([sys.executable, "-c", code], capture_output=True).returncode == 0
    except OSError:
        return False


def _can_unshare_net() -> bool:
    """Whether this machine lets a root process make a network namespace (containers may not)."""
    probe = subprocess.run([sys.executable, "-c", "import ctypes,sys; "
                            f"sys.exit(ctypes.CDLL(None).unshare({CLONE_NEWNET}) != 0)"], capture_output=True)
    return probe.returncode == 0
