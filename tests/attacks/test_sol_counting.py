"""Issue 40, row C1: counting a problem's work (T_sol's counts, `up`'s size check) runs its reference,
untrusted text, only in the sandbox a candidate gets (`services.evaluator.sandbox.counting`).

Each attack is a reference that does its harm at import (as `load_reference` runs it) and then
doubles its input: the harm must fail, and the same count must still give the honest twin's work
(the control beside each attack: a stage that simply broke would count nothing and fail it). The
stages are called as they exist on the base commit too, where every one of these tests fails:
`kernelswarm sol` (a), (b), (d), `up`'s `cpu_sized` (b), the evaluator's `score.score_workload` (c).
The last test is the honest control of a library problem against the base commit's numbers.
"""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from pathlib import Path

from kernelswarm.up import cpu_sized
from services.evaluator import score
from shared.hardware import lookup
from tests.attacks.solkit import (REPO, counted_as_honest, definition, honest_work, kill_all, load, processes_named,
                                  sol_rows, token, workload, write_problem)

ENVIRON = """import os
_found = []
for _pid in [*os.listdir("/proc"), str(os.getppid())]:
    try:
        with open(f"/proc/{_pid}/environ", "rb") as _file:
            _found += [e.decode() for e in _file.read().split(b"\\0") if e.startswith(b"KS_ATTACK_SECRET=")]
    except (OSError, ValueError):
        pass
if _found:
    raise RuntimeError("read another process's environment: " + " ".join(_found))
"""
WRITE = """for _path in {targets!r}:
    try:
        with open(_path, "w") as _file:
            _file.write("written by a problem's reference")
    except OSError:
        pass
"""
CONNECT = """import socket
try:
    with socket.create_connection(("127.0.0.1", {port}), timeout=3) as _peer:
        _peer.sendall(b"counted here")
except OSError:
    pass
"""
DAEMON = """import ctypes, os, time
_pid = os.fork()
if _pid == 0:
    os.setsid()
    if os.fork() == 0:
        ctypes.CDLL(None).prctl(15, {name!r}, 0, 0, 0)  # PR_SET_NAME: the test finds it by this name
        time.sleep(300)
    os._exit(0)
os.waitpid(_pid, 0)
"""
TIME_S = 90.0  # per workload: a daemon must not make the count wait for it


def test_a_reference_cannot_read_the_environment_of_another_process(tmp_path: Path, capsys):
    secret = token()
    holder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"],
                              env={"PATH": "/usr/bin:/bin", "KS_ATTACK_SECRET": secret})
    try:
        [row] = sol_rows(write_problem(tmp_path / "spy", "spy", ENVIRON), capsys)
    finally:
        holder.kill()
        holder.wait()
    assert secret not in str(row), row
    assert counted_as_honest(row), row


def test_a_reference_cannot_write_the_package_the_home_or_the_shared_tmp(tmp_path: Path, capsys):
    mark = token()
    targets = [REPO / "shared" / f"_ks_attack_{mark}.py", Path.home() / f".ks_attack_{mark}",
               Path("/tmp") / f"ks_attack_{mark}", tmp_path / f"ks_attack_{mark}"]
    try:
        [row] = sol_rows(write_problem(tmp_path / "writer", "writer", WRITE.format(targets=[str(t) for t in targets])),
                         capsys)
        written = [str(t) for t in targets if t.exists()]
    finally:
        for target in targets:
            target.unlink(missing_ok=True)
    assert written == []
    assert counted_as_honest(row), row


def test_up_counts_a_problems_size_in_the_sandbox_not_in_its_own_process(tmp_path: Path):
    mark = token()
    targets = [REPO / "shared" / f"_ks_attack_{mark}.py", Path.home() / f".ks_attack_{mark}"]
    problem = load(write_problem(tmp_path / "writer", "writer", WRITE.format(targets=[str(t) for t in targets])))
    try:
        kept, left_out = cpu_sized([problem])
        written = [str(t) for t in targets if t.exists()]
    finally:
        for target in targets:
            target.unlink(missing_ok=True)
    assert written == []
    assert [p.name for p in kept] == ["writer"] and left_out == []  # counted, and small


def test_the_evaluators_count_cannot_reach_a_local_port(tmp_path: Path):
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(4)
        attack = definition(f"caller_{token()}", CONNECT.format(port=listener.getsockname()[1]))
        verdict = score.score_workload(attack, workload(), tmp_path, lookup("NVIDIA H200"), latency_ms=1.0,
                                       eager_ms=2.0, compile_ms=None)
        listener.setblocking(False)
        try:
            peer, _ = listener.accept()
            peer.close()
            reached = True
        except BlockingIOError:
            reached = False
    assert not reached
    assert verdict.sol is not None and verdict.hack is None  # counted: the same work as its honest twin
    assert verdict.sol.t_sol_ms == score.estimate(honest_work(), lookup("NVIDIA H200")).t_sol_ms


def test_a_daemon_left_by_a_reference_dies_with_its_count_and_holds_up_nothing(tmp_path: Path, capsys):
    name = f"kssol{token()[:8]}"
    daemon = write_problem(tmp_path / "daemon", "daemon", DAEMON.format(name=name.encode()))
    honest = write_problem(tmp_path / "honest", "honest", "")
    try:
        started = time.monotonic()
        [first] = sol_rows(daemon, capsys, time_s=TIME_S)
        first_s = time.monotonic() - started
        left = processes_named(name)
        [second] = sol_rows(honest, capsys, time_s=TIME_S)  # the next problem: counted, not held up
    finally:
        kill_all(processes_named(name))
    assert left == []
    # A hang check, not a timing: the base commit waits for the daemon's hold on the child's stdout
    # until the time limit plus its grace (TIME_S + 10 s) before it returns the first count at all.
    assert first_s < TIME_S
    assert counted_as_honest(first) and counted_as_honest(second), (first, second)


def test_an_honest_library_problem_counts_as_on_the_base_commit(capsys):
    rows = sol_rows(REPO / "problems" / "llama31_8b_rmsnorm", capsys)
    assert [(r["matrix_flops"], r["vector_flops"], r["bytes_moved"]) for r in rows] == [
        (0, 16386, 24576), (0, 131088, 139264), (0, 524352, 532480), (0, 2097408, 2105344),
        (0, 8389632, 8396800), (0, 16779264, 16785408)]  # kernelswarm sol --json on 86f960f
