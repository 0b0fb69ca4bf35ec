"""The reference's process as the attempt's checker (`services/evaluator/harness/checker.py`; the
evaluator's end is `children.Checker`): it holds the expected outputs, checks each workload's outputs at the candidate's `end` (outer clock on) or after
the candidate (off), and is gone when the attempt is; when it dies, nothing passes and nothing is
judged: the attempt is the evaluator's to retry."""

from __future__ import annotations

import dataclasses
import os
import signal
import time
from pathlib import Path

import pytest

from evalkit import FAST, affine_definition, affine_workloads, make_problem, make_solution
from services.evaluator import children as children_module
from services.evaluator.evaluate import evaluate
from shared.errors import EvaluatorFault
from shared.schema import Problem, Status

AFFINE = "def run(x, w, b, y):\n    y.copy_(x * w + b)\n"
OFF_BY_ONE = "def run(x, w, b, y):\n    y.copy_(x * w + b + 1)\n"


@pytest.fixture
def affine(tmp_path: Path) -> Problem:
    return make_problem(tmp_path / "p", affine_definition(), affine_workloads())


@pytest.mark.parametrize("clock", [True, False], ids=["outer_clock", "no_outer_clock"])
def test_verdicts_come_from_the_checker_with_the_clock_on_or_off(affine, clock, monkeypatch):
    asked: list[tuple[int, int]] = []
    check = children_module.Checker.check

    def counted(self, index, runs, outputs_dir, shared=None, first=None):
        asked.append((index, runs))
        return check(self, index, runs, outputs_dir, shared, first)

    monkeypatch.setattr(children_module.Checker, "check", counted)
    config = dataclasses.replace(FAST, outer_clock=clock)
    honest = evaluate(affine, make_solution(AFFINE), config)
    assert honest.status is Status.PASSED, honest.message
    assert sorted(i for i, _ in asked) == list(range(len(affine.workloads)))  # each workload once
    assert all(runs >= 1 for _, runs in asked)
    wrong = evaluate(affine, make_solution(OFF_BY_ONE), config)
    assert wrong.status is Status.INCORRECT_NUMERICAL and "correctness round 0" in wrong.message


def test_the_checker_is_gone_with_the_attempt(affine, monkeypatch):
    kept = []
    made = children_module.Checker

    def remembered(child, *args):
        kept.append(child)
        return made(child, *args)

    monkeypatch.setattr(children_module, "Checker", remembered)
    result = evaluate(affine, make_solution(AFFINE), FAST)
    assert result.status is Status.PASSED, result.message
    assert len(kept) == 1 and not kept[0].alive()


def test_a_checker_that_died_passes_nothing(affine, monkeypatch):
    check = children_module.Checker.check

    def killed_first(self, index, runs, outputs_dir, shared=None, first=None):
        os.kill(self.child.process.pid, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while self.child.alive() and time.monotonic() < deadline:
            time.sleep(0.01)
        return check(self, index, runs, outputs_dir, shared, first)

    monkeypatch.setattr(children_module.Checker, "check", killed_first)
    with pytest.raises(EvaluatorFault, match="checker .* stopped answering"):  # retried, never a verdict
        evaluate(affine, make_solution(AFFINE), FAST)


def test_a_reply_out_of_turn_ends_the_checkers_trust():
    """A reply for another workload (or none in time) is never taken for this one's verdict, and
    no later reply is trusted either: each is the evaluator's fault (`EvaluatorFault`), the rest
    without asking."""
    import json
    import socket
    from types import SimpleNamespace

    ours, theirs = socket.socketpair()
    killed = []
    child = SimpleNamespace(channel=ours, kill=lambda: killed.append(True))
    checker = children_module.Checker(child, timeout_s=5)
    theirs.sendall(json.dumps({"status": "PASSED", "index": 1}).encode() + b"\n")  # workload 1's, early
    with pytest.raises(EvaluatorFault, match="stopped answering"):
        checker.check(0, 1, Path("/nonexistent"))
    asked = theirs.recv(1 << 16)
    assert json.loads(asked.splitlines()[0])["index"] == 0
    theirs.setblocking(False)
    with pytest.raises(EvaluatorFault):
        checker.check(1, 1, Path("/nonexistent"))
    with pytest.raises(BlockingIOError):
        theirs.recv(1 << 16)  # nothing more was asked
    checker.close()
    assert killed == [True]
    ours.close()
    theirs.close()
