"""Who evaluates an attempt: one claim per attempt, an evaluator that died and came back sends its
attempts again, a holder that is gone is taken over, and an attempt that keeps killing its
evaluator is given up. The evaluation itself is replaced by a stand-in; the DB logic is real."""

from __future__ import annotations

import threading
from datetime import timedelta
from pathlib import Path

import pytest
from sqlalchemy import func, select

from services.evaluator import record
from services.evaluator.evaluate import AttemptResult
from services.evaluator.record import MAX_TRIES, evaluate_attempt, give_up, recover
from shared.db import AttemptRow, TraceRow, utcnow
from shared.errors import StoreError
from shared.repository import create_attempt, put_solution, upsert_problem
from shared.runtime import Runtime
from shared.schema import Correctness, Environment, Evaluation, Performance, Status, Trace, load_problem

PROBLEMS = Path(__file__).resolve().parents[2] / "problems"
PROBLEM = "llama31_8b_rmsnorm"


@pytest.fixture
def attempt_id(runtime: Runtime) -> str:
    problem = load_problem(PROBLEMS / PROBLEM)
    with runtime.db.session() as session:
        problem_id = upsert_problem(session, problem).id
        digest = put_solution(session, runtime.store, problem_id, problem.seed("pytorch"))
        return create_attempt(session, problem_id, digest, "cpu").id


class Evaluations:
    """Stands in for `evaluate`: counts calls, PASSED on the problem's first workload; may block."""

    def __init__(self) -> None:
        self.calls = 0
        self.started, self.release = threading.Event(), threading.Event()
        self.release.set()

    def __call__(self, problem, solution, config, max_workloads=None, attempt=None, progress=None) -> AttemptResult:
        self.calls += 1
        self.started.set()
        self.release.wait(30)
        evaluation = Evaluation(status=Status.PASSED, environment=Environment(hardware="CPU test"),
                                timestamp=utcnow().isoformat(), log="",
                                correctness=Correctness(max_absolute_error=0.0, max_relative_error=0.0),
                                performance=Performance(latency_ms=1.0, reference_latency_ms=1.0, speedup_factor=1.0))
        trace = Trace(definition=problem.name, workload=problem.workloads[0], solution=solution.name,
                      evaluation=evaluation)
        return AttemptResult(Status.PASSED, [trace], 1.0, 1.0, 1, "")


@pytest.fixture
def evaluations(monkeypatch) -> Evaluations:
    stand_in = Evaluations()
    monkeypatch.setattr(record, "evaluate", stand_in)
    monkeypatch.setattr(record, "spares_for", lambda *args: None)
    return stand_in


def row(runtime: Runtime, attempt_id: str) -> AttemptRow:
    with runtime.db.session() as session:
        return session.get(AttemptRow, attempt_id)


def traces(runtime: Runtime, attempt_id: str) -> int:
    with runtime.db.session() as session:
        return session.scalar(select(func.count()).select_from(TraceRow).where(TraceRow.attempt_id == attempt_id))


def test_an_attempt_is_evaluated_once_however_often_it_is_delivered(runtime, attempt_id, evaluations):
    assert evaluate_attempt(runtime, attempt_id, "cpu", "evaluator@a") == "PASSED"
    assert evaluate_attempt(runtime, attempt_id, "cpu", "evaluator@b") == "PASSED"
    assert evaluations.calls == 1 and traces(runtime, attempt_id) == 1
    attempt = row(runtime, attempt_id)
    assert (attempt.evaluator, attempt.tries) == ("evaluator@a", 1)


def test_a_second_evaluator_leaves_a_running_attempt_to_its_holder(runtime, attempt_id, evaluations):
    evaluations.release.clear()
    first = threading.Thread(target=evaluate_attempt, args=(runtime, attempt_id, "cpu", "evaluator@a", 600.0))
    first.start()
    assert evaluations.started.wait(30)
    assert evaluate_attempt(runtime, attempt_id, "cpu", "evaluator@b", 600.0) == "RUNNING"
    evaluations.release.set()
    first.join()
    assert evaluations.calls == 1 and traces(runtime, attempt_id) == 1
    assert row(runtime, attempt_id).status == "PASSED"


def test_a_holder_gone_for_longer_than_the_stale_limit_is_taken_over(runtime, attempt_id, evaluations):
    with runtime.db.session() as session:
        attempt = session.get(AttemptRow, attempt_id)
        attempt.status, attempt.evaluator, attempt.tries = "RUNNING", "evaluator@gone", 1
        attempt.started_at = utcnow() - timedelta(seconds=700)
    assert evaluate_attempt(runtime, attempt_id, "cpu", "evaluator@b", 600.0) == "PASSED"
    assert row(runtime, attempt_id).tries == 2 and traces(runtime, attempt_id) == 1


def test_a_verdict_is_dropped_when_another_evaluator_took_the_attempt_meanwhile(runtime, attempt_id, evaluations):
    evaluations.release.clear()
    first = threading.Thread(target=evaluate_attempt, args=(runtime, attempt_id, "cpu", "evaluator@a", 600.0))
    first.start()
    assert evaluations.started.wait(30)
    with runtime.db.session() as session:  # as if evaluator@a had been given up and @b holds it now
        session.get(AttemptRow, attempt_id).evaluator = "evaluator@b"
    evaluations.release.set()
    first.join()
    assert row(runtime, attempt_id).status == "RUNNING" and traces(runtime, attempt_id) == 0


def test_an_evaluator_back_from_the_dead_sends_its_attempts_again(runtime, attempt_id, evaluations):
    with runtime.db.session() as session:
        attempt = session.get(AttemptRow, attempt_id)
        attempt.status, attempt.evaluator, attempt.tries, attempt.started_at = "RUNNING", "evaluator@a", 1, utcnow()
    sent: list[tuple[str, str]] = []
    assert recover(runtime, "evaluator@other", lambda *a: sent.append(a)) == [] and not sent
    assert recover(runtime, "evaluator@a", lambda *a: sent.append(a)) == [attempt_id]
    assert sent == [(attempt_id, "cpu")] and row(runtime, attempt_id).status == "PENDING"
    assert evaluate_attempt(runtime, attempt_id, "cpu", "evaluator@b", 600.0) == "PASSED"  # any evaluator
    assert row(runtime, attempt_id).tries == 2 and traces(runtime, attempt_id) == 1


def test_an_attempt_that_keeps_killing_its_evaluator_is_given_up(runtime, attempt_id, evaluations):
    with runtime.db.session() as session:
        attempt = session.get(AttemptRow, attempt_id)
        attempt.status, attempt.evaluator, attempt.tries, attempt.started_at = "RUNNING", "evaluator@a", MAX_TRIES, utcnow()
    assert evaluate_attempt(runtime, attempt_id, "cpu", "evaluator@a") == "RUNTIME_ERROR"
    attempt = row(runtime, attempt_id)
    assert f"died {MAX_TRIES} times" in attempt.message and evaluations.calls == 0


def test_a_verdict_after_the_planner_gave_the_attempt_up_still_counts(runtime, attempt_id, evaluations):
    evaluations.release.clear()
    first = threading.Thread(target=evaluate_attempt, args=(runtime, attempt_id, "cpu", "evaluator@a", 600.0))
    first.start()
    assert evaluations.started.wait(30)
    with runtime.db.session() as session:  # the planner's deadline passed (services/planner/sweep.py)
        session.get(AttemptRow, attempt_id).status = "TIMEOUT"
    evaluations.release.set()
    first.join()
    assert row(runtime, attempt_id).status == "PASSED" and traces(runtime, attempt_id) == 1


def test_an_unreachable_store_gives_the_claim_back_then_a_clear_verdict(runtime, attempt_id, evaluations,
                                                                         monkeypatch):
    def unreachable(store, digest):
        raise StoreError("object store at localhost:1 unreachable: connection refused")

    monkeypatch.setattr(record, "get_solution", unreachable)
    with pytest.raises(StoreError):
        evaluate_attempt(runtime, attempt_id, "cpu", "evaluator@a")
    attempt = row(runtime, attempt_id)
    assert (attempt.status, attempt.evaluator, attempt.tries) == ("PENDING", None, 0)  # any evaluator may retry
    give_up(runtime, attempt_id, StoreError("object store at localhost:1 unreachable"), 6)
    attempt = row(runtime, attempt_id)
    assert attempt.status == "NOT_EVALUATED" and attempt.message.startswith("not evaluated: object store")
    assert "gave up after 6 tries" in attempt.message and evaluations.calls == 0


def test_the_evaluate_task_records_each_fault_for_status_and_gives_up_as_not_evaluated(tmp_path, monkeypatch):
    """The Celery task itself, run eagerly: an `EvaluatorFault` on every try is retried up to the
    task's limit, each try's fault is kept in Redis for /status, and the attempt ends NOT_EVALUATED
    (no verdict), not RUNTIME_ERROR."""
    import redis
    from celery import Celery

    from kernelswarm.launcher import RedisServer
    from services.evaluator import tasks
    from shared.celery_app import EVALUATE
    from shared.errors import EvaluatorFault
    from shared.health import evaluator_faults
    from shared.settings import Settings

    server = RedisServer(tmp_path / "redis")  # started by its constructor
    try:
        runtime = Runtime(Settings(home=tmp_path / "home", problems_dir=PROBLEMS, redis_url=server.url))
        with runtime.db.session() as session:  # the attempt, in this runtime's DB
            problem = load_problem(PROBLEMS / PROBLEM)
            problem_id = upsert_problem(session, problem).id
            digest = put_solution(session, runtime.store, problem_id, problem.seed("pytorch"))
            attempt_id = create_attempt(session, problem_id, digest, "cpu").id
        tries = []

        def faulty(runtime, attempt_id, device, evaluator, stale_after_s):
            tries.append(evaluator)
            raise EvaluatorFault("saving input set 0 failed: [Errno 28] No space left on device")

        monkeypatch.setattr(tasks, "evaluate_attempt", faulty)
        app = Celery("faults-test")
        app.conf.task_always_eager = True
        tasks.register(app, runtime)
        app.tasks[EVALUATE].apply(args=(attempt_id,), throw=False)
        with runtime.db.session() as session:
            attempt = session.get(AttemptRow, attempt_id)
            assert attempt.status == "NOT_EVALUATED" and "No space left" in attempt.message, attempt.message
        assert len(tries) == 6  # the first try and five retries
        [health] = evaluator_faults(redis.Redis.from_url(server.url))
        assert health["unhealthy"] and health["last_hour"] == 6 and health["last_attempt"] == attempt_id
        runtime.db.dispose()
    finally:
        server.stop()
