"""A bound on an isolated child's host memory: a memory cgroup of its own (`isolation.start_child`).

`RLIMIT_AS` bounds a CPU candidate's address space, but a GPU's driver reserves address space far
beyond the host's memory, so there only a cgroup can bound what a candidate holds. Where this
evaluator may make one (root, with the memory controller in cgroup v2's unified hierarchy, enabled
below its own cgroup or enabled there by it, or in v1's memory hierarchy), every isolated child
gets a cgroup of its own beside the evaluator's processes: a memory bound, no swap beyond it, and
on v2 the whole group killed together. Where v2 forbids it below the evaluator's own cgroup (a
cgroup with processes of its own cannot hand controllers to children unless it is the root, as in
a container whose processes share one leaf), the child's cgroup is made below the nearest ancestor
that already hands the memory controller down, and its bound is also kept under every `memory.max`
it leaves behind on the way, so it gets no more than the evaluator's own cgroup allows. There a
kill of the evaluator's cgroup (a supervisor stopping it) misses the child's: the child dies with
its parent all the same (its parent-death signal), and what it left is killed by the next
evaluator's `sweep`. The child moves itself in between fork and exec (`confine.confine` writes
`cgroup.procs`), before it gives up its privileges. Its kills by the kernel's OOM killer are
counted in the cgroup, read back (`Cgroup.oom_killed`) before the cgroup is removed, and whatever
is still in it is killed first, a daemon that left the child's process group included. Where none
can be made (a container without a writable hierarchy, no root), nothing is bound but the OOM
score (`confine._first_for_the_oom_killer`)."""

from __future__ import annotations

import functools
import itertools
import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path

from shared.errors import EvaluatorFault

PREFIX = "ks-cand-"  # then the evaluator's pid namespace, its pid and a counter: ks-cand-<ns>-<pid>-<n>
_COUNTER = itertools.count()


@dataclass(frozen=True)
class Hierarchy:
    version: int  # 1 or 2
    base: Path  # where the children's cgroups are made: the evaluator's own cgroup or an ancestor
    ceiling: int | None = None  # the lowest `memory.max` between the evaluator's cgroup and `base`

    def limit_files(self) -> tuple[str, ...]:
        return ("memory.max", "memory.swap.max") if self.version == 2 else \
            ("memory.limit_in_bytes", "memory.memsw.limit_in_bytes")


@dataclass(frozen=True)
class Cgroup:
    path: Path
    version: int
    limit_bytes: int

    @property
    def procs(self) -> bytes:
        """The file the child writes "0" into to move itself in (`confine.confine`)."""
        return os.fsencode(self.path / "cgroup.procs")

    def oom_killed(self) -> bool:
        """Whether the kernel killed a process of this cgroup for going over its bound."""
        name = "memory.events" if self.version == 2 else "memory.oom_control"
        try:
            fields = dict(line.split() for line in (self.path / name).read_text().splitlines() if " " in line)
        except OSError:
            return False
        return int(fields.get("oom_kill", "0")) > 0

    def kill_all(self) -> None:
        """SIGKILL to every process left in it: those that left the child's process group too (a
        daemon in a session of its own)."""
        try:
            if self.version == 2 and (self.path / "cgroup.kill").exists():  # Linux 5.14
                (self.path / "cgroup.kill").write_text("1")
                return
            pids = (self.path / "cgroup.procs").read_text().split()
        except OSError:
            return
        for pid in pids:
            try:
                os.kill(int(pid), signal.SIGKILL)
            except ProcessLookupError:
                pass

    def remove(self, wait_s: float = 1.0) -> None:
        """Every process left in it killed, then removed once empty (the kernel frees a killed
        process's membership shortly after its death); left for `sweep` where it is not empty by then."""
        self.kill_all()
        deadline = time.monotonic() + wait_s
        while True:
            try:
                self.path.rmdir()
                return
            except FileNotFoundError:
                return
            except OSError:
                if time.monotonic() >= deadline:
                    return
                time.sleep(0.01)


def bound_bytes() -> int:
    """An isolated child's host-memory bound: half of this machine's memory, at least 4 GiB (on a
    CPU device its address space too: `isolation.memory_limit`)."""
    try:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):
        return 4 << 30
    return max(4 << 30, total // 2)


def new(limit_bytes: int) -> Cgroup | None:
    """A cgroup bounded to `limit_bytes` for one isolated child, or None where this machine has no
    hierarchy the evaluator may make them in (`find`). Where it has one and refuses this cgroup
    (too many cgroups, a controller gone, a full or read-only cgroup file system), the child is not
    started unbounded: `EvaluatorFault`, retried later, never a verdict."""
    hierarchy = find()
    if hierarchy is None:
        return None
    if hierarchy.ceiling is not None:
        limit_bytes = min(limit_bytes, hierarchy.ceiling)
    path = hierarchy.base / f"{PREFIX}{_pid_namespace()}-{os.getpid()}-{next(_COUNTER)}"
    try:
        path.mkdir()
    except OSError as error:
        raise EvaluatorFault(f"the memory cgroup of a sandboxed child could not be made in {hierarchy.base}: "
                             f"{error}") from error
    group = Cgroup(path, hierarchy.version, limit_bytes)
    main, swap = hierarchy.limit_files()
    values = [(main, str(limit_bytes)), (swap, "0" if hierarchy.version == 2 else str(limit_bytes))]
    if hierarchy.version == 2:
        values.append(("memory.oom.group", "1"))
    try:
        for name, value in values:
            if name == main or (path / name).exists():  # no swap files where the kernel counts no swap
                (path / name).write_text(value)
    except OSError as error:
        group.remove(0)
        raise EvaluatorFault(f"the memory cgroup {path} refused its limit: {error}") from error
    return group


@functools.cache
def find() -> Hierarchy | None:
    """Where this evaluator can make memory cgroups: its own cgroup in v2's unified hierarchy (the
    memory controller enabled for its children, by this call where the kernel allows it), else in
    v1's memory hierarchy; None where it cannot (not root, no such hierarchy, no permission). Stale
    cgroups of evaluators that died are removed (`sweep`)."""
    if os.geteuid() != 0:
        return None
    mounts = _cgroup_mounts()
    own = _own_cgroups()
    found = None
    if "2" in mounts and "" in own:
        found = _unified(mounts["2"], mounts["2"] / own[""].lstrip("/"))
    if found is None and "memory" in mounts and "memory" in own:
        base = mounts["memory"] / own["memory"].lstrip("/")
        if (base / "memory.limit_in_bytes").exists() and os.access(base, os.W_OK):
            found = Hierarchy(1, base)
    if found is not None:
        sweep(found.base)
    return found


def sweep(base: Path) -> None:
    """Remove the cgroups that evaluators which are gone left here (killed before cleaning up): only
    those of this pid namespace, whose pids this evaluator can tell alive or dead; an evaluator in
    another container may share an ancestor."""
    for path in base.glob(f"{PREFIX}{_pid_namespace()}-*"):
        pid = path.name[len(PREFIX):].split("-")[1]
        if pid.isdigit() and not Path(f"/proc/{pid}").exists():
            Cgroup(path, 0, 0).remove(0)


def _unified(mount: Path, own: Path) -> Hierarchy | None:
    """In v2: below the evaluator's own cgroup where it hands (or can be made to hand) the memory
    controller to children; else below the nearest ancestor within the mount that already does, its
    children's bound kept under the `memory.max` of each cgroup in between."""
    if not own.is_dir() or not own.is_relative_to(mount):
        return None
    if _memory_for_children(own):
        return Hierarchy(2, own)
    ceiling = None
    below = own
    while below != mount:
        ceiling = _lower(ceiling, _memory_max(below))
        parent = below.parent
        if _hands_down_memory(parent) and os.access(parent, os.W_OK):
            return Hierarchy(2, parent, ceiling)
        below = parent
    return None


def _hands_down_memory(path: Path) -> bool:
    try:
        return "memory" in (path / "cgroup.subtree_control").read_text().split()
    except OSError:
        return False


def _memory_max(path: Path) -> int | None:
    try:
        value = (path / "memory.max").read_text().strip()
    except OSError:
        return None
    return int(value) if value.isdigit() else None


def _lower(a: int | None, b: int | None) -> int | None:
    return b if a is None else a if b is None else min(a, b)


@functools.cache
def _pid_namespace() -> str:
    """This process's pid namespace's inode: evaluators of different containers may share an ancestor
    cgroup, and only pids of one's own namespace can be told alive or dead."""
    try:
        return str(os.stat("/proc/self/ns/pid").st_ino)
    except OSError:
        return "0"


def _memory_for_children(base: Path) -> bool:
    if _hands_down_memory(base):
        return True
    try:
        if "memory" not in (base / "cgroup.controllers").read_text().split():
            return False
        (base / "cgroup.subtree_control").write_text("+memory")  # refused where processes live below a
        return True                                              # cgroup that is not the root one
    except OSError:
        return False


def _cgroup_mounts() -> dict[str, Path]:
    """"2" -> the unified hierarchy's mount point, "memory" -> v1's memory hierarchy's."""
    mounts: dict[str, Path] = {}
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        before, _, after = line.partition(" - ")
        fields, rest = before.split(), after.split()
        if len(fields) < 5 or len(rest) < 3:
            continue
        if rest[0] == "cgroup2":
            mounts.setdefault("2", Path(fields[4]))
        elif rest[0] == "cgroup" and "memory" in rest[2].split(","):
            mounts.setdefault("memory", Path(fields[4]))
    return mounts


def _own_cgroups() -> dict[str, str]:
    """This process's cgroups: "" -> its v2 path, "memory" -> its v1 memory path."""
    own: dict[str, str] = {}
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        for name in controllers.split(",") if controllers else [""]:
            own[name] = path
    return own
