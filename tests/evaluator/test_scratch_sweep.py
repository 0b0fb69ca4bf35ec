"""Attempt folders left by a killed evaluator are removed by the next one; live ones are kept."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from services.evaluator.scratch import OWNER, UNOWNED_MAX_AGE_S, identity, make_folder, sweep_folders
from services.evaluator.spares import Spares

REPO = Path(__file__).resolve().parents[2]


def dead_identity() -> str:
    """The identity of a process that has exited (its pid may be reused later: the start time differs)."""
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    found = identity(child.pid)
    child.wait()
    assert found is not None
    return found


def test_a_folder_whose_owner_died_is_removed_and_a_live_ones_is_kept(tmp_path):
    ours = make_folder("att", str(tmp_path))
    (ours / "inputs").mkdir()
    orphan = make_folder("can", str(tmp_path))
    (orphan / "inputs").mkdir()
    (orphan / "inputs" / "w0_s0.st").write_bytes(b"x" * 1024)
    (orphan / OWNER).write_text(dead_identity())
    assert sweep_folders(str(tmp_path)) == [orphan]
    assert ours.is_dir() and not orphan.exists()


def test_a_live_evaluator_whose_namespace_cannot_be_read_keeps_its_folders(tmp_path, monkeypatch):
    """Another evaluator of the same user (not root) is not dumpable (`shared.process.protect_self`):
    its /proc/<pid>/ns/pid cannot be read, and its live folders were taken for a dead one's and
    removed under it (this test's subprocess stands in for it; the unreadable link is played)."""
    from services.evaluator import scratch

    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        theirs = make_folder("can", str(tmp_path))
        (theirs / OWNER).write_text(identity(other.pid))
        own = os.getpid()
        real = scratch._namespace
        monkeypatch.setattr(scratch, "_namespace", lambda pid: real(pid) if pid == own else "-")
        assert sweep_folders(str(tmp_path)) == []
        assert theirs.is_dir()
    finally:
        other.kill()
        other.wait()
    assert sweep_folders(str(tmp_path)) == [theirs]  # gone once its owner is


def test_a_reused_pid_does_not_keep_a_folder(tmp_path):
    pid, _, namespace = identity(os.getpid()).split()
    folder = make_folder("ref", str(tmp_path))
    (folder / OWNER).write_text(f"{pid} 1 {namespace}")  # our pid, another start time
    assert sweep_folders(str(tmp_path)) == [folder]


def test_another_namespace_and_other_names_are_left_alone(tmp_path):
    foreign = make_folder("att", str(tmp_path))
    pid, started, _ = dead_identity().split()
    (foreign / OWNER).write_text(f"{pid} {started} pid:[1]")
    unrelated = tmp_path / "ks-hacks-abc"
    unrelated.mkdir()
    os.utime(unrelated, (0, 0))
    assert sweep_folders(str(tmp_path)) == []
    assert foreign.is_dir() and unrelated.is_dir()


def test_unowned_folders_go_only_when_old(tmp_path):
    old, new = tmp_path / "ks-attempt-old", tmp_path / "ks-can-new"
    old.mkdir()
    new.mkdir()
    os.utime(old, (time.time() - UNOWNED_MAX_AGE_S - 60,) * 2)
    assert sweep_folders(str(tmp_path)) == [old]
    assert new.is_dir()


def test_a_killed_evaluator_leaves_folders_that_the_next_pool_removes(tmp_path):
    script = ("import sys, time\n"
              "from services.evaluator.spares import Spares\n"
              f"pool = Spares('cpu', {str(tmp_path)!r})\n"
              "pool.refill({'reference': 'ref', 'candidate': 'cand'})\n"
              "print('ready', flush=True)\n"
              "time.sleep(600)\n")
    evaluator = subprocess.Popen([sys.executable, "-c", script], cwd=REPO, stdout=subprocess.PIPE, text=True,
                                 env={**os.environ, "PYTHONPATH": str(REPO)})
    try:
        assert evaluator.stdout.readline().strip() == "ready"
        left = sorted(p.name for p in tmp_path.iterdir())
        assert len(left) == 2, left
        Spares("cpu", str(tmp_path)).close()  # a pool made while the first evaluator lives keeps its folders
        assert sorted(p.name for p in tmp_path.iterdir()) == left
        evaluator.send_signal(signal.SIGKILL)
        evaluator.wait()
    finally:
        evaluator.kill()
        evaluator.wait()
        evaluator.stdout.close()
    Spares("cpu", str(tmp_path)).close()
    assert list(tmp_path.iterdir()) == []
