"""Helpers for the sandbox's attack tests (rows M1 and M2 of issue 40): a swarm home outside /tmp
with a DB, a store and logs holding a secret, a sleeper the test starts as the evaluator's own uid,
and the probes a solution or a problem's reference runs on its first call, reporting what it could
do in a JSON file in a drop folder (`KERNELSWARM_SANDBOX_WRITABLE`), read by the test after the
attempt."""

from __future__ import annotations

import json
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

SECRET = "ks-swarm-secret-4be1"

# Run once, on the first real call (never in a process that only counts its work: T_sol's
# counting child imports no harness), by a candidate or a reference. Fills `report` and writes it.
PROBES = '''
import json, os, signal, sys, time

_DONE = []


def _probe_signals(report):
    child = os.fork()  # the control: a process of its own it may kill
    if child == 0:
        time.sleep(60)
        os._exit(0)
    os.kill(child, signal.SIGKILL)
    report["own_child_killed"] = os.waitpid(child, 0)[1] == signal.SIGKILL
    report["signalled"] = []
    parent = os.getppid()  # the fork server, or the evaluator (SIGURG: the test counts it, and lives on)
    for pid, sig in ((@SLEEPER@, signal.SIGKILL), (@EVALUATOR@, signal.SIGURG),
                     (parent, signal.SIGURG if parent == @EVALUATOR@ else signal.SIGKILL)):
        if pid > 1:
            try:
                os.kill(pid, sig)
                report["signalled"].append(pid)
            except OSError:
                pass


def _probe_proc(report):
    report["my_pid"] = os.getpid()
    report["proc"] = sorted(int(p) for p in os.listdir("/proc") if p.isdigit())


def _probe_data(report):
    found = []
    for path in ("@HOME@/kernelswarm.db", "@HOME@/logs/evaluator.log", "@HOME@/store/ab/object"):
        try:
            with open(path, "rb") as handle:
                found.append(handle.read().decode(errors="replace"))
        except OSError:
            pass
    for folder in ("@HOME@", "@HOME@/store"):
        try:
            found += os.listdir(folder)
        except OSError:
            pass
    report["read"] = found
    with open("own.txt", "w") as handle:  # the control: its own folder stays its own
        handle.write("mine")
    with open("own.txt") as handle:
        report["own_readable"] = handle.read() == "mine"


def _probe_daemon(report):
    import fcntl
    pid = os.fork()
    if pid == 0:
        os.setsid()
        if os.fork() == 0:
            lock = os.open("@DROP@/daemon.lock", os.O_RDWR | os.O_CREAT, 0o666)
            fcntl.flock(lock, fcntl.LOCK_EX)
            open("@DROP@/daemon.ready", "w").close()
            time.sleep(600)
        os._exit(0)
    os.waitpid(pid, 0)
    for _ in range(1000):
        if os.path.exists("@DROP@/daemon.ready"):
            break
        time.sleep(0.01)
    report["daemon_started"] = os.path.exists("@DROP@/daemon.ready")


def _probe(which):
    if _DONE or "services.evaluator.harness" not in sys.modules:
        return
    _DONE.append(True)
    report = {}
    for name in which:
        globals()["_probe_" + name](report)
    with open("@DROP@/report.tmp", "w") as handle:
        json.dump(report, handle)
    os.rename("@DROP@/report.tmp", "@DROP@/report.json")
'''

CANDIDATE = PROBES + '''

def run(x, w, b, y):
    _probe(@WHICH@)
    y.copy_(x * w + b)
'''

REFERENCE = PROBES + '''
import torch


def run(x, w, b):
    _probe(@WHICH@)
    return x * w + b
'''


@dataclass(frozen=True)
class Stage:
    """What the probes need to know: the sleeper's pid, the evaluator's, the swarm's home, the drop."""
    sleeper: int
    evaluator: int
    home: Path
    drop: Path

    def code(self, template: str, which: tuple[str, ...]) -> str:
        for key, value in (("@SLEEPER@", self.sleeper), ("@EVALUATOR@", self.evaluator), ("@HOME@", self.home),
                           ("@DROP@", self.drop), ("@WHICH@", repr(which))):
            template = template.replace(key, str(value))
        return template

    def report(self) -> dict:
        return json.loads((self.drop / "report.json").read_text())


def swarm_home() -> Path:
    """A swarm's home as `kernelswarm up` leaves it (DB, store, logs), outside /tmp and /dev/shm
    (a sandboxed child's view empties those anyway): where a deployment keeps it, below a folder
    the children do see."""
    base = Path(tempfile.mkdtemp(prefix="ks-attack-home-", dir="/var/tmp"))
    home = base / ".kernelswarm"
    (home / "logs").mkdir(parents=True)
    (home / "store" / "ab").mkdir(parents=True)
    (home / "kernelswarm.db").write_text(f"SQLite format 3 session key {SECRET}")
    (home / "logs" / "evaluator.log").write_text(f"log line {SECRET}")
    (home / "store" / "ab" / "object").write_text(f"stored {SECRET}")
    for path in (base, *base.rglob("*")):
        path.chmod(0o777 if path.is_dir() else 0o666)  # a uid of its own would read it: only the view hides it
    return home


def remove_home(home: Path) -> None:
    shutil.rmtree(home.parent, ignore_errors=True)


def start_sleeper() -> subprocess.Popen:
    """A process of the evaluator's own uid outside every sandbox."""
    return subprocess.Popen(["sleep", "600"], start_new_session=True)

