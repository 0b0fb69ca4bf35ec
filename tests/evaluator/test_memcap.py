"""An isolated child's host memory, bounded by a cgroup of its own (`services/evaluator/sandbox/memcap.py`):
the only bound a GPU candidate's host memory has (its driver's address space rules out
`RLIMIT_AS`). Needs a root evaluator on a machine with a writable memory cgroup hierarchy (v1 or v2);
skipped, with the reason, elsewhere."""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import textwrap
from pathlib import Path

import pytest

from services.evaluator.sandbox import memcap
from tests.evaluator.evalkit import lock_is_free

needs_cgroup = pytest.mark.skipif(memcap.find() is None, reason="no memory cgroup this evaluator may make here")

BOUND = 512 << 20
# Touches `sys.argv[1]` MiB one page at a time, then says how far it got.
TOUCH = textwrap.dedent("""
    import mmap, sys
    size = int(sys.argv[1]) << 20
    block = mmap.mmap(-1, size)
    for offset in range(0, size, 4096):
        block[offset] = 1
    print("touched", size >> 20, "MiB", flush=True)
""")


def _run(tmp_path: Path, mib: int):
    from services.evaluator.sandbox.isolation import finish_child, start_child

    child = start_child(["-c", TOUCH, str(mib)], tmp_path, tmp_path / "child.log", isolate=True,
                        host_memory_bytes=BOUND)
    assert child.cgroup is not None and child.cgroup.path.is_dir()
    assert str(child.process.pid) in (child.cgroup.path / "cgroup.procs").read_text().split()
    run = finish_child(child, "", 60)
    child.channel.close()
    return child, run


@needs_cgroup
def test_an_isolated_child_over_its_host_memory_bound_is_killed_and_says_so(tmp_path: Path) -> None:
    child, run = _run(tmp_path, 4 * (BOUND >> 20))
    assert run.exit_code == -9 and run.memory_exceeded_bytes == BOUND, (run.exit_code, run.log)
    assert not child.cgroup.path.exists()  # removed once the child is gone


@needs_cgroup
def test_an_isolated_child_under_its_bound_runs_and_its_cgroup_goes(tmp_path: Path) -> None:
    child, run = _run(tmp_path, (BOUND >> 20) // 4)
    assert run.exit_code == 0 and run.memory_exceeded_bytes is None, run.log
    assert "touched" in run.log
    assert not child.cgroup.path.exists()


@needs_cgroup
def test_a_candidate_over_its_bound_is_a_runtime_error_naming_it(affine, monkeypatch) -> None:
    """End to end, through the fork server: the candidate's message names the bound, and the next
    attempt passes. Its address space unbounded, as on a GPU device (`sandbox.memory_limit`)."""
    from evalkit import FAST, make_solution
    from services.evaluator import evaluate as evaluate_module, spares
    from services.evaluator.evaluate import evaluate
    from shared.schema import Status

    monkeypatch.setattr(memcap, "bound_bytes", lambda: 1 << 30)
    for module in (evaluate_module, spares):
        monkeypatch.setattr(module, "memory_limit", lambda device: None)
    hog = make_solution("import mmap\n\ndef run(x, w, b, y):\n    block = mmap.mmap(-1, 3 << 30)\n"
                        "    for offset in range(0, 3 << 30, 4096):\n        block[offset] = 1\n"
                        "    y.copy_(x * w + b)\n", affine.name)
    result = evaluate(affine, hog, FAST)
    assert result.status is Status.RUNTIME_ERROR, result.message
    assert "host-memory bound of 1.0 GiB" in result.message, result.message
    honest = make_solution("import torch\n\ndef run(x, w, b, y):\n    y.copy_(x * w + b)\n", affine.name)
    assert evaluate(affine, honest, FAST).status is Status.PASSED


@needs_cgroup
def test_stale_cgroups_of_a_dead_evaluator_are_swept() -> None:
    base = memcap.find().base
    stale = base / f"{memcap.PREFIX}{memcap._pid_namespace()}-{_dead_pid()}-0"
    # Another container's evaluator may share `base`: its pids mean nothing in this namespace.
    foreign = base / f"{memcap.PREFIX}1{memcap._pid_namespace()}-{_dead_pid()}-0"
    stale.mkdir()
    foreign.mkdir()
    try:
        memcap.sweep(base)
        assert not stale.exists()
        assert foreign.exists()
    finally:
        foreign.rmdir()


def _dead_pid() -> int:
    pid = os.getpid() + 100000
    while Path(f"/proc/{pid}").exists():
        pid += 1
    return pid if pid < 4194304 else sys.exit("no free pid")


DAEMON = textwrap.dedent("""
    import os, sys, time
    if os.fork() == 0:
        os.setsid()  # a session of its own: out of reach of the child's process group
        if os.fork() == 0:
            import fcntl
            with open(sys.argv[1], "w") as f:  # its pid may be one of its PID namespace: the lock says it lives
                fcntl.flock(f, fcntl.LOCK_EX)
                f.write(str(os.getpid()))
                f.flush()
                time.sleep(300)
        os._exit(0)
    time.sleep(1)
""")


@needs_cgroup
def test_a_daemon_that_left_the_process_group_dies_with_the_cgroup() -> None:
    from services.evaluator.sandbox.isolation import finish_child, start_child

    # Where `nobody` (the candidate on a root evaluator) may reach it: pytest's own folders are root's, 0700.
    outer = Path(tempfile.mkdtemp(dir="/dev/shm" if os.path.isdir("/dev/shm") else None))
    outer.chmod(0o755)
    home = outer / "home"
    home.mkdir(mode=0o777)
    home.chmod(0o777)
    pid_file = home / "daemon.pid"
    try:
        child = start_child(["-c", DAEMON, str(pid_file)], home, home / "child.log", isolate=True,
                            host_memory_bytes=BOUND, own_folders=(home,))
        run = finish_child(child, "", 60)
        child.channel.close()
        written = pid_file.read_text() if pid_file.exists() else None
        held = written and not lock_is_free(pid_file)
    finally:
        shutil.rmtree(outer)
    assert written, f"the daemon wrote no pid: {run.log}"
    assert run.exit_code == 0, run.log
    assert not held, f"the daemon {written} outlived its cgroup"
    assert not child.cgroup.path.exists()



def _fake_cgroup(path: Path, hands_down: str = "", memory_max: str = "max") -> Path:
    path.mkdir(parents=True, exist_ok=True)
    (path / "cgroup.subtree_control").write_text(hands_down + "\n")
    (path / "cgroup.controllers").write_text("cpu memory pids\n")
    (path / "memory.max").write_text(memory_max + "\n")
    return path


def test_v2_uses_the_evaluators_own_cgroup_where_it_hands_down_memory(tmp_path: Path) -> None:
    mount = _fake_cgroup(tmp_path, "cpu memory")
    own = _fake_cgroup(mount / "box" / "leaf", "memory", "1073741824")
    _fake_cgroup(mount / "box", "memory")
    assert memcap._unified(mount, own) == memcap.Hierarchy(2, own)


def test_v2_falls_back_to_the_nearest_ancestor_that_hands_down_memory_under_the_limits_left_behind(
        tmp_path: Path, monkeypatch) -> None:
    """A container whose processes share one leaf (the H200 machine: /process_api/<id>): v2 lets no
    cgroup with processes of its own enable a controller for children, so the children's cgroups go
    below an ancestor, kept under the `memory.max` of every cgroup they leave behind."""
    monkeypatch.setattr(memcap, "_memory_for_children", lambda base: False)  # refused: processes live there
    mount = _fake_cgroup(tmp_path, "cpu memory")
    _fake_cgroup(mount / "api", "", "8589934592")  # does not hand memory down
    _fake_cgroup(mount / "api" / "task", "", "max")
    own = _fake_cgroup(mount / "api" / "task" / "leaf", "", "2147483648")
    assert memcap._unified(mount, own) == memcap.Hierarchy(2, mount, 2147483648)
    (mount / "api" / "cgroup.subtree_control").write_text("memory\n")
    assert memcap._unified(mount, own) == memcap.Hierarchy(2, mount / "api", 2147483648)
    (mount / "api" / "task" / "cgroup.subtree_control").write_text("memory\n")
    (mount / "api" / "task" / "leaf" / "memory.max").write_text("max\n")
    assert memcap._unified(mount, own) == memcap.Hierarchy(2, mount / "api" / "task", None)
    (mount / "cgroup.subtree_control").write_text("cpu\n")
    for path in (mount / "api", mount / "api" / "task"):
        (path / "cgroup.subtree_control").write_text("cpu\n")
    assert memcap._unified(mount, own) is None  # nowhere the memory controller reaches


def test_a_childs_bound_stays_under_the_ceiling_it_left_behind(tmp_path: Path, monkeypatch) -> None:
    base = _fake_cgroup(tmp_path / "base", "memory")
    monkeypatch.setattr(memcap, "find", lambda: memcap.Hierarchy(2, base, 1 << 30))
    group = memcap.new(4 << 30)
    assert group is not None and group.limit_bytes == 1 << 30
    assert (group.path / "memory.max").read_text() == str(1 << 30)
    assert group.path.name.startswith(f"{memcap.PREFIX}{memcap._pid_namespace()}-{os.getpid()}-")


def test_a_cgroup_the_machine_refuses_is_the_evaluators_fault_not_an_unbounded_child(tmp_path: Path,
                                                                                       monkeypatch) -> None:
    """Where the hierarchy exists but refuses the child's cgroup (here: it is gone), no child is
    started without its bound: `EvaluatorFault`, which the task retries (issue 25, item 2)."""
    from services.evaluator.sandbox.isolation import start_child
    from shared.errors import EvaluatorFault

    monkeypatch.setattr(memcap, "find", lambda: memcap.Hierarchy(2, tmp_path / "gone", None))
    with pytest.raises(EvaluatorFault, match="memory cgroup"):
        start_child(["-c", "print('never')"], tmp_path, tmp_path / "child.log", isolate=True, host_memory_bytes=BOUND)
    assert not (tmp_path / "child.log").exists()  # nothing ran
    base = _fake_cgroup(tmp_path / "base", "memory")
    monkeypatch.setattr(memcap, "find", lambda: memcap.Hierarchy(2, base, None))
    # Its limit file refused (a file the kernel did not make): the cgroup is made, then taken down.
    monkeypatch.setattr(memcap.Hierarchy, "limit_files", lambda self: ("missing/memory.max", "memory.swap.max"))
    with pytest.raises(EvaluatorFault, match="refused its limit"):
        memcap.new(1 << 30)
    assert not [p for p in base.iterdir() if p.name.startswith(memcap.PREFIX)]
