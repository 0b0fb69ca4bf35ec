"""Attempt folders, and the sweep that removes the ones a killed evaluator left behind.

Each attempt and each spare child gets a folder `ks-<role>-XXXX` under the scratch root (/dev/shm
where it has room): input sets, expected and produced outputs, gigabytes for large workloads. The
evaluator removes it when the attempt ends; an evaluator killed with SIGKILL (the OOM killer, a
restart, a fault test) never gets to, and a host that runs for weeks would fill its /dev/shm. So
every folder holds `.owner`: the pid of the process that made it, that process's start time (so a
reused pid does not count) and its pid namespace (so pids from another container sharing the folder
are never judged). `sweep_folders` removes the folders whose owner, in our namespace, is gone, and folders
without an owner file that are older than `UNOWNED_MAX_AGE_S` (made before owner files existed, or
by a process killed between making the folder and writing the file). It runs when an evaluator makes
a pool of spares and when it makes an attempt folder without one.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from shared.process import start_time

PREFIX = "ks-"
ROLES = ("att", "can", "ref")  # attempt folders, and the candidate's and reference's spare folders
OWNER = ".owner"
UNOWNED_MAX_AGE_S = 24 * 3600.0


def make_folder(role: str, scratch: str | None) -> Path:
    """A new folder `ks-<role>-XXXX` under `scratch` (the system's temp dir when None), owned by us."""
    root = Path(tempfile.mkdtemp(prefix=f"{PREFIX}{role}-", dir=scratch))
    (root / OWNER).write_text(identity(os.getpid()) or "")
    return root


def identity(pid: int) -> str | None:
    """`pid start-time pid-namespace` of a live process, None when there is none."""
    started = start_time(pid)
    if started is None:
        return None
    return f"{pid} {started} {_namespace(pid)}"


def sweep_folders(scratch: str | None, now: float | None = None) -> list[Path]:
    """Remove the `ks-*` folders under `scratch` whose owner is gone; return them."""
    base = Path(scratch if scratch is not None else tempfile.gettempdir())
    now = time.time() if now is None else now
    own_namespace = _namespace(os.getpid())
    removed = []
    try:
        entries = list(base.iterdir())
    except OSError:
        return removed
    for folder in entries:
        if not folder.name.startswith(tuple(PREFIX + role for role in ROLES)) or folder.is_symlink() \
                or not folder.is_dir():
            continue
        try:
            owner = (folder / OWNER).read_text().split()
        except OSError:
            owner = None
        if owner is None or len(owner) != 3:
            try:
                stale = now - folder.stat().st_mtime > UNOWNED_MAX_AGE_S
            except OSError:
                continue
        else:
            pid, started, namespace = owner
            if namespace != own_namespace:
                continue  # another container's pids: not ours to judge
            # Our namespace's pid: alive while it has the start time recorded. Not its whole
            # identity: another evaluator of this user is not dumpable (`protect_self`), so its
            # /proc/<pid>/ns cannot be read, and its live folders would look stale.
            stale = pid.isdigit() and started.isdigit() and start_time(int(pid)) != int(started)
        if stale:
            shutil.rmtree(folder, ignore_errors=True)
            removed.append(folder)
    return removed


def _namespace(pid: int) -> str:
    try:
        return os.readlink(f"/proc/{pid}/ns/pid").replace(" ", "_")
    except OSError:
        return "-"


def hidden_timed_folder(attempt: Path) -> Path:
    """A folder of its own beside the attempt folder `attempt` (`ks-ref-XXXX`, swept like a spare
    reference's), for the timed sets' files of an attempt whose reference has no spare folder.
    Not inside `attempt`: a candidate's view shows the folder that holds its own (its attempt's,
    read-only), and one that keeps the evaluator's uid 0 without capabilities reads a 0700 folder
    of root's by its owner bits. Its private /tmp and /dev/shm show it nothing beside its attempt
    (`fsview.private_view`), whoever it runs as; the checker that writes re-timed sets here is not
    dumpable (`checker.serve`): its /proc entries do not lead here either. On the same file system
    as the inputs folder, into which the files are moved (renamed) at the outer clock's `go`."""
    return make_folder("ref", str(attempt.parent))


def hand_over_reference(home: Path, inputs: Path, timed: Path, ids: tuple[int, int] | None) -> None:
    """Before the reference's child starts as a user of its own (`ids`): the folders it writes
    (its home, where its input sets go, the timed sets' folder) become its own, 0700; the folders
    above them enterable, not listable. The evaluator (root) links, moves and opens what it needs
    of them later."""
    if ids is None:
        return
    for parent in {home.parent, timed.parent}:
        parent.chmod(0o711)
    for folder in (home, inputs, timed):
        folder.chmod(0o700)
        for path in (folder, *folder.rglob("*")):
            os.chown(path, *ids)


def scratch_root(config: Any) -> str | None:
    """Expected and output sets (and the input sets not made again in the candidate) go through
    files: prefer memory-backed /dev/shm when it has room. `config`: an `EvalConfig` (not imported:
    the config imports the spares, which import this module)."""
    if config.scratch_dir is not None:
        config.scratch_dir.mkdir(parents=True, exist_ok=True)
        return str(config.scratch_dir)
    shm = Path("/dev/shm")
    if shm.is_dir() and shutil.disk_usage(shm).free > 2 << 30:
        return str(shm)
    return None
