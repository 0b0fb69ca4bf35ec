"""The writer with successive halving, against a real SQLite DB and the hand-written evaluator of
test_write: what it runs where, that a partial attempt is never anyone's best, that a writer that
died is resumed from the records, and that the per-shape solution comes from full-set results."""

from __future__ import annotations

import json
import threading
import time

from services.planner.best import update_best
from services.worker import write
from services.worker.halving import rung_workloads
from services.worker.tuner import DISPATCH_FILE, shape_key, with_tunables
from services.worker.write import run_assignment
from shared.db import AttemptRow, CampaignProblemRow
from shared.leaderboard import leaderboard
from shared.repository import create_attempt, put_solution
from shared.schema import load_problem
from tests.worker.test_write import (  # noqa: F401  (runtime and problem_id are fixtures)
    OPTIMUM, PROBLEMS, RMSNORM, FakeEvaluator, add_assignment, add_campaign, attempts, chosen, problem_id, rmsnorm_fails,
    rmsnorm_speedup, runtime,
)

PROBLEM = load_problem(PROBLEMS / RMSNORM)
UUIDS = tuple(w.uuid for w in PROBLEM.workloads)  # six workloads; the seed has six combinations
RUNG0 = rung_workloads(UUIDS, 2)  # 6 candidates on 2 workloads, then the best 2 on all 6


def combo(values) -> tuple:
    return (values["CHUNK_ROWS"], values["FP32_WEIGHT"]) if values else ()


def ran(attempt: AttemptRow) -> tuple[str, ...] | None:
    return tuple(json.loads(attempt.workload_uuids)) if attempt.workload_uuids else None


def test_rung_zero_on_two_workloads_then_the_best_two_on_all_then_exhausted(runtime, problem_id):
    assignment_id = add_assignment(runtime, add_campaign(runtime), problem_id, budget=20)
    assert run_assignment(runtime, assignment_id, FakeEvaluator(runtime)) == 8

    made = attempts(runtime)
    steps = [(combo(chosen(runtime, a)), ran(a), a.status) for a in made]
    assert steps[0] == ((0, False), None, "PASSED")  # the seed as written, on everything
    assert {s[0] for s in steps[1:6]} == {(16, False), (128, False), (0, True), (16, True), (128, True)}
    assert {s[1] for s in steps[1:6]} == {RUNG0} and RUNG0 == (UUIDS[0], UUIDS[3])
    assert {s[2] for s in steps[1:6]} == {"PARTIAL", "INCORRECT_NUMERICAL"}  # (16, True) fails
    assert steps[6:] == [((128, True), None, "PASSED"), ((128, False), None, "PASSED")]  # best first
    assert sum(a.workloads_total for a in made) == 6 + 5 * 2 + 2 * 6  # 28 workload runs, not 36
    best = write._best(runtime, made, write.Job(0, 0, problem_id, RMSNORM, "cpu", 1, 0, None, None, None, ()))
    assert best[0].spec.tunable_values == OPTIMUM


def test_a_partial_attempt_is_never_the_best_however_fast(runtime, problem_id):
    campaign_id = add_campaign(runtime)
    with runtime.db.session() as session:
        session.add(CampaignProblemRow(campaign_id=campaign_id, problem_id=problem_id, position=0))
    evaluator = FakeEvaluator(runtime)

    def flattering(attempt_id: str, device: str) -> None:  # partial figures far above any full one
        evaluator(attempt_id, device)
        with runtime.db.session() as session:
            attempt = session.get(AttemptRow, attempt_id)
            if attempt.status == "PARTIAL":
                attempt.speedup, attempt.sol_score, attempt.latency_ms = 100.0, 0.99, 0.01

    run_assignment(runtime, add_assignment(runtime, campaign_id, problem_id, budget=20), flattering)
    made = attempts(runtime)
    assert [a.status for a in made].count("PARTIAL") == 4
    with runtime.db.session() as session:
        best_id = update_best(session, campaign_id, problem_id)
        (entry,) = leaderboard(session, campaign_id).problems
    by_id = {a.id: a for a in made}
    assert by_id[best_id].status == "PASSED" and chosen(runtime, by_id[best_id]) == OPTIMUM
    assert entry.best_attempt_id == best_id and entry.speedup == 2.5 and entry.status == "PASSED"
    assert entry.passed_attempts == 3  # the seed and the two finalists
    job = write.Job(0, campaign_id, problem_id, RMSNORM, "cpu", 1, 0, None, None, None, ())
    assert write._best(runtime, made, job)[1] == by_id[best_id].solution_hash


def test_a_writer_that_died_mid_rung_is_resumed_from_the_records(runtime, problem_id):
    campaign_id = add_campaign(runtime)
    evaluator = FakeEvaluator(runtime)
    assignment_id = add_assignment(runtime, campaign_id, problem_id, budget=20)

    def die_in_fourth(attempt_id: str, device: str) -> None:  # evaluated, then the writer dies
        evaluator(attempt_id, device)
        if len(evaluator.calls) == 4:
            raise KeyboardInterrupt

    try:
        run_assignment(runtime, assignment_id, die_in_fourth, lease_s=0.2)
    except KeyboardInterrupt:
        pass
    assert len(attempts(runtime)) == 4
    time.sleep(0.25)  # the lease runs out; the task is redelivered
    assert run_assignment(runtime, assignment_id, evaluator, lease_s=0.2) == 4

    resumed = [(combo(chosen(runtime, a)), ran(a)) for a in attempts(runtime)]
    assert len(set(resumed)) == len(resumed) == 8  # nothing run twice on the same workloads
    assert resumed[6:] == [((128, True), None), ((128, False), None)]


def test_a_rung_waits_for_an_attempt_in_flight_then_goes_on(runtime, problem_id):
    """A dead writer's last attempt, sent to an evaluator that answers later: not proposed again,
    and the next rung waits for its verdict without spending budget."""
    seed = PROBLEM.seed("pytorch")
    with runtime.db.session() as session:
        digest = put_solution(session, runtime.store, problem_id, with_tunables(seed, OPTIMUM))
        left = create_attempt(session, problem_id, digest, "cpu", workload_uuids=RUNG0).id
    evaluator = FakeEvaluator(runtime)
    answer_later = threading.Timer(1.0, evaluator, args=(left, "cpu"))
    answer_later.start()
    try:
        assignment_id = add_assignment(runtime, add_campaign(runtime), problem_id, budget=7)
        assert run_assignment(runtime, assignment_id, evaluator) == 7
    finally:
        answer_later.join()
    made = attempts(runtime)
    assert len(made) == 8 and [a.id for a in made].count(left) == 1
    assert [(combo(chosen(runtime, a)), ran(a)) for a in made[-2:]] == [((128, True), None), ((128, False), None)]
    assert all(a.finished_at is not None for a in made)


def test_the_per_shape_solution_is_built_from_full_set_results_only(runtime, problem_id):
    """(128, False) wins the first three workloads, (128, True) the others; (0, True) is 30x faster
    than both on the first, but only in a partial attempt, and is not a finalist."""

    def latency_ms(values, index: int) -> float:
        if not values:
            return 0.2  # the per-shape solution
        return {(128, True): 0.6 if index < 3 else 0.4, (128, False): 0.3 if index < 3 else 0.5,
                (0, True): 0.01 if index == 0 else 100.0}.get(combo(values), 1.0)

    evaluator = FakeEvaluator(runtime, speedup=lambda v: rmsnorm_speedup(v) if v else 3.0,
                              fails=lambda v: bool(v) and rmsnorm_fails(v), latency_ms=latency_ms)
    assignment_id = add_assignment(runtime, add_campaign(runtime), problem_id, budget=20)
    assert run_assignment(runtime, assignment_id, evaluator) == 9

    made = attempts(runtime)
    assert [combo(chosen(runtime, a)) for a in made[6:8]] == [(128, False), (128, True)]  # the finalists
    dispatching = write.get_solution(runtime.store, made[8].solution_hash)
    assert ran(made[8]) is None and made[8].status == "PASSED"
    source = next(s.content for s in dispatching.sources if s.path == DISPATCH_FILE)
    tables: dict = {}
    exec(source.split("\n\ndef _load")[0], tables)
    dps = PROBLEM.seed("pytorch").spec.destination_passing_style
    winner = {w.uuid: combo(tables["VARIANTS"][tables["BY_SHAPES"][shape_key(PROBLEM.definition, w, dps)]])
              for w in PROBLEM.workloads}
    assert [winner[u] for u in UUIDS] == [(128, False)] * 3 + [(128, True)] * 3
    assert (0, True) not in {combo(v) for v in tables["VARIANTS"]}
