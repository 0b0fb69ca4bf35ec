"""Children started ahead of their attempts, so that an attempt does not wait for Python to import
torch and for the GPU's context to be created (seconds, twice per attempt).

A spare is an ordinary child (`python -m services.evaluator.harness --wait DEVICE`) with the same sandbox as one started on
demand; it only waits for its job. Each attempt takes one spare per role and uses it once; taking
one starts its replacement, which imports and creates its GPU context while the attempt runs (on
other CPU cores; the context's creation is the only GPU work it does before its own job).
"""

from __future__ import annotations

import atexit
import logging
import os
import shutil
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from services.evaluator.sandbox import memcap
from services.evaluator.protocol import READY_FILE
from services.evaluator.scratch import hand_over_reference, make_folder, sweep_folders
from services.evaluator.sandbox.fsview import SCRATCH_MOUNTS
from services.evaluator.sandbox.isolation import (
    StartedChild, memory_limit, own_pid_namespace, readable_by_others, shared_folders, start_child, unprivileged_ids,
)

log = logging.getLogger(__name__)
_UNREADABLE: set[str] = set()  # problem folders already warned about (`reference_ids`)

HOMES = {"reference": "ref", "candidate": "cand"}  # role -> the child's home inside its folder
# Roles whose child runs code the evaluator did not write: confined. The candidate writes only its
# home and outputs; `timer` (language `cuda`) runs no Python of the solution's, but does run its
# kernels; the reference (a problem's code: submitted problems are untrusted, issue 25) writes
# only its home, its input sets' folder and the timed sets' folder, as a user of its own.
CONFINED = ("candidate", "timer", "reference")
REF_INPUTS, REF_TIMED = "inputs", "timed"  # a spare reference's own folders beside its home
ALL_HOMES = {**HOMES, "timer": HOMES["candidate"]}  # every role a pool may keep a spare for
OUTPUTS = "outputs"  # the candidate's output folder inside its folder (the attempt's, once taken)
SPARE_READY_S = 120.0


@dataclass
class Spare:
    """A started child and the attempt folder it lives in: its home is `root/<home>`."""
    child: StartedChild
    root: Path

    def wait_ready(self, timeout_s: float) -> None:
        """Until the child has warmed up, died, or `timeout_s` passed (then the job waits in its pipe)."""
        deadline = time.monotonic() + timeout_s
        while (self.child.alive() and not (self.child.workdir / READY_FILE).exists()
               and time.monotonic() < deadline):
            time.sleep(0.01)


class Spares:
    """A pool of spares per role. `replace` False: a one-shot pool (`kernelswarm eval`), whose
    spares are started together (`start_ahead`) and not replaced when taken."""

    def __init__(self, device: str, scratch: str | None, fork_server: bool = True, replace: bool = True) -> None:
        self.device, self.scratch, self.fork_server, self.replace = device, scratch, fork_server, replace
        self._ready: dict[str, Spare] = {}
        self._lock = threading.Lock()
        self._starting: threading.Thread | None = None  # `start_ahead`'s, until taken or closed
        sweep_folders(self.scratch)  # what an evaluator killed before us left there
        atexit.register(self.close)

    def take(self, role: str, home: str) -> Spare:
        """A spare for `role` with its home at `root/home`: the waiting one if it is still alive,
        else one started now. Its replacement starts at once, to be warm for the next attempt."""
        self._started()
        with self._lock:
            spare = self._ready.pop(role, None)
        if spare is None or not spare.child.alive() or not (spare.root / home).is_dir():
            if spare is not None:
                discard(spare)
            spare = self._start(role, home)
        if self.replace:
            self.refill({role: home})
        return spare

    def refill(self, homes: dict[str, str]) -> None:
        """Start a spare for every role that has none waiting (`homes`: role -> home folder name)."""
        for role, home in homes.items():
            with self._lock:
                if role in self._ready:
                    continue
            spare = self._start(role, home)
            with self._lock:
                self._ready[role] = spare

    def start_ahead(self, homes: dict[str, str]) -> None:
        """`refill(homes)` in a thread of its own: the caller goes on (imports torch, reads its DB)
        while the fork server starts and forks the children; `take` and `close` wait for it."""
        self._starting = threading.Thread(target=self.refill, args=(homes,), name="spares", daemon=True)
        self._starting.start()

    def _started(self) -> None:
        starting, self._starting = self._starting, None
        if starting is not None:
            starting.join()

    def close(self) -> None:
        self._started()
        with self._lock:
            spares, self._ready = list(self._ready.values()), {}
        for spare in spares:
            discard(spare)

    def _start(self, role: str, home: str) -> Spare:
        root = make_folder(role[:3], self.scratch)
        (root / home).mkdir(mode=0o700)
        # A candidate writes its home and its outputs (the attempt's `outputs` folder, made now:
        # what it may write is fixed when it starts), nothing else (`isolation.candidate_view`); a
        # reference its home, its input sets' folder and its timed sets' (`REF_INPUTS`, `REF_TIMED`).
        reference = role == "reference"
        own = (root / home, *((root / REF_INPUTS, root / REF_TIMED) if reference else (root / OUTPUTS,)))
        for folder in own[1:]:
            folder.mkdir(mode=0o700)
        ids = unprivileged_ids(role)
        if ids is not None and reference:
            hand_over_reference(*own, ids)
        elif ids is not None:  # it starts as `nobody` in a home of its own (see children.hand_over_folders)
            root.chmod(0o711)
            os.chown(root / home, *ids)
        child = start_child(["-m", "services.evaluator.harness", "--wait", self.device], root / home,
                            root / home / "child.log", isolate=role in CONFINED, fork_server=self.fork_server,
                            memory_bytes=memory_limit(self.device), host_memory_bytes=memcap.bound_bytes(),
                            own_folders=own, shared_folders=shared_folders(self.device), ids=ids,
                            parents=not reference, pid_namespace=own_pid_namespace(self.device))
        return Spare(child, root)


def spare_sees(problem_root: Path | None, ids: tuple[int, int] | None) -> bool:
    """Whether a spare reference, started before its problem was known, can serve the problem: its
    folder not below /tmp or /dev/shm (the spare's view has empty ones of its own), and `ids`, the
    identity its reference needs (the evaluator's own where others may not read the folder), the
    spare's."""
    if problem_root is None:
        return True
    real = os.path.realpath(problem_root)
    if any(real == m or real.startswith(m.rstrip("/") + "/") for m in map(os.fsdecode, SCRATCH_MOUNTS)):
        return False
    return ids == unprivileged_ids("reference")


def spare_homes(problem_root: Path | None, timer: bool, ids: tuple[int, int] | None) -> dict[str, str]:
    """The spares an attempt takes, by role (role -> its home's name): the candidate's, the
    reference's where a spare can serve the problem (`spare_sees`; `ids`: `reference_ids`), the
    `cuda` timer's where `timer`. `kernelswarm eval` starts these together, ahead of the build."""
    homes = {role: home for role, home in HOMES.items() if role != "reference" or spare_sees(problem_root, ids)}
    if timer:
        homes["timer"] = HOMES["candidate"]
    return homes


def reference_ids(problem_root: Path | None) -> tuple[int, int] | None:
    """The reference's identity: its own user, or the evaluator's uid without capabilities where
    its problem's folder is not readable by others (a root-only home): it must read its data. The
    warning about such a folder is logged once per process."""
    ids = unprivileged_ids("reference")
    if ids is not None and problem_root is not None and not readable_by_others(problem_root):
        if str(problem_root) not in _UNREADABLE:
            _UNREADABLE.add(str(problem_root))
            log.warning("the problem folder %s is not readable by others: its reference runs as the evaluator's "
                        "uid without capabilities, not as a user of its own", problem_root)
        return None
    return ids


def discard(spare: Spare) -> None:
    spare.child.kill()
    shutil.rmtree(spare.root, ignore_errors=True)


_POOLS: dict[tuple[str, str | None, bool], Spares] = {}


def spares_for(device: str, scratch: str | None, fork_server: bool = True) -> Spares:
    """The process's pool for one device (the evaluator service keeps spares between attempts)."""
    key = (device, scratch, fork_server)
    if key not in _POOLS:
        _POOLS[key] = Spares(device, scratch, fork_server)
    return _POOLS[key]
