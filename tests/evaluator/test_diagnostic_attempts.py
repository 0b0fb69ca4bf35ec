"""A diagnostic attempt through the evaluator's task logic (`record.evaluate_attempt`) on a real
SQLite DB and store: the evaluator reads the attempt's kind and answers it with text and a status
of its own, never runs an evaluation for it, writes no trace; an evaluation stays an evaluation.
The worker's `diagnose` records such an attempt and returns its answer."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from sqlalchemy import select

from services.evaluator import record
from services.evaluator.record import evaluate_attempt
from services.worker.diagnose import diagnose
from services.worker.write import Job
from shared.db import AttemptRow, TraceRow
from shared.repository import INSPECT, PROFILE, create_attempt, put_solution, upsert_problem
from shared.runtime import Runtime
from shared.schema import load_problem

PROBLEMS = Path(__file__).resolve().parents[2] / "problems"
PROBLEM = load_problem(PROBLEMS / "llama31_8b_rmsnorm")
needs_nvcc = pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not on PATH")


class NoEvaluation:
    """Stands in for `evaluate`: a diagnostic that ran an evaluation fails the test."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, *args, **kwargs):
        self.calls += 1
        raise AssertionError("a diagnostic attempt ran an evaluation")


@pytest.fixture
def no_evaluation(monkeypatch) -> NoEvaluation:
    stand_in = NoEvaluation()
    monkeypatch.setattr(record, "evaluate", stand_in)
    monkeypatch.setattr(record, "spares_for", lambda *args: None)
    return stand_in


def diagnostic(runtime: Runtime, kind: str, language: str = "cuda", tool_args: dict | None = None,
               workloads: list[str] | None = None) -> str:
    with runtime.db.session() as session:
        problem_id = upsert_problem(session, PROBLEM).id
        digest = put_solution(session, runtime.store, problem_id, PROBLEM.seed(language))
        return create_attempt(session, problem_id, digest, "cpu", kind=kind, tool_args=tool_args,
                              workload_uuids=workloads).id


def row(runtime: Runtime, attempt_id: str) -> AttemptRow:
    with runtime.db.session() as session:
        return session.get(AttemptRow, attempt_id)


@needs_nvcc
def test_inspect_is_answered_on_the_cpu_evaluator_with_text_and_no_trace(runtime, no_evaluation):
    attempt_id = diagnostic(runtime, INSPECT, tool_args={"kernel": "rmsnorm_bf16"})
    status = evaluate_attempt(runtime, attempt_id, "cpu", "evaluator@cpu")
    attempt = row(runtime, attempt_id)
    assert status == attempt.status == "INSPECTED", attempt.message
    assert attempt.kind == INSPECT and json.loads(attempt.tool_args) == {"kernel": "rmsnorm_bf16"}
    assert "1 kernel: rmsnorm_bf16" in attempt.message and "kernel rmsnorm_bf16: registers" in attempt.message
    assert "SASS of rmsnorm_bf16:" in attempt.message
    assert attempt.gpu_seconds == 0.0 and attempt.finished_at is not None  # no GPU on this evaluator
    assert attempt.speedup is None and attempt.latency_ms is None and attempt.sol_score is None
    with runtime.db.session() as session:
        assert session.scalars(select(TraceRow).where(TraceRow.attempt_id == attempt_id)).all() == []
    assert no_evaluation.calls == 0
    assert evaluate_attempt(runtime, attempt_id, "cpu", "evaluator@cpu") == "INSPECTED"  # redelivered: as it was


def test_profile_on_the_cpu_evaluator_is_unsupported_and_runs_nothing(runtime, no_evaluation):
    attempt_id = diagnostic(runtime, PROFILE, workloads=[PROBLEM.workloads[0].uuid])
    assert evaluate_attempt(runtime, attempt_id, "cpu", "evaluator@cpu") == "UNSUPPORTED"
    assert "needs a GPU evaluator" in row(runtime, attempt_id).message
    assert no_evaluation.calls == 0


def test_inspect_of_a_pytorch_solution_is_unsupported(runtime, no_evaluation):
    attempt_id = diagnostic(runtime, INSPECT, language="pytorch")
    assert evaluate_attempt(runtime, attempt_id, "cpu", "evaluator@cpu") == "UNSUPPORTED"
    assert "cuda" in row(runtime, attempt_id).message


def test_an_evaluation_is_still_evaluated(runtime, monkeypatch):
    """The kind's default is an evaluation: it goes to `evaluate`, as before."""
    called = []

    def evaluated(problem, solution, config, max_workloads=None, attempt=None, progress=None):
        called.append(problem.name)
        raise RuntimeError("stop here")

    monkeypatch.setattr(record, "evaluate", evaluated)
    monkeypatch.setattr(record, "spares_for", lambda *args: None)
    with runtime.db.session() as session:
        problem_id = upsert_problem(session, PROBLEM).id
        digest = put_solution(session, runtime.store, problem_id, PROBLEM.seed("pytorch"))
        attempt = create_attempt(session, problem_id, digest, "cpu")
        attempt_id, kind = attempt.id, attempt.kind
    assert kind == "evaluate"
    with pytest.raises(RuntimeError, match="stop here"):
        evaluate_attempt(runtime, attempt_id, "cpu", "evaluator@cpu")
    assert called == [PROBLEM.name]


def job_for(runtime: Runtime, device: str = "cpu") -> Job:
    with runtime.db.session() as session:
        problem_id = upsert_problem(session, PROBLEM).id
    return Job(assignment_id=None, campaign_id=None, problem_id=problem_id, problem_name=PROBLEM.name, device=device,
               remaining=5, made_before=0, language="cuda", parent_hash=None, guidance=None, seeds=(),
               workloads=tuple(w.uuid for w in PROBLEM.workloads))


@needs_nvcc
def test_diagnose_records_the_attempt_and_returns_the_evaluators_answer(runtime, no_evaluation):
    sent: list[tuple[str, str]] = []

    def send(attempt_id: str, device: str) -> None:  # the evaluator, answering at once
        sent.append((attempt_id, device))
        evaluate_attempt(runtime, attempt_id, device, "evaluator@cpu")

    text = diagnose(runtime, job_for(runtime), "model-x", PROBLEM.seed("cuda"), "inspect", kernel="nope", tokens=321,
                    send_evaluate=send, wait=lambda attempt_id: row(runtime, attempt_id).status)
    assert text.startswith("status: INSPECTED\n")
    assert "the cubin has no kernel `nope`; its kernels: rmsnorm_bf16" in text
    attempt = row(runtime, sent[0][0])
    assert (attempt.kind, attempt.model, attempt.tokens, attempt.device) == (INSPECT, "model-x", 321, "cpu")
    assert json.loads(attempt.tool_args) == {"kernel": "nope"}


def test_diagnose_profile_names_its_one_workload_and_refuses_an_unknown_one(runtime, no_evaluation):
    sent: list[str] = []

    def send(attempt_id: str, device: str) -> None:
        sent.append(attempt_id)
        evaluate_attempt(runtime, attempt_id, device, "evaluator@cpu")

    wait = lambda attempt_id: row(runtime, attempt_id).status  # noqa: E731
    unknown = diagnose(runtime, job_for(runtime), "m", PROBLEM.seed("cuda"), "profile", workload_uuid="no-such",
                       send_evaluate=send, wait=wait)
    assert unknown.startswith("status: UNSUPPORTED\nthe problem has no workload 'no-such'") and sent == []
    chosen = PROBLEM.workloads[2].uuid
    text = diagnose(runtime, job_for(runtime), "m", PROBLEM.seed("cuda"), "profile", workload_uuid=chosen,
                    send_evaluate=send, wait=wait)
    attempt = row(runtime, sent[0])
    assert attempt.kind == PROFILE and json.loads(attempt.workload_uuids) == [chosen]
    assert text.startswith("status: UNSUPPORTED\n") and "needs a GPU evaluator" in text  # a CPU evaluator here
