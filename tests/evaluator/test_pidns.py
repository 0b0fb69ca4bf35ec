"""An isolated child's PID namespace (`sandbox.pidns`): the process the evaluator holds is a shim
outside it that ends exactly as the child did, and the child is a process of a namespace of its own."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from services.evaluator.sandbox.isolation import finish_child, isolation, start_child
from tests.evaluator.evalkit import lock_is_free

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.skipif(not isolation()["pid_namespace"], reason="no PID namespace on this machine")


def _run(tmp_path: Path, code: str, pid_namespace: bool = True):
    home = tmp_path / "home"
    home.mkdir(mode=0o777, exist_ok=True)
    home.chmod(0o777)  # the child may run as `nobody`
    child = start_child(["-c", code], home, home / "child.log", isolate=True, fork_server=False,
                        pid_namespace=pid_namespace)
    run = finish_child(child, "", 60)
    child.channel.close()
    return run


@pytest.mark.parametrize("code, expected", [("import sys; sys.exit(7)", 7),
                                            ("import os, signal; os.kill(os.getpid(), signal.SIGSEGV)",
                                             -signal.SIGSEGV),
                                            ("import os, signal; os.kill(os.getpid(), signal.SIGKILL)",
                                             -signal.SIGKILL)])
def test_the_shim_ends_as_the_child_did(tmp_path, code, expected) -> None:
    """Its exit code, or the signal that killed it (a child that kills itself dies of it: it is not
    its namespace's init, whom the kernel shields from its own signals)."""
    assert _run(tmp_path, code).exit_code == expected


def test_the_child_is_in_a_namespace_of_its_own_and_without_one_where_asked(tmp_path) -> None:
    probe = "import os; print('pid', os.getpid(), sorted(int(p) for p in os.listdir('/proc') if p.isdigit()))"
    inside = _run(tmp_path, probe).log.split()
    assert inside[:2] == ["pid", "2"] and inside[2:] == ["[1,", "2]"], inside  # init and itself
    outside = _run(tmp_path, probe, pid_namespace=False).log.split()
    assert int(outside[1]) > 2 and len(outside) > 4, outside


# A stand-in evaluator: one isolated child (a new interpreter) that leaves a
# daemon in a session of its own holding a lock; it says when the daemon holds it, then waits.
EVALUATOR = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    from services.evaluator.sandbox.isolation import start_child

    home, lock = Path(sys.argv[1]), sys.argv[2]
    daemon = ("import fcntl, os, sys, time\\n"
              "if os.fork() == 0:\\n"
              "    os.setsid()\\n"
              "    fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o666)\\n"
              "    fcntl.flock(fd, fcntl.LOCK_EX)\\n"
              "    open(sys.argv[1] + '.held', 'w').close()\\n"
              "    time.sleep(600)\\n"
              "time.sleep(600)\\n")
    # the lock named from the child's cwd (its home): the way from / may pass folders only root
    # may enter (pytest's), which a child running as `nobody` cannot
    child = start_child(["-c", daemon, Path(lock).name], home, home / "child.log", isolate=True, fork_server=False)
    while not Path(lock + ".held").exists():
        time.sleep(0.05)
    print("held", flush=True)
    time.sleep(600)
""")


def test_the_whole_tree_dies_with_the_evaluator(tmp_path) -> None:
    """A SIGKILLed evaluator: its child's shim dies of its parent-death signal, the namespace's
    init of the shim's, and the kernel ends the rest, a daemon in a session of its own included."""
    home = tmp_path / "home"
    home.mkdir(mode=0o777)
    home.chmod(0o777)
    lock = home / "daemon.lock"
    evaluator = subprocess.Popen([sys.executable, "-c", EVALUATOR, str(home), str(lock)], cwd=REPO,
                                 stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": str(REPO)})
    try:
        assert evaluator.stdout.readline().strip() == "held"
        evaluator.kill()
        evaluator.wait()
        deadline = time.monotonic() + 30  # the kernel's kills are asynchronous
        while not lock_is_free(lock) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert lock_is_free(lock), "the daemon outlived its evaluator"
    finally:
        evaluator.kill()
        evaluator.wait()
        evaluator.stdout.close()

