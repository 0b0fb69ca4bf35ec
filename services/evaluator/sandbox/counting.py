"""The sandbox T_sol's counting child runs in (`shared.sol_bounded.CountRunner`).

Counting the work of a workload runs its problem's reference, untrusted text (a submitted
problem's), so `python -m shared.sol_child` gets what a candidate gets (`isolation.start_child`
with `isolate`): a network namespace of its own, a read-only view of the file systems in which it
writes only a scratch folder of its own (its home and TMPDIR; its /tmp and /dev/shm empty ones of
its own), the problems' folders bound in read-only, the reference's identity (`unprivileged_ids`)
or, where that cannot read the interpreter or a problem's folder, the evaluator's uid without any
capability, a scrubbed environment, rlimits, its address space and a memory cgroup of the count's
limit. It writes its results to its end of a private socket pair, never to a pipe a process it
leaves behind could hold open. When it is done, killed or dead, everything it started dies with it:
its process group, its cgroup (`memcap`) and, where neither reaches (a daemon in a session of its
own, no cgroup here), every descendant (it is their subreaper: an orphan stays below it), stopped
first so that none forks past the kill. `kernelswarm sol`, `kernelswarm up`'s size check,
`bench/sol_vs_solar.py` and the evaluator's scoring all count through `SandboxRunner`.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import subprocess
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from services.evaluator.sandbox.isolation import StartedChild, readable_by_others, start_child, unprivileged_ids
from shared.sol_bounded import CHILD_MODULE

log = logging.getLogger(__name__)
LOG_TAIL_BYTES = 8000
KILL_ROUNDS = 20  # stop-and-kill passes over its descendants, each until no new one appears


class SandboxRunner:
    """Starts the counting child confined (see the module docstring)."""

    def start(self, request: dict[str, Any], problem_roots: Sequence[Path], memory_mb: int) -> SandboxedCount:
        folder = Path(tempfile.mkdtemp(prefix="ks-sol-"))
        try:
            scratch = folder / "scratch"
            scratch.mkdir(mode=0o700)
            ids = counting_ids(problem_roots)
            if ids is not None:
                folder.chmod(0o711)
                os.chown(scratch, *ids)
            limit = memory_mb << 20 if memory_mb > 0 else None
            child = start_child(["-m", CHILD_MODULE], scratch, folder / "child.log", isolate=True, fork_server=False,
                                memory_bytes=limit, own_folders=(scratch,), host_memory_bytes=limit, ids=ids,
                                visible_folders=tuple(problem_roots), parents=False)
        except BaseException:
            shutil.rmtree(folder, ignore_errors=True)
            raise
        count = SandboxedCount(child, folder)
        try:
            child.process.stdin.write(json_line(request | {"results_fd": child.channel_fd}))
            child.process.stdin.close()
        except (BrokenPipeError, OSError):
            pass  # it died before it read its request: its exit code and log say why
        return count


def counting_ids(problem_roots: Sequence[Path]) -> tuple[int, int] | None:
    """The counting child's identity: the reference's own user where it can read every problem's
    folder, else the evaluator's uid (without capabilities: `confine`)."""
    ids = unprivileged_ids("reference")
    if ids is not None and not all(readable_by_others(Path(root)) for root in problem_roots):
        log.warning("a problem folder among %s is not readable by others: the count runs as the evaluator's uid "
                    "without capabilities", [str(r) for r in problem_roots])
        return None
    return ids


def json_line(request: dict[str, Any]) -> bytes:
    return json.dumps(request).encode() + b"\n"


class SandboxedCount:
    """A started counting child (`shared.sol_bounded.CountChild`)."""

    def __init__(self, child: StartedChild, folder: Path) -> None:
        self._child, self._folder = child, folder
        self.results_fd = child.channel.fileno()
        self._code: int | None = None
        self._stopped = False
        self._tail = ""

    def exit_code(self) -> int | None:
        return self._child.process.poll()

    def stop(self, wait_s: float) -> int | None:
        if self._stopped:
            return self._code
        self._stopped = True
        try:
            self._code = self._child.process.wait(timeout=wait_s) if wait_s > 0 else self._child.process.poll()
        except subprocess.TimeoutExpired:
            pass
        if self._child.process.poll() is None:  # not reaped: its pid is still its own
            kill_tree(self._child.process.pid)
        self._child.kill()  # its process group, reaped; its cgroup with whatever is left in it
        if self._code is None:
            self._code = self._child.process.returncode
        self._tail = _tail(self._folder / "child.log")
        shutil.rmtree(self._folder, ignore_errors=True)
        return self._code

    def log_tail(self) -> str:
        return self._tail if self._stopped else _tail(self._folder / "child.log")


def kill_tree(pid: int) -> None:
    """SIGKILL to `pid` and every process below it, each stopped first (SIGSTOP), pass after pass
    until a pass finds none it had not stopped: none forks past the kill. The counting child is the
    subreaper of what it starts, so a double-forked daemon is still below it while it lives."""
    _signal(pid, signal.SIGSTOP)
    stopped: set[int] = {pid}
    for _ in range(KILL_ROUNDS):
        found = [p for p in _descendants(pid) if p not in stopped]
        if not found:
            break
        for victim in found:
            _signal(victim, signal.SIGSTOP)
        stopped.update(found)
    for victim in stopped:
        _signal(victim, signal.SIGKILL)


def _descendants(root: int) -> list[int]:
    """The processes below `root` (its children, theirs, ...), from /proc."""
    children: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as stat:
                fields = stat.read().rsplit(b")", 1)[1].split()
        except (OSError, IndexError):
            continue  # gone meanwhile
        children.setdefault(int(fields[1]), []).append(int(name))
    found, todo = [], [root]
    while todo:
        below = children.get(todo.pop(), [])
        found.extend(below)
        todo.extend(below)
    return found


def _signal(pid: int, number: int) -> None:
    try:
        os.kill(pid, number)
    except (ProcessLookupError, PermissionError):
        pass


def _tail(path: Path) -> str:
    try:
        with open(path, "rb") as log_file:
            log_file.seek(max(0, os.path.getsize(path) - LOG_TAIL_BYTES))
            return log_file.read().decode(errors="replace")
    except OSError:
        return ""
