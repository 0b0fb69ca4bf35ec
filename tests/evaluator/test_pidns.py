"""An isolated child's PID namespace (`sandbox.pidns`): the process the evaluator holds is a shim
outside it that ends exactly as the child did, and the child is a process of a namespace of its own."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from services.evaluator.sandbox.isolation import finish_child, isolation, start_child

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
