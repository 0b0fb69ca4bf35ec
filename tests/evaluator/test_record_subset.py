"""An attempt that names some of the problem's workloads (a rung of the tuner's halving): the
evaluator runs those only, writes their traces only, and a pass is PARTIAL, not PASSED. The
evaluation itself is replaced by a stand-in that passes whatever it is given; the DB logic is real."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from sqlalchemy import select

from services.evaluator import record
from services.evaluator.evaluate import AttemptResult
from services.evaluator.record import evaluate_attempt
from shared.db import AttemptRow, TraceRow, utcnow
from shared.repository import create_attempt, put_solution, upsert_problem
from shared.runtime import Runtime
from shared.schema import Correctness, Environment, Evaluation, Performance, Status, Trace, load_problem

PROBLEMS = Path(__file__).resolve().parents[2] / "problems"
PROBLEM = load_problem(PROBLEMS / "llama31_8b_rmsnorm")


class PassEverything:
    """Stands in for `evaluate`: PASSED on every workload of the problem it is given."""

    def __init__(self) -> None:
        self.given: list[tuple[str, ...]] = []

    def __call__(self, problem, solution, config, max_workloads=None, attempt=None, progress=None) -> AttemptResult:
        self.given.append(tuple(w.uuid for w in problem.workloads))
        traces = [Trace(definition=problem.name, workload=w, solution=solution.name, evaluation=Evaluation(
            status=Status.PASSED, environment=Environment(hardware="CPU test"), timestamp=utcnow().isoformat(),
            log="", correctness=Correctness(max_absolute_error=0.0, max_relative_error=0.0), performance=Performance(latency_ms=1.0, reference_latency_ms=2.0, speedup_factor=2.0)))
            for w in problem.workloads]
        return AttemptResult(Status.PASSED, traces, 1.0, 2.0, len(traces), "")


@pytest.fixture
def evaluations(monkeypatch) -> PassEverything:
    stand_in = PassEverything()
    monkeypatch.setattr(record, "evaluate", stand_in)
    monkeypatch.setattr(record, "spares_for", lambda *args: None)
    return stand_in


def attempt_on(runtime: Runtime, workload_uuids) -> str:
    with runtime.db.session() as session:
        problem_id = upsert_problem(session, PROBLEM).id
        digest = put_solution(session, runtime.store, problem_id, PROBLEM.seed("pytorch"))
        return create_attempt(session, problem_id, digest, "cpu", workload_uuids=workload_uuids).id


@pytest.mark.parametrize(("chosen", "status"), [([3, 0], "PARTIAL"), (None, "PASSED"), ([0, 1, 2, 3, 4, 5], "PASSED")])
def test_only_the_named_workloads_run_and_a_subset_that_passes_is_partial(runtime, evaluations, chosen, status):
    uuids = [w.uuid for w in PROBLEM.workloads]
    named = [uuids[i] for i in chosen] if chosen is not None else None
    attempt_id = attempt_on(runtime, named)

    assert evaluate_attempt(runtime, attempt_id, "cpu", "evaluator@a") == status
    expected = tuple(sorted(named, key=uuids.index)) if named is not None else tuple(uuids)
    assert evaluations.given == [expected]  # in the problem's order
    with runtime.db.session() as session:
        attempt = session.get(AttemptRow, attempt_id)
        assert attempt.status == status and attempt.workloads_total == attempt.workloads_passed == len(expected)
        assert (json.loads(attempt.workload_uuids) if attempt.workload_uuids else None) == named
        ran = session.scalars(select(TraceRow.workload_uuid).where(TraceRow.attempt_id == attempt_id)).all()
    assert sorted(ran) == sorted(expected)
