"""Issue 40, rows M1 and M2 at the sandbox's level: a sandboxed child, a solution's or a problem's
reference, (a) signals no process outside its sandbox (a sleeper of the evaluator's own uid, the
evaluator, its parent), (b) lists only its own processes in /proc, (c) reads neither the DB nor the
logs nor lists the store in the evaluator's home, (d) leaves no daemon behind, even in a session of
its own and where no memory cgroup can be made. Each attack is a real evaluation of the affine
problem on the CPU (`tests/evaluator/evalkit.py`), on both ways a child starts (the fork server and
a new interpreter); the attacks run on the child's first call and report what they could do
(`sandboxkit.PROBES`). Controls, in the same attempts: the attempt still PASSES, the child kills a
process of its own, sees its own pid, reads and writes its own folder; and an honest solution
passes beside the same sleeper and home.

Where the child keeps uid 0 without capabilities (this machine: the interpreter under /root), the
owner bits let it read root's files and signal root's processes: only the namespaces stop it.
"""

from __future__ import annotations

import dataclasses
import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from services.evaluator.evaluate import AttemptResult, evaluate
from services.evaluator.sandbox import hidden, memcap
from services.evaluator.sandbox.isolation import WRITABLE_ENV
from services.evaluator.tasks import apply_settings
from shared.process import running
from shared.schema import Status
from shared.settings import Settings
from tests.attacks.sandboxkit import (
    CANDIDATE, REFERENCE, Stage, remove_home, start_sleeper, swarm_home,
)
from tests.evaluator.evalkit import FAST, affine_definition, affine_workloads, lock_is_free, make_problem, make_solution

PROBED = ("signals", "proc", "data")
STARTS = {"fork_server": True, "new_interpreter": False}


@pytest.fixture
def stage(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Stage]:
    """A sleeper, the swarm's home hidden as the evaluator service hides it at start
    (`tasks.apply_settings`), a drop folder, SIGURG to this process (the evaluator) counted."""
    home, sleeper = swarm_home(), start_sleeper()
    monkeypatch.setattr(hidden, "_hidden", ())  # the process-wide setting, restored after
    apply_settings(Settings(home=home))
    drop = tmp_path / "drop"
    drop.mkdir(mode=0o777)
    drop.chmod(0o777)
    monkeypatch.setenv(WRITABLE_ENV, str(drop))
    received: list[int] = []
    previous = signal.signal(signal.SIGURG, lambda signum, frame: received.append(signum))
    try:
        yield Stage(sleeper.pid, os.getpid(), home, drop)
        assert not received, "a sandboxed child signalled the evaluator"
    finally:
        signal.signal(signal.SIGURG, previous)
        sleeper.kill()
        sleeper.wait()
        remove_home(home)


def _candidate(stage: Stage, tmp_path: Path, which: tuple[str, ...], **config) -> AttemptResult:
    problem = make_problem(tmp_path, affine_definition("float32"), affine_workloads("float32"))
    solution = make_solution(stage.code(CANDIDATE, which), problem.name)
    return evaluate(problem, solution, dataclasses.replace(FAST, **config))


def _reference(stage: Stage, tmp_path: Path, which: tuple[str, ...], **config) -> AttemptResult:
    definition = affine_definition("float32", reference=stage.code(REFERENCE, which))
    problem = make_problem(tmp_path, definition, affine_workloads("float32"))
    solution = make_solution("import torch\n\ndef run(x, w, b, y):\n    y.copy_(x * w + b)\n", problem.name)
    return evaluate(problem, solution, dataclasses.replace(FAST, **config))


ROLES = {"candidate": _candidate, "reference": _reference}


@pytest.mark.parametrize("start", STARTS)
@pytest.mark.parametrize("role", ROLES)
def test_a_sandboxed_child_signals_sees_and_reads_nothing_outside(stage, tmp_path, role, start) -> None:
    result = ROLES[role](stage, tmp_path, PROBED, fork_server=STARTS[start])
    assert result.status is Status.PASSED, result.message  # the control: the stage still works
    report = stage.report()
    # (a) signals: the sleeper and the evaluator untouched; its own child it may kill (the control)
    assert report["own_child_killed"], report
    assert running(stage.sleeper), "a sandboxed child killed a process outside its sandbox"
    assert report["signalled"] == [], report
    # (b) /proc: its own processes only (its own pid there: the control)
    assert report["my_pid"] in report["proc"], report
    assert stage.sleeper not in report["proc"] and stage.evaluator not in report["proc"], report["proc"]
    # (c) the swarm's data: nothing of the DB, logs or store; its own folder its own (the control)
    assert report["own_readable"], report
    assert report["read"] == [], report["read"]  # on the base commit: the DB, the log, the object, names


@pytest.mark.parametrize("start", STARTS)
def test_a_daemon_in_a_session_of_its_own_dies_with_the_attempt(stage, tmp_path, monkeypatch, start) -> None:
    """Where no memory cgroup can be made (a container without a writable hierarchy) nothing but
    the child's PID namespace ends a daemon that left its process group."""
    monkeypatch.setattr(memcap, "find", lambda: None)
    result = _candidate(stage, tmp_path, ("daemon",), fork_server=STARTS[start])
    assert stage.report()["daemon_started"], result.message  # the control: it did start one
    assert result.status is Status.REWARD_HACK and "processes" in result.message, result.message
    assert lock_is_free(stage.drop / "daemon.lock"), "the daemon outlived its attempt"


def test_an_honest_solution_passes_beside_the_same_sleeper_and_home(stage, tmp_path) -> None:
    result = _candidate(stage, tmp_path, ())
    assert result.status is Status.PASSED, result.message
    assert [t.evaluation.status for t in result.traces] == [Status.PASSED] * 2
    assert running(stage.sleeper)
