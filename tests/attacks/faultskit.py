"""Helpers for tests/attacks/test_faults.py: an attempt in a fresh runtime, a stand-in for the
evaluation, a DB whose commits fail on demand, and an evaluator process that dies under an attempt."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path

from sqlalchemy import event, func, select
from sqlalchemy.exc import OperationalError
from sqlalchemy.orm import Session

from services.evaluator.evaluate import AttemptResult
from shared.db import AttemptRow, TraceRow, utcnow
from shared.repository import create_attempt, put_solution, upsert_problem
from shared.runtime import Runtime
from shared.schema import Correctness, Environment, Evaluation, Performance, Status, Trace, load_problem

REPO = Path(__file__).resolve().parents[2]
PROBLEMS = REPO / "problems"
PROBLEM = "llama31_8b_rmsnorm"


def new_attempt(runtime: Runtime) -> str:
    """A PENDING attempt of the shipped problem's seed solution, without a campaign."""
    problem = load_problem(PROBLEMS / PROBLEM)
    with runtime.db.session() as session:
        problem_id = upsert_problem(session, problem).id
        digest = put_solution(session, runtime.store, problem_id, problem.seed("pytorch"))
        return create_attempt(session, problem_id, digest, "cpu").id


class Evaluations:
    """Stands in for `evaluate`: counts calls and PASSES the first workload; `release` cleared: it
    blocks until set."""

    def __init__(self) -> None:
        self.calls = 0
        self.started, self.release = threading.Event(), threading.Event()
        self.release.set()

    def __call__(self, problem, solution, config, max_workloads=None, attempt=None, progress=None) -> AttemptResult:
        self.calls += 1
        self.started.set()
        self.release.wait(60)
        evaluation = Evaluation(status=Status.PASSED, environment=Environment(hardware="CPU test"),
                                timestamp=utcnow().isoformat(), log="",
                                correctness=Correctness(max_absolute_error=0.0, max_relative_error=0.0),
                                performance=Performance(latency_ms=1.0, reference_latency_ms=1.0, speedup_factor=1.0))
        trace = Trace(definition=problem.name, workload=problem.workloads[0], solution=solution.name,
                      evaluation=evaluation)
        return AttemptResult(Status.PASSED, [trace], 1.0, 1.0, 1, "")


class FailingCommits:
    """While installed, the next `times` commits for which `when(session)` holds fail as SQLite's
    "disk I/O error" does (the session is rolled back, as after a real failed commit)."""

    def __init__(self, times: int, when: Callable[[Session], bool] = lambda session: True) -> None:
        self.left, self.when, self.failed = times, when, 0

    def __call__(self, session: Session) -> None:
        if self.left > 0 and self.when(session):
            self.left -= 1
            self.failed += 1
            raise OperationalError("COMMIT", None, sqlite3.OperationalError("disk I/O error"))

    def __enter__(self) -> FailingCommits:
        event.listen(Session, "before_commit", self)
        return self

    def __exit__(self, *exc) -> None:
        event.remove(Session, "before_commit", self)


def writes_a_verdict(session: Session) -> bool:
    return any(isinstance(row, TraceRow) for row in session.new)


def row(runtime: Runtime, attempt_id: str) -> AttemptRow:
    with runtime.db.session() as session:
        return session.get(AttemptRow, attempt_id)


def traces(runtime: Runtime, attempt_id: str) -> int:
    with runtime.db.session() as session:
        return session.scalar(select(func.count()).select_from(TraceRow).where(TraceRow.attempt_id == attempt_id))


# An evaluator process (`evaluate_attempt` as the task calls it) whose evaluation kills the process
# itself: what a candidate that SIGKILLs its evaluator, an out-of-memory kill or a driver crash does.
DYING_EVALUATOR = r"""
import os, signal, sys
from pathlib import Path
from services.evaluator import record
from shared.runtime import Runtime
from shared.settings import Settings

home, attempt_id, name = Path(sys.argv[1]), sys.argv[2], sys.argv[3]
record.evaluate = lambda *args, **kwargs: os.kill(os.getpid(), signal.SIGKILL)
record.spares_for = lambda *args: None
runtime = Runtime(Settings(home=home, problems_dir=Path(sys.argv[4])))
print("RETURNED", record.evaluate_attempt(runtime, attempt_id, "cpu", name, 600.0), flush=True)
"""


def run_dying_evaluator(home: Path, attempt_id: str, name: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", DYING_EVALUATOR, str(home), attempt_id, name, str(PROBLEMS)],
                          capture_output=True, text=True, timeout=300, cwd=REPO)


# An evaluator process under a file size limit of its machine (`prlimit --fsize`), evaluating for
# real (a tiny affine problem, the fast CPU config) an attempt whose solution writes a scratch file
# of `size` bytes, as honest code does (a compiler's cache, a temp file); `promise` replaces the
# bound a candidate is promised (sandbox/confine.py LIMITS), so that a candidate can pass it cheaply.
LIMITED_EVALUATOR = r"""
import dataclasses, resource, sys
from pathlib import Path
sys.path.insert(0, sys.argv[1] + "/tests/evaluator")
from evalkit import FAST, TOLERANCE, affine_definition, make_problem, make_solution
from services.evaluator import record
from services.evaluator.sandbox import confine
from shared.errors import EvaluatorFault
from shared.repository import create_attempt, put_solution, upsert_problem
from shared.runtime import Runtime
from shared.settings import Settings

home, limit, size, promise = Path(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
spec = {"x": {"type": "random"}, "w": {"type": "random"}, "b": {"type": "random"}}
workloads = [{"uuid": "small", "axes": {"n": 64}, "inputs": spec, "tolerance": TOLERANCE["float32"]}]
problem = make_problem(home / "problem", affine_definition(), workloads)
code = ("import tempfile\ndef run(x, w, b, y):\n    with tempfile.TemporaryFile() as scratch:\n"
        f"        scratch.write(bytes({size}))\n    y.copy_(x * w + b)\n")
runtime = Runtime(Settings(home=home, problems_dir=home / "problem"))
with runtime.db.session() as session:
    problem_id = upsert_problem(session, problem).id
    digest = put_solution(session, runtime.store, problem_id, make_solution(code))
    attempt_id = create_attempt(session, problem_id, digest, "cpu").id
record._config = lambda runtime, device, hardware: dataclasses.replace(FAST, scratch_dir=home / "scratch")
if promise:
    confine.LIMITS[resource.RLIMIT_FSIZE] = promise
if limit:
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
try:
    status = record.evaluate_attempt(runtime, attempt_id, "cpu", "evaluator@limited", 600.0)
    with runtime.db.session() as session:
        from shared.db import AttemptRow
        message = session.get(AttemptRow, attempt_id).message or ""
    print("VERDICT", status, message[-300:].replace("\n", " "))
except EvaluatorFault as fault:
    with runtime.db.session() as session:
        from shared.db import AttemptRow
        left = session.get(AttemptRow, attempt_id).status
    print("FAULT", left, str(fault)[:300])
"""


def run_limited_evaluator(home: Path, limit: int, size: int, promise: int = 0) -> str:
    done = subprocess.run([sys.executable, "-c", LIMITED_EVALUATOR, str(REPO), str(home), str(limit), str(size),
                           str(promise)], capture_output=True, text=True, timeout=300, cwd=REPO)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout.strip().splitlines()[-1]
