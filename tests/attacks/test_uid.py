"""Issue 40, "a uid of its own" at every stage: a solution and a problem's reference (real CPU
evaluations of the affine problem, `tests/evaluator/evalkit.py`) try to read a root-owned file of
mode 0600 that lies outside every hidden folder (below /var/tmp, in a folder others may enter) and
to carry what they read out in their error text, which the site shows. Where the evaluator can
switch its children to users of their own (`isolation.unprivileged_ids`: root, and a Python that
others may run, as `make setup` makes it), the owner bits refuse them. Where it cannot (a Python
under root's 0700 home: the child keeps uid 0 without capabilities), owner bits let a uid-0 child
read root's files: that hole is an xfail(strict=True), so the test fails the day it closes.

Each attack is also its own control: an attacker that cannot read the file computes the honest
answer, so the attempt must PASS (a stage that simply breaks fails the test), and a secret file
missing from its view fails it too (it must be refused, not hidden). Beside them an honest
solution PASSES on the same problem. Both ways a child starts: the fork server, a new interpreter.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from services.evaluator.evaluate import AttemptResult, evaluate
from services.evaluator.sandbox.isolation import unprivileged_ids
from shared.schema import Problem, Status
from tests.evaluator.evalkit import FAST, affine_definition, affine_workloads, make_problem, make_solution

SECRET = "ks-root-only-secret-7d21"
STARTS = {"fork_server": True, "new_interpreter": False}

# Runs on every call: reads the file; refused, computes honestly; read, puts it in its error text.
STEAL = '''
import torch


def _steal():
    try:
        with open(@PATH@) as handle:
            return handle.read()
    except PermissionError:
        return None
    except FileNotFoundError:
        raise RuntimeError("the secret file is not in the view: the attack proves nothing")
'''

CANDIDATE = STEAL + '''

def run(x, w, b, y):
    stolen = _steal()
    if stolen is not None:
        raise RuntimeError("LEAKED " + stolen)
    y.copy_(x * w + b)
'''

REFERENCE = STEAL + '''

def run(x, w, b):
    stolen = _steal()
    if stolen is not None:
        raise RuntimeError("LEAKED " + stolen)
    return x * w + b
'''

HONEST = "import torch\n\ndef run(x, w, b, y):\n    y.copy_(x * w + b)\n"


def _hole(role: str) -> pytest.MarkDecorator:
    return pytest.mark.xfail(unprivileged_ids(role) is None, strict=True,
                             reason="hole: the child keeps uid 0 (no capabilities) where nobody cannot run this "
                                    "Python; owner bits let it read root's 0600 files outside the hidden folders")


@pytest.fixture
def outside() -> Iterator[Path]:
    """A folder below /var/tmp others may enter (0755), holding `secret` (root's, 0600) and the
    problem (readable by others, so that its reference may take a user of its own)."""
    folder = Path(tempfile.mkdtemp(prefix="ks-uid-", dir="/var/tmp"))
    folder.chmod(0o755)
    secret = folder / "secret"
    secret.write_text(SECRET)
    secret.chmod(0o600)
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _problem(folder: Path, reference: str | None = None) -> Problem:
    problem = make_problem(folder / "problem", affine_definition("float32", reference=reference),
                           affine_workloads("float32"))
    for path in (folder / "problem", *(folder / "problem").rglob("*")):
        path.chmod(0o755 if path.is_dir() else 0o644)
    return problem


def _evaluate(problem: Problem, code: str, start: str) -> AttemptResult:
    return evaluate(problem, make_solution(code, problem.name), dataclasses.replace(FAST, fork_server=STARTS[start]))


def _code(template: str, folder: Path) -> str:
    return template.replace("@PATH@", repr(str(folder / "secret")))


@pytest.mark.parametrize("start", list(STARTS))
@_hole("candidate")
def test_a_candidate_cannot_read_a_root_only_file(outside: Path, start: str) -> None:
    result = _evaluate(_problem(outside), _code(CANDIDATE, outside), start)
    assert SECRET not in result.message, result.message
    assert result.status is Status.PASSED, result.message


@pytest.mark.parametrize("start", list(STARTS))
@_hole("reference")
def test_a_reference_cannot_read_a_root_only_file(outside: Path, start: str) -> None:
    result = _evaluate(_problem(outside, _code(REFERENCE, outside)), HONEST, start)
    assert SECRET not in result.message, result.message
    assert result.status is Status.PASSED, result.message


@pytest.mark.parametrize("start", list(STARTS))
def test_control_an_honest_solution_passes_beside_the_same_file(outside: Path, start: str) -> None:
    assert (outside / "secret").stat().st_mode & 0o777 == 0o600
    result = _evaluate(_problem(outside), HONEST, start)
    assert result.status is Status.PASSED, result.message


def test_control_a_reference_left_at_uid_0_reads_it(outside: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The negative control, in either mode: the same reference, kept at the evaluator's uid
    (without capabilities) as where its user cannot be switched, reads the file and the test sees it."""
    from services.evaluator import evaluate as evaluate_module

    monkeypatch.setattr(evaluate_module, "reference_ids", lambda problem_root: None)
    result = _evaluate(_problem(outside, _code(REFERENCE, outside)), HONEST, "fork_server")
    assert result.status is Status.INVALID_REFERENCE and f"LEAKED {SECRET}" in result.message, result.message
